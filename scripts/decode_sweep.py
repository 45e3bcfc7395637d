"""Sweep the split-KV decode kernel's launch config on the GPU; print the best per shape last.

Shapes: the issue's decode targets (bf16, Hq=32, Hkv=8, D=128): B=16 at L=8k and 64k, B=1 at 8k
and 128k. Several caches are rotated so that their total exceeds twice the 60 MB L2. Times:
`decode_forward` alone (the kernels), and the public `flash_attn_with_kvcache` with the lengths as
a tensor (host work included), beside SDPA flash / cuDNN in the same run.
Usage: PYTHONPATH=. python3 scripts/decode_sweep.py
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash
from tileflash.ops import decode as dec


def graphed(fn, sets):
    """One CUDA graph per cache set: replays cost no Python, so this times the kernels as a
    serving loop that captures its decode step would run them."""
    graphs = []
    for i in range(sets):
        fn(i)  # compile / warm up outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn(i)
        graphs.append(g)
    it = [0]

    def run():
        graphs[it[0] % sets].replay()
        it[0] += 1
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--defaults-only", action="store_true", help="time only the default config (no sweep)")
    args = ap.parse_args()
    dev, dt, h, hk, d = "cuda", torch.bfloat16, 32, 8, 128
    configs = [dict(block_n=bn, num_warps=w, num_stages=s) for bn, w, s in itertools.product((64, 128), (4, 8), (2, 3, 4))]
    waves_list = (2, 4, 8)
    if args.defaults_only:
        configs, waves_list = [dec.decode_config(d)], (dec.WAVES,)
    lines = []
    for b, n in ((16, 8192), (16, 65536), (1, 8192), (1, 131072)):
        kv_bytes = 2 * b * n * hk * d * 2
        sets = int(min(16, max(1, -(-240e6 // kv_bytes))))
        g = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(b, 1, h, d, device=dev, generator=g).to(dt)
        caches = [(torch.randn(b, n, hk, d, device=dev, generator=g).to(dt),
                   torch.randn(b, n, hk, d, device=dev, generator=g).to(dt)) for _ in range(sets)]
        seqlens = torch.full((b,), n, dtype=torch.int32, device=dev)
        ref = F.scaled_dot_product_attention(q.transpose(1, 2), caches[0][0].transpose(1, 2),
                                             caches[0][1].transpose(1, 2), enable_gqa=True).transpose(1, 2)
        it = [0]

        def rot(fn):
            def run():
                k, v = caches[it[0] % sets]
                it[0] += 1
                return fn(k, v)
            return run

        def tbs(ms):
            return kv_bytes / ms * 1e-9

        best = None
        for waves in waves_list:
            ns = dec.choose_num_splits(b, hk, n, q.device, waves=waves)
            for cfg in configs:
                try:
                    out, _ = dec.decode_forward(q, *caches[0], seqlens, d ** -0.5, False, num_splits=ns,
                                                max_seqlen_k=n, config=cfg)
                    err = (out.float() - ref.float()).abs().max().item()
                    assert err < 2e-2, err
                    ms = do_bench(rot(lambda k, v: dec.decode_forward(q, k, v, seqlens, d ** -0.5, False,
                                                                       num_splits=ns, max_seqlen_k=n, config=cfg)),
                                  warmup=10, rep=40, return_mode="median")
                except Exception as e:  # noqa: BLE001
                    print(f"B={b} L={n} waves={waves} {cfg}: failed {type(e).__name__}: {str(e)[:120]}")
                    continue
                print(f"B={b} L={n} waves={waves} splits={ns} {cfg}: {ms * 1e3:.1f} us {tbs(ms):.2f} TB/s", flush=True)
                if best is None or ms < best[0]:
                    best = (ms, waves, ns, cfg)
        pub = do_bench(rot(lambda k, v: tileflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens)),
                       warmup=10, rep=60, return_mode="median")
        pub_graph = do_bench(graphed(lambda i: tileflash.flash_attn_with_kvcache(q, *caches[i], cache_seqlens=seqlens),
                                     sets), warmup=10, rep=60, return_mode="median")
        sd = {}
        for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            with sdpa_kernel(be):
                sd[name] = do_bench(rot(lambda k, v: F.scaled_dot_product_attention(
                    q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)),
                    warmup=10, rep=60, return_mode="median")
        lines.append(f"| {b} | {n} | {best[1]} ({best[2]} splits) {best[3]} | {tbs(best[0]):.2f} | {tbs(pub):.2f} | "
                     f"{tbs(pub_graph):.2f} | {tbs(sd['flash']):.2f} | {tbs(sd['cudnn']):.2f} |")
        del caches
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; KV TB/s (K+V bytes read once / median time)")
    print("| B | L | best waves, config | kernels TB/s | public call TB/s | public call in a CUDA graph | SDPA flash "
          "| SDPA cuDNN |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
