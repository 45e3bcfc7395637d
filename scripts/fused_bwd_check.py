"""The fused warp-specialized Gluon backward (dQ, dK, dV in one kernel) against the default split
backward (Gluon dK/dV + Gluon dQ), cuDNN and SDPA-flash, in one run (GPU).

Usage: PYTHONPATH=. python3 scripts/fused_bwd_check.py [--dtype float16] [--sizes 1024 4096 16384] [--d 64 128]
For each (D, causal, N), B·N = 16k tokens and H = 2048 / D (as gluon_bwd_check.py):
* accuracy (N <= 4k): dq/dk/dv of the fused path (output buffers poisoned with NaN) against fp32
  autograd on batch 0, flash-attn's rule: error <= 2x the Triton backward's error + 1e-3;
* determinism: the ordered fused mode run twice, compared bitwise (the unordered one is not);
* speed, do_bench median, the whole backward through ``flash_attn_backward`` (delta included):
  default split, fused ordered (TILEFLASH_GLUON_FUSED=1), fused unordered (delta + the kernel
  called directly with deterministic=False), cuDNN and SDPA-flash (autograd of SDPA).
The table is printed last.
"""

import argparse
import os

import torch
from triton.testing import do_bench

from tileflash.ops import backward as B
from tileflash.ops import backward_sm90 as GB

