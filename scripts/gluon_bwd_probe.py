"""Where the Gluon backward's time goes: GPU kernel times (torch.profiler) of its variants beside
the Triton backward's kernels, on the H200.

Usage: PYTHONPATH=. python3 scripts/gluon_bwd_probe.py [--store] [--d 128] [--sizes 4096 16384]

Variants of tileflash.ops.backward_sm90 (kernel time only, no memsets or casts):
  det      the default: ordered fp32 dQ adds (bitwise deterministic)
  nondet   unordered adds
  dkdv     WITH_DQ=False: dK/dV only (4 matmuls), as a kernel that would pair with the Triton dQ kernel
  store    (--store, a separate process because it patches the kernel before compiling) dQ written
           with plain stores instead of adds: a WRONG result, timed only to bound the cost of the adds
and the Triton backward's three kernels (preprocess, dK/dV, dQ). TFLOP/s use the whole backward's
flops (2.5 x 4·B·H·N²·D, x0.5 causal) for every variant, so the columns compare times.
"""

import argparse
import os

os.environ["TILEFLASH_GLUON_BWD"] = "1"

import torch  # noqa: E402

from tileflash.ops import backward as B  # noqa: E402
from tileflash.ops import backward_sm90 as GB  # noqa: E402
from tileflash.ops import forward as F  # noqa: E402
from kernel_times import kernel_us  # noqa: E402 (earlier run scripts import it from here)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--store", action="store_true")
    ap.add_argument("--d", type=int, nargs="+", default=[128])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    args = ap.parse_args()
    if args.store:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl

        @gluon.jit
        def _store(ptrs, vals, VEC: gl.constexpr):
            gl.store(ptrs, vals)

        GB._dq_add = _store  # resolved when the kernel first compiles, i.e. below
    rows = []
    for d in args.d:
        for causal in (False, True):
            for n in args.sizes:
                b, h = 16384 // n, 2048 // d
                torch.manual_seed(0)
                q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
                flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1)
                scale = d ** -0.5
                out, lse = F.flash_attn_forward(q, k, v, scale, causal)
                delta = (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
                bufs = [torch.empty_like(x) for x in (q, k, v)]
                res = {}

                def gl_kernel(cfg, det):
                    t = kernel_us(lambda: GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg, det))
                    return sum(us for name, us in t.items() if "attn_bwd_sm90" in name)

                base = GB.config_for(d, causal, n)
                if args.store:
                    res["store"] = gl_kernel(base, False)
                else:
                    res["det"] = gl_kernel(base, True)
                    res["nondet"] = gl_kernel(base, False)
                    res["dkdv"] = gl_kernel(dict(base, WITH_DQ=False), True)
                    cfg = B.default_bwd_config(d, causal)
                    t = kernel_us(lambda: B.flash_attn_backward(do, q, k, v, out, lse, scale, causal, config=cfg))
                    for name, us in t.items():
                        for key in ("preprocess", "dkdv", "dq"):
                            if f"_bwd_{key}" in name:
                                res["tri_" + key] = res.get("tri_" + key, 0) + us
                line = " ".join(f"{key} {us:.0f} us ({flops / us * 1e-6:.0f})" for key, us in res.items())
                print(f"D={d} causal={int(causal)} N={n}: {line}", flush=True)
                rows.append((d, causal, n, res, flops))
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; kernel µs (whole-backward TFLOP/s)")
    for d, c, n, res, flops in rows:
        print(f"| {d} | {int(c)} | {n} | " + " | ".join(f"{key} {us:.0f} ({flops / us * 1e-6:.0f})"
                                                     for key, us in res.items()) + " |")


if __name__ == "__main__":
    main()
