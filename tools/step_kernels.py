"""Where a training step's time goes, kernel by kernel: forward + backward through the public
``flash_attn_func`` (autograd), the default (``deterministic=False``) against
``deterministic=True``, with SDPA's cuDNN backend beside them. For each arm: the wall µs per step
(CUDA events over back-to-back steps), torch.profiler's CUDA µs per step of each kernel, and the
host's issue time per step (where it is about the wall time, the step is host-bound).

Question it answers (2026-12-06): ``tileflash bench --host``'s ``fwd+bwd@2k`` case (B=1 N=2048
H=16/8 D=128 causal bf16) read 509 µs per step for the default and 341 µs for
``deterministic=True`` on an H100, while the two backward kernels alone differ by ~8%
(tools/fused_ab.py): is the rest kernel time (which kernel) or host time?

Arms: ``default`` (the route as it is), ``fused`` (``deterministic=False`` with the work floor
``route.FUSED_MIN_FLOPS`` set to 0, so the fused kernel runs at every shape it takes),
``deterministic`` (the split pair) and SDPA's cuDNN backend. The kept plans (``route._BWD_PLANS``,
``interface._FAST_FWD``) are emptied before each arm, so that no arm replays another's backward.
A last table gives fused / split per shape, with the shape's backward work against the floor:
the data for placing ``FUSED_MIN_FLOPS``.

``--cprofile ARM [ARM ...]``: after timing, those arms' steps again under cProfile (host functions by
own time, and the calls per step of each): where a host-bound step's time goes.

    python tools/step_kernels.py [--seqlens 2048 4096] [--batches 1] [--heads 16] [--kv-heads 8] [--causal 1]
                                 [--cprofile fused default]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

import tileflash
from tileflash import interface
from tileflash.bench.providers import PROVIDERS
from tileflash.ops import route

from bwd_kernels import profile  # tools/ is on sys.path when run as a script


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--batches", type=int, nargs="+", default=[1])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", type=int, nargs="+", default=[1])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--cprofile", nargs="*", default=[], help="arms to run again under cProfile")
    a = ap.parse_args()
    dt, h, hk, d = getattr(torch, a.dtype), a.heads, a.kv_heads, a.dim
    floor = route.FUSED_MIN_FLOPS
    # name -> (deterministic, the work floor during the arm; None: SDPA's cuDNN backend)
    arms = {"default": (False, floor), "fused": (False, 0), "deterministic": (True, floor), "cudnn": None}
    summary, ratios = [], []
    for causal in map(bool, a.causal):
        for b in a.batches:
            for n in a.seqlens:
                g = torch.Generator(device="cuda").manual_seed(n)
                q = torch.randn(b, n, h, d, device="cuda", dtype=dt, generator=g).requires_grad_()
                k, v = (torch.randn(b, n, hk, d, device="cuda", dtype=dt, generator=g).requires_grad_()
                        for _ in range(2))
                do = torch.randn(b, n, h, d, device="cuda", dtype=dt, generator=g)
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1) * 3.5
                work = 10 * b * h * n * n * d * (0.5 if causal else 1)  # route._fused_backward's measure
                walls = {}
                for name, arm in arms.items():
                    if arm is None:
                        fn = lambda: PROVIDERS["sdpa_cudnn"].fn(q, k, v, causal)  # noqa: E731
                    else:
                        route.FUSED_MIN_FLOPS = arm[1]
                        route._BWD_PLANS.clear()
                        interface._FAST_FWD.clear()
                        fn = lambda det=arm[0]: tileflash.flash_attn_func(q, k, v, causal=causal,  # noqa: E731
                                                                         deterministic=det)

                    def step(fn=fn):
                        out = fn()
                        torch.autograd.backward(out, do)
                        q.grad = k.grad = v.grad = None
                    try:
                        per, wall = profile(step, a.iters)
                        issue = issue_time(step, a.iters)
                        if name in a.cprofile:
                            host_profile(step, a.iters, f"N={n} B={b} causal={int(causal)} {name}")
                    finally:
                        route.FUSED_MIN_FLOPS = floor
                    total = sum(per.values())
                    walls[name] = wall
                    print(f"N={n} B={b} H={h}/{hk} D={d} causal={int(causal)} {a.dtype} {name}: wall {wall:.0f} "
                          f"us/step ({flops / wall * 1e-6:.0f} TFLOP/s fwd+bwd), kernels {total:.0f} us, "
                          f"host issue {issue:.0f} us", flush=True)
                    for kname, us in per.most_common(8):
                        print(f"    {us:9.1f} us  {kname[:110]}")
                    summary.append((causal, b, n, name, wall, total))
                ratios.append((causal, b, n, work, walls["deterministic"] / walls["fused"]))
                torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, H={h}/{hk} D={d} {a.dtype}, "
          f"{a.iters} steps per arm")
    print("| causal | B | N | arm | wall us/step | kernel us/step |")
    print("|---|---|---|---|---|---|")
    for causal, b, n, name, wall, total in summary:
        print(f"| {int(causal)} | {b} | {n} | {name} | {wall:.0f} | {total:.0f} |")
    print(f"\nfused / split by step time (> 1: the fused step is faster), against the work floor {floor:.1e}:")
    print("| causal | B | N | backward FLOPs | over the floor | split wall / fused wall |")
    print("|---|---|---|---|---|---|")
    for causal, b, n, work, r in ratios:
        print(f"| {int(causal)} | {b} | {n} | {work:.2e} | {'yes' if work >= floor else 'no'} | {r:.3f} |")


def issue_time(step, iters) -> float:
    """Host µs per step to issue `iters` steps back to back (until the last step returned, before
    the closing sync): about the wall time per step where the host is the bottleneck, less where
    the GPU is."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        step()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / iters * 1e6


def host_profile(step, iters, label, top=18):
    """cProfile over `iters` steps (synchronized before and after): the host functions by own
    time, with their calls per step."""
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        step()
    prof.disable()  # (before the sync: time waiting on the GPU is not host time)
    torch.cuda.synchronize()
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # (func) -> (cc, nc, tt, ct, callers)
    total = sum(v[2] for v in st.stats.values())
    print(f"  cProfile {label}: {total / iters * 1e6:.0f} us of host time per step (own times summed)")
    print("      own us/step  cum us/step  calls/step  function")
    for (path, line, fn), (_, nc, tt, ct, _) in rows:
        print(f"    {tt / iters * 1e6:11.1f}  {ct / iters * 1e6:11.1f}  {nc / iters:10.1f}  "
              f"{path.rsplit('/', 2)[-1] if path != '~' else ''}:{line}({fn})")


if __name__ == "__main__":
    main()