from gluon_bwd_check import problem, ref_grads, sdpa_backward_ms  # same directory


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--variants", nargs="*", default=[], help="fused configurations timed beside the default, "
                    "e.g. DQ_OWN_FIRST=1 or DQ_FIRST=0,det=0 (keys of fused_config_for; det: ordered sums)")
    ap.add_argument("--modes", action="store_true", help="also time the kernels alone: the default dK/dV and dQ "
                    "kernels, and the fused kernel with a TMA store instead of the add, and with no dQ write")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for d in args.d:
        for causal in map(bool, args.causal):
            for n in args.sizes:
                q, k, v, do, out, lse, scale, flops = problem(d, n, causal, dtype)
                b, h = q.shape[0], q.shape[2]
                tri_cfg = B.default_bwd_config(d, causal)

                def split():
                    return B.flash_attn_backward(do, q, k, v, out, lse, scale, causal)

                bufs = [torch.full_like(x, float("nan")) for x in (q, k, v)]

                def fused():
                    return B.flash_attn_backward(do, q, k, v, out, lse, scale, causal, dq=bufs[0], dk=bufs[1],
                                                 dv=bufs[2])

                cfg = GB.fused_config_for(d, causal)

                def fused_nd():
                    delta = torch.empty_like(lse)
                    B._bwd_preprocess[(n // 64, b * h)](out, do, delta, *out.stride()[:3], *do.stride()[:3], h, n,
                                                        HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64)
                    return GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg, False)

                t1 = B.flash_attn_backward(do, q, k, v, out, lse, scale, causal, config=tri_cfg)
                s1 = split()
                os.environ["TILEFLASH_GLUON_FUSED"] = "1"
                try:
                    f1 = [x.clone() for x in fused()]
                    if GB._BROKEN:  # a failed compile falls back to the split kernels: do not time those as fused
                        raise SystemExit(f"a Gluon backward configuration failed to compile: {GB._BROKEN}")
                    nan = any(torch.isnan(x).any().item() for x in f1)
                    for x in bufs:
                        x.fill_(float("nan"))
                    f2 = [x.clone() for x in fused()]
                    det = all(torch.equal(x, y) for x, y in zip(f1, f2))
                    t = {"fused": do_bench(fused, warmup=25, rep=100)}
                finally:
                    os.environ.pop("TILEFLASH_GLUON_FUSED")
                diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(f1, s1))
                nd = [x.clone() for x in fused_nd()]
                nd_diff = max((x.float() - y.float()).abs().max().item() for x, y in zip(nd, f1))
                ok = "n/a"
                if n <= 4096:
                    ref = ref_grads(q, k, v, do, causal, scale)
                    errs = []
                    for name, gg, ggn, tt, rr in zip("qkv", f1, nd, t1, ref):
                        eg = (gg[:1].float() - rr).abs().max().item()
                        en = (ggn[:1].float() - rr).abs().max().item()
                        et = (tt[:1].float() - rr).abs().max().item()
                        errs.append((name, round(eg, 5), round(en, 5), round(et, 5)))
                    ok = "ok" if all(eg <= 2 * et + 1e-3 and en <= 2 * et + 1e-3 for _, eg, en, et in errs) \
                        else "FAIL " + str(errs)
                    print(f"  errors (fused, unordered, triton): {errs}", flush=True)
                t["split"] = do_bench(split, warmup=25, rep=100)
                t["fused_nd"] = do_bench(fused_nd, warmup=25, rep=100)
                if args.variants:  # fused configurations against the split default, the kernel launcher alone
                    delta = torch.empty_like(lse)
                    B._bwd_preprocess[(n // 64, b * h)](out, do, delta, *out.stride()[:3], *do.stride()[:3], h, n,
                                                        HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64)
                    for spec in args.variants:
                        vcfg, vdet = dict(cfg), True
                        for item in spec.split(","):
                            key, val = item.split("=")
                            if key == "det":
                                vdet = bool(int(val))
                            else:
                                vcfg[key] = int(val)
                        try:
                            runs = []
                            for _ in range(2):
                                vb = [torch.full_like(x, float("nan")) for x in (q, k, v)]
                                runs.append(GB.backward(do, q, k, v, lse, delta, *vb, scale, causal, vcfg, vdet))
                            rel = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                                      for x, y in zip(runs[0], s1))
                            same = all(torch.equal(x, y) for x, y in zip(*runs))
                            ms = do_bench(lambda: GB.backward(do, q, k, v, lse, delta, *vb, scale, causal, vcfg, vdet),
                                          warmup=25, rep=100)
                            print(f"    D={d} causal={int(causal)} N={n} variant {spec}: {ms * 1e3:.0f} us "
                                  f"({flops / ms * 1e-9:.0f} TFLOP/s-equivalent, launcher) max rel diff to split "
                                  f"{rel:.2g}, rerun {'same' if same else 'different'}", flush=True)
                        except Exception as e:  # noqa: BLE001
                            print(f"    D={d} causal={int(causal)} N={n} variant {spec}: FAILED {repr(e)[:300]}",
                                  flush=True)
                if args.modes:  # where the fused kernel's time goes (wrong results, timed only)
                    delta = torch.empty_like(lse)
                    B._bwd_preprocess[(n // 64, b * h)](out, do, delta, *out.stride()[:3], *do.stride()[:3], h, n,
                                                        HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64)
                    parts = {"dkdv kernel (default)": lambda: GB.backward(do, q, k, v, lse, delta, *bufs, scale,
                                                                          causal),
                             "dq kernel (default)": lambda: GB.backward_dq(do, q, k, v, lse, delta, bufs[0], scale,
                                                                           causal),
                             "fused, TMA store instead of add": lambda: GB.backward(
                                 do, q, k, v, lse, delta, *bufs, scale, causal, dict(cfg, DQ_MODE=1), False),
                             "fused, no dQ write": lambda: GB.backward(
                                 do, q, k, v, lse, delta, *bufs, scale, causal, dict(cfg, DQ_MODE=2), False),
                             "fused unordered (launcher: memset+kernel+cast)": lambda: GB.backward(
                                 do, q, k, v, lse, delta, *bufs, scale, causal, cfg, False),
                             "fused ordered (launcher)": lambda: GB.backward(
                                 do, q, k, v, lse, delta, *bufs, scale, causal, cfg, True)}
                    for name, fn in parts.items():
                        ms = do_bench(fn, warmup=25, rep=100)
                        print(f"    D={d} causal={int(causal)} N={n} {name}: {ms * 1e3:.0f} us "
                              f"({flops / ms * 1e-9:.0f} TFLOP/s-equivalent)", flush=True)
                t.update(sdpa_backward_ms(q, k, v, do, causal))
                tf = {key: flops / ms * 1e-9 for key, ms in t.items()}
                row = (d, int(causal), n, tf["split"], tf["fused"], tf["fused_nd"], tf["cudnn"], tf["flash"], diff,
                       nd_diff, det, nan, ok)
                rows.append(row)
                print("D={} causal={} N={}: split {:.0f} fused {:.0f} fused-nd {:.0f} cudnn {:.0f} flash {:.0f} "
                      "TFLOP/s; max|fused-split| {:.3g} max|nd-fused| {:.3g} bitwise rerun {} nan {} vs fp32 {}"
                      .format(*row), flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.dtype}; backward TFLOP/s "
          "(do_bench median, whole backward incl. delta)")
    print("| D | causal | N | split | fused | fused unordered | cuDNN | SDPA-flash | fused/cuDNN | fused/split "
          "| bitwise rerun | fp32 rule |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d, c, n, sp, fu, fn, cu, fl, diff, ndd, det, nan, ok in rows:
        print(f"| {d} | {c} | {n} | {sp:.0f} | {fu:.0f} | {fn:.0f} | {cu:.0f} | {fl:.0f} | {fu / cu:.2f} | "
              f"{fu / sp:.2f} | {'same' if det else 'DIFFERENT'}{' NaN' if nan else ''} | {ok} |")


if __name__ == "__main__":
    main()
