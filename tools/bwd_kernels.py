"""Where a backward's time goes, kernel by kernel: torch.profiler's CUDA time per call of every
kernel that the backward launches, for our fused (unordered) and split designs, the fused kernel
with its fp32 dQ sums zeroed by a memset of their own rather than by the delta kernel
(``fused_memset``, the way before 6f72bbd), the fused kernel with its dQ reductions switched
off (DQ_MODE=2: wrong dQ, timing only), FA4 and cuDNN.

Question it answers (2026-12-05 late): our fused backward's time fits a + b·N_blocks per call with
an intercept ~1 ms above FA4's (H100, D = 64, B·N = 16k tokens); is that intercept in the main
kernel (a per-program cost) or in the kernels around it (delta, dQ zeroing and conversion)?

    python tools/bwd_kernels.py [--dims 64 128] [--seqlens 2048 8192 16384] [--iters 10]
"""

from __future__ import annotations

import argparse
import collections

import torch

from tileflash.bench.providers import PROVIDERS
from tileflash.ops import route

import fused_ab  # tools/ is on sys.path when run as a script


def profile(fn, iters):
    """{kernel name: µs per call} over `iters` calls of fn (after two warm-up calls), and the
    wall µs per call (CUDA events, back to back)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) * 1e3 / iters
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    per = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name] += ev.device_time / iters  # µs
    return per, wall


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 8192, 16384])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--dtype", default="float16")
    args = ap.parse_args()
    dt = getattr(torch, args.dtype)
    fa4 = PROVIDERS.get("fa4")
    have_fa4 = fa4 is not None and not fa4.unavailable("cuda")
    summary = []
    for d in args.dims:
        for n in args.seqlens:
            b, h = 16384 // n, 2048 // d
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v, dout = (torch.randn(b, n, h, d, device="cuda", dtype=dt, generator=g) for _ in range(4))
            scale = d ** -0.5
            out, lse = route.forward(q, k, v, scale, False)
            flops = 4 * b * h * n * n * d * 2.5
            arms = {
                "fused": fused_ab.ours("fused", dout, q, k, v, out, lse, scale, False),
                "fused_memset": fused_ab.ours("fused_memset", dout, q, k, v, out, lse, scale, False),
                "fused_noDQ": fused_ab.ours("fused", dout, q, k, v, out, lse, scale, False,
                                            fused_cfg=[{"DQ_MODE": 2}]),
                "split": fused_ab.ours("split", dout, q, k, v, out, lse, scale, False),
                "cudnn": fused_ab.autograd_bwd(PROVIDERS["sdpa_cudnn"].fn, q, k, v, dout, False),
            }
            if have_fa4:
                arms["fa4"] = fused_ab.autograd_bwd(fa4.fn, q, k, v, dout, False)
            for name, fn in arms.items():
                try:
                    per, wall = profile(fn, args.iters)
                except Exception as e:  # noqa: BLE001 -- one arm failing keeps the others
                    print(f"D={d} N={n} {name}: {type(e).__name__}: {str(e)[:200]}")
                    continue
                total = sum(per.values())
                print(f"D={d} N={n} B={b} H={h} {name}: wall {wall:.0f} us/call ({flops / wall * 1e-6:.0f} TFLOP/s), "
                      f"kernels {total:.0f} us")
                for kname, us in per.most_common(6):
                    print(f"    {us:9.1f} us  {kname[:110]}")
                top = per.most_common(1)[0][1] if per else 0.0
                summary.append((d, n, name, wall, top, total - top))
            torch.cuda.empty_cache()
    print("\n| D | N | arm | wall us | main kernel us | other kernels us |")
    print("|---|---|---|---|---|---|")
    for d, n, name, wall, top, rest in summary:
        print(f"| {d} | {n} | {name} | {wall:.0f} | {top:.0f} | {rest:.0f} |")


if __name__ == "__main__":
    main()
