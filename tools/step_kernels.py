"""Where a training step's time goes, kernel by kernel: forward + backward through the public
``flash_attn_func`` (autograd), the default (``deterministic=False``) against
``deterministic=True``, with SDPA's cuDNN backend beside them. For each arm: the wall µs per step
(CUDA events over back-to-back steps), and torch.profiler's CUDA µs per step of each kernel.

Question it answers (2026-12-06): ``tileflash bench --host``'s ``fwd+bwd@2k`` case (B=1 N=2048
H=16/8 D=128 causal bf16) read 509 µs per step for the default and 341 µs for
``deterministic=True`` on an H100, while the two backward kernels alone differ by ~8%
(tools/fused_ab.py): is the rest kernel time (which kernel) or host time?

    python tools/step_kernels.py [--seqlens 2048 4096] [--batch 1] [--heads 16] [--kv-heads 8]
"""

from __future__ import annotations

import argparse

import torch

import tileflash
from tileflash.bench.providers import PROVIDERS

from bwd_kernels import profile  # tools/ is on sys.path when run as a script


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    dt, causal, b, h, hk, d = getattr(torch, a.dtype), bool(a.causal), a.batch, a.heads, a.kv_heads, a.dim
    arms = {
        "default": lambda q, k, v: tileflash.flash_attn_func(q, k, v, causal=causal),
        "deterministic": lambda q, k, v: tileflash.flash_attn_func(q, k, v, causal=causal, deterministic=True),
        "cudnn": lambda q, k, v: PROVIDERS["sdpa_cudnn"].fn(q, k, v, causal),
    }
    summary = []
    for n in a.seqlens:
        g = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(b, n, h, d, device="cuda", dtype=dt, generator=g).requires_grad_()
        k, v = (torch.randn(b, n, hk, d, device="cuda", dtype=dt, generator=g).requires_grad_() for _ in range(2))
        do = torch.randn(b, n, h, d, device="cuda", dtype=dt, generator=g)
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1) * 3.5
        for name, fn in arms.items():
            def step(fn=fn):
                out = fn(q, k, v)
                torch.autograd.backward(out, do)
                q.grad = k.grad = v.grad = None
            per, wall = profile(step, a.iters)
            total = sum(per.values())
            print(f"N={n} B={b} H={h}/{hk} D={d} causal={int(causal)} {a.dtype} {name}: wall {wall:.0f} us/step "
                  f"({flops / wall * 1e-6:.0f} TFLOP/s fwd+bwd), kernels {total:.0f} us")
            for kname, us in per.most_common(8):
                print(f"    {us:9.1f} us  {kname[:110]}")
            summary.append((n, name, wall, total))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| N | arm | wall us/step | kernel us/step |")
    print("|---|---|---|---|")
    for n, name, wall, total in summary:
        print(f"| {n} | {name} | {wall:.0f} | {total:.0f} |")


if __name__ == "__main__":
    main()
