"""GPU measurements for the flash-attn 2 features (issue 6). Prints a short table last.

1. varlen vs padded dense: a batch of sequences of uneven lengths (seed 002's [128, 512, 64]
   pattern, repeated) packed with cu_seqlens, against the same batch padded to the longest one.
2. sliding window: N = 16k, window w in {256, 512, 1024, 4096} against full attention (time should
   scale with w).
3. each feature on vs off at one shape (window, softcap, ALiBi, dropout), forward and backward.

TFLOP/s use the *useful* FLOPs (4·Sq·Sk·D per visible pair); times are do_bench medians.
Usage: PYTHONPATH=. python3 scripts/gpu_features.py
"""

import torch
from triton.testing import do_bench

import tileflash


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def fwd_bwd(fn, *leaves):
    out = fn(*leaves)
    do = torch.randn_like(out)
    return (lambda: fn(*leaves)), (lambda: torch.autograd.grad(fn(*leaves), leaves, do))


def main():
    dev, dt, h, d = "cuda", torch.bfloat16, 16, 128
    rows = []
    # 1. varlen vs padded
    lens = [128, 512, 64] * 32
    tot, mx = sum(lens), max(lens)
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    q, k, v = (torch.randn(tot, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    qp, kp, vp = (torch.randn(len(lens), mx, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    f_v, b_v = fwd_bwd(lambda a, b, c: tileflash.flash_attn_varlen_func(a, b, c, cu, cu, mx, mx, causal=True), q, k, v)
    f_p, b_p = fwd_bwd(lambda a, b, c: tileflash.flash_attn_func(a, b, c, causal=True), qp, kp, vp)
    rows += [("varlen [128,512,64]x32 causal", "fwd", bench(f_v), bench(f_p)),
             ("varlen [128,512,64]x32 causal", "fwd+bwd", bench(b_v), bench(b_p))]
    # 2. sliding window at 16k
    n = 16384
    q, k, v = (torch.randn(1, n, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    f_full, b_full = fwd_bwd(lambda a, b, c: tileflash.flash_attn_func(a, b, c, causal=True), q, k, v)
    t_full, tb_full = bench(f_full), bench(b_full)
    for w in (256, 512, 1024, 4096):
        f_w, b_w = fwd_bwd(lambda a, b, c, w=w: tileflash.flash_attn_func(a, b, c, causal=True, window_size=(w, 0)),
                           q, k, v)
        rows += [(f"window ({w}, 0) N=16k", "fwd", bench(f_w), t_full),
                 (f"window ({w}, 0) N=16k", "fwd+bwd", bench(b_w), tb_full)]
    # 3. features on vs off
    n = 4096
    q, k, v = (torch.randn(4, n, h, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    slopes = torch.rand(h, device=dev)
    base_f, base_b = fwd_bwd(lambda a, b, c: tileflash.flash_attn_func(a, b, c), q, k, v)
    tf, tb = bench(base_f), bench(base_b)
    for name, kw in [("softcap 30", dict(softcap=30.0)), ("alibi", dict(alibi_slopes=slopes)),
                     ("dropout 0.1", dict(dropout_p=0.1)), ("window (2048, 2048)", dict(window_size=(2048, 2048)))]:
        f, b = fwd_bwd(lambda a, b_, c, kw=kw: tileflash.flash_attn_func(a, b_, c, **kw), q, k, v)
        rows += [(f"{name} N=4k", "fwd", bench(f), tf), (f"{name} N=4k", "fwd+bwd", bench(b), tb)]
    print(f"\n{torch.cuda.get_device_name()} | torch {torch.__version__} | bf16, nheads={h}, headdim={d}")
    print("| case | pass | ms | baseline ms | ratio |\n|---|---|---|---|---|")
    for name, mode, t, base in rows:
        print(f"| {name} | {mode} | {t:.3f} | {base:.3f} | {t / base:.2f} |")
    print("baselines: padded dense (varlen rows), full causal (window rows), features off (feature rows)")


if __name__ == "__main__":
    main()
