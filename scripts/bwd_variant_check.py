"""The Gluon dK/dV kernel (split default) and the fused kernel with config overrides, timed alone
next to the defaults in one run (GPU), with their results compared to the defaults'.

Usage: PYTHONPATH=.:scripts python3 scripts/bwd_variant_check.py [--dtype float16] [--sizes 4096 16384]
       [--d 64 128] [--variants LSE_EARLY=1 LSE_EARLY=2] [--fused]
For each (D, causal, N) (B·N = 16k tokens, H = 2048 / D, gluon_bwd_check.problem): the default
config of the dK/dV kernel (``config_for``; with --fused, ``fused_config_for``) and each variant
(comma-separated KEY=int overrides): do_bench median of ``backward_sm90.backward`` alone (delta
computed once), TFLOP/s-equivalent = the whole backward's flops over that time, and the max
difference of dK and dV (and dQ, fused) to the default's, outputs NaN-poisoned before each call.
Variants that only move loads must give the same bits (difference 0). The table is printed last.
"""

import argparse

import torch
from triton.testing import do_bench

from tileflash.ops import backward as B
from tileflash.ops import backward_sm90 as GB

from gluon_bwd_check import problem  # same directory


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--variants", nargs="*", default=["LSE_EARLY=1", "LSE_EARLY=2"])
    ap.add_argument("--fused", action="store_true", help="the fused kernel (ordered dQ) instead of the dK/dV kernel")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for d in args.d:
        for causal in map(bool, args.causal):
            for n in args.sizes:
                q, k, v, do, out, lse, scale, flops = problem(d, n, causal, dtype)
                b, h = q.shape[0], q.shape[2]
                delta = torch.empty_like(lse)
                B._bwd_preprocess[(n // 64, b * h)](out, do, delta, *out.stride()[:3], *do.stride()[:3], h, n,
                                                    HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64)
                base = GB.fused_config_for(d, causal) if args.fused else GB.config_for(d, causal, n)
                specs = [("default", base)]
                for spec in args.variants:
                    cfg = dict(base)
                    for item in spec.split(","):
                        key, val = item.split("=")
                        cfg[key] = int(val)
                    specs.append((spec, cfg))
                ref = None
                for name, cfg in specs:
                    bufs = [torch.full_like(x, float("nan")) for x in (q, k, v)]
                    try:
                        res = GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg)
                        if res is None:  # backward() warned and fell back: this config did not compile
                            raise RuntimeError(f"did not compile: {GB._BROKEN}")
                        got = [x.clone() for x in bufs]
                        if ref is None:
                            ref = got
                        idx = (0, 1, 2) if args.fused else (1, 2)
                        diff = max((got[i].float() - ref[i].float()).abs().max().item() for i in idx)
                        nan = any(torch.isnan(got[i]).any().item() for i in idx)
                        ms = do_bench(lambda: GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg),
                                      warmup=25, rep=100)
                        rows.append((d, int(causal), n, name, ms * 1e3, flops / ms * 1e-9, diff, nan))
                    except Exception as e:  # noqa: BLE001
                        rows.append((d, int(causal), n, name, float("nan"), float("nan"), float("nan"), repr(e)[:80]))
                    print(rows[-1], flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; "
          f"{'fused kernel' if args.fused else 'dK/dV kernel'} alone (do_bench median)")
    print("| D | causal | N | config | us | TFLOP/s-equiv. | max diff to default | NaN |")
    print("|---|---|---|---|---|---|---|---|")
    for d, c, n, name, us, tf, diff, nan in rows:
        print(f"| {d} | {c} | {n} | {name} | {us:.0f} | {tf:.0f} | {diff:.3g} | {nan} |")


if __name__ == "__main__":
    main()
