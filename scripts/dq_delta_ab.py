"""The backward with delta computed inside the Gluon dQ kernel (the default since the twenty-fourth
session: dQ kernel first, then dK/dV, no delta kernel) against the delta kernel route
(``TILEFLASH_DQ_DELTA=0``: delta kernel, dK/dV, dQ), in one run, beside cuDNN SDPA.

Usage: PYTHONPATH=. python3 scripts/dq_delta_ab.py [--dtype float16] [--d 64 128] [--sizes 1024 4096]
       [--rounds 2]
Shapes as `tileflash bench`: B·N = 16k tokens, H = 2048 / D. Each cell: the gradients of both
routes against each other (max |difference| relative to max |dq|), then do_bench medians of
torch.autograd.grad through tileflash.flash_attn_func, the two routes alternated `rounds` times,
then cuDNN's. Kernel times per route (torch.profiler) for the first size. The table is printed last.
"""

import argparse
import os
from collections import defaultdict

import torch
import torch.nn.functional as Fn
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash
from kernel_times import kernel_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 16384])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    rows = []
    for d in args.d:
        for causal in (False, True):
            for n in args.sizes:
                b, h = 16384 // n, 2048 // d
                q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=dtype).requires_grad_() for _ in range(3))
                do = torch.randn(b, n, h, d, device="cuda", dtype=dtype)
                out = tileflash.flash_attn_func(q, k, v, causal=causal)

                def grads():
                    return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

                res = {}
                for mode in ("1", "0"):
                    os.environ["TILEFLASH_DQ_DELTA"] = mode
                    res[mode] = [g.clone() for g in grads()]
                diff = max(((a.float() - b_.float()).abs().max() / b_.float().abs().max()).item()
                           for a, b_ in zip(res["1"], res["0"]))
                nan = any(torch.isnan(g).any().item() for g in res["1"])
                flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                ms = defaultdict(list)
                for _ in range(args.rounds):
                    for mode in ("1", "0"):
                        os.environ["TILEFLASH_DQ_DELTA"] = mode
                        ms[mode].append(do_bench(grads, warmup=25, rep=100))
                qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o_c = Fn.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                do_t = do.transpose(1, 2)
                ms_c = do_bench(lambda: torch.autograd.grad(o_c, (qt, kt, vt), do_t, retain_graph=True),
                                warmup=25, rep=100)
                if n == args.sizes[0]:
                    for mode in ("1", "0"):
                        os.environ["TILEFLASH_DQ_DELTA"] = mode
                        ks = kernel_us(grads)
                        print(f"kernels D={d} causal={causal} N={n} TILEFLASH_DQ_DELTA={mode}: "
                              + ", ".join(f"{k_[:40]} {t:.1f}" for k_, t in sorted(ks.items(), key=lambda x: -x[1])),
                              flush=True)
                os.environ.pop("TILEFLASH_DQ_DELTA")
                best = {m: min(v_) for m, v_ in ms.items()}
                rows.append((d, causal, n, best["1"], best["0"], ms_c, flops, diff, nan,
                             " ".join(f"{x:.3f}" for x in ms["1"]), " ".join(f"{x:.3f}" for x in ms["0"])))
                print(rows[-1], flush=True)
                del q, k, v, do, out, qt, kt, vt, o_c, res
    print(f"\n{args.dtype}, ms = best of {args.rounds} alternated do_bench medians; TFLOP/s in brackets")
    print("| D | causal | N | delta in dQ (new) | delta kernel (old) | new/old time | cuDNN | new / cuDNN | old / cuDNN "
          "| max rel diff | NaN | rounds new | rounds old |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for d, causal, n, new, old, cud, flops, diff, nan, rn, ro in rows:
        tf = lambda t: flops / t * 1e-9  # noqa: E731
        print(f"| {d} | {'yes' if causal else 'no'} | {n} | {new:.3f} ({tf(new):.0f}) | {old:.3f} ({tf(old):.0f}) | "
              f"{new / old:.3f} | {cud:.3f} ({tf(cud):.0f}) | {cud / new:.3f} | {cud / old:.3f} | {diff:.1e} | {nan} "
              f"| {rn} | {ro} |")


if __name__ == "__main__":
    main()
