"""The dK/dV kernel's two launch orders, A/B in one run (perf-notes §27).

Usage: PYTHONPATH=. python3 scripts/bwd_order_ab.py [--dtype float16 bfloat16] [--sizes 1024 ... 16384]
       [--d 64 128] [--rounds 2]
For each (dtype, D, causal, N), B·N = 16k tokens and H = 2048 / D (the bench's grid):
* the Gluon dK/dV kernel with config_for's tiles in the heads-fastest 2-D grid (PER_HEAD=False,
  the grid the fused mode's ordered adds use) and in the per-head grid (PER_HEAD=True: a head's
  K/V blocks together), into NaN-poisoned buffers: dK and dV must be bitwise equal between the two and free
  of NaN (the same arithmetic; only the order of the programs differs);
* do_bench medians (ms) of each, alternated for --rounds rounds, and of the Gluon dQ kernel once,
  so that the whole backward's change can be read off: TFLOP/s-equivalent = the whole backward's
  flops (2.5 × 4·B·H·N²·D, × 0.5 causal) over dK/dV + dQ.
The table is printed last.
"""

import argparse

import torch
from triton.testing import do_bench

from tileflash.ops import backward_sm90 as GB
from tileflash.ops import forward as F


def grid_args(ap):
    """The grid's options (shared with scripts/bwd_overlap_ab.py)."""
    ap.add_argument("--dtype", nargs="+", default=["float16"])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--d", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--rounds", type=int, default=2)


def cells(args):
    """Each cell of the grid: (dtype name, D, causal, N, q, k, v, dO, scale, lse, delta, flops) with
    B·N = 16k tokens, H = 2048 / D, fresh random inputs (seed N + D), the forward's LSE, delta =
    rowsum(dO·O), and the whole backward's flops (2.5 × 4·B·H·N²·D, × 0.5 causal)."""
    for dt in args.dtype:
        dtype = getattr(torch, dt)
        for d in args.d:
            for causal in (False, True):
                for n in args.sizes:
                    b, h = 16384 // n, 2048 // d
                    torch.manual_seed(n + d)
                    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=dtype) for _ in range(4))
                    scale = d ** -0.5
                    out, lse = F.flash_attn_forward(q, k, v, scale, causal)
                    delta = (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
                    flops = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1)
                    yield dt, d, causal, n, q, k, v, do, scale, lse, delta, flops


def main():
    ap = argparse.ArgumentParser()
    grid_args(ap)
    args = ap.parse_args()
    rows, bad = [], 0
    for dt, d, causal, n, q, k, v, do, scale, lse, delta, flops in cells(args):
        base = GB.config_for(d, causal, n)
        cfgs = {"heads": dict(base, PER_HEAD=False), "per_head": dict(base, PER_HEAD=True)}
        got = {}
        for name, cfg in cfgs.items():
            bufs = [torch.full_like(x, float("nan")) for x in (q, k, v)]
            GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg)
            got[name] = bufs
        same = all(torch.equal(x, y) for x, y in zip(got["heads"][1:], got["per_head"][1:]))
        nan = any(torch.isnan(x).any().item() for g in got.values() for x in g[1:])
        bad += (not same) or nan
        ms = {name: [] for name in cfgs}
        for _ in range(args.rounds):
            for name, cfg in cfgs.items():
                bufs = got[name]
                ms[name].append(do_bench(
                    lambda: GB.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg),
                    warmup=25, rep=100))
        dq = torch.empty_like(q)
        dq_ms = do_bench(lambda: GB.backward_dq(do, q, k, v, lse, delta, dq, scale, causal),
                         warmup=25, rep=100)
        a, p = (sum(x) / len(x) for x in (ms["heads"], ms["per_head"]))
        row = (dt, d, int(causal), n, a, p, dq_ms, flops / (a + dq_ms) * 1e-9, flops / (p + dq_ms) * 1e-9,
               a / p, same, nan, ms)
        rows.append(row)
        print("{} D={} causal={} N={}: dkdv heads {:.4f} ms per-head {:.4f} ms dq {:.4f} ms; whole "
              "(dkdv+dq) {:.0f} -> {:.0f} TFLOP/s; speedup {:.3f}; bitwise {} nan {}; rounds {}".format(
                  *row[:10], same, nan, {k2: [round(x, 4) for x in v2] for k2, v2 in ms.items()}),
              flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; dK/dV kernel launch order A/B, "
          f"do_bench medians averaged over {args.rounds} alternated rounds")
    print("| dtype | D | causal | N | dK/dV heads-fastest ms | dK/dV per-head ms | dQ ms | whole TFLOP/s before | "
          "after | dK/dV speedup | same bits, no NaN |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for dt, d, c, n, a, p, q_ms, ta, tp, sp, same, nan, _ in rows:
        print(f"| {dt} | {d} | {c} | {n} | {a:.4f} | {p:.4f} | {q_ms:.4f} | {ta:.0f} | {tp:.0f} | {sp:.3f} | "
              f"{'yes' if same and not nan else 'NO'} |")
    if bad:
        raise SystemExit(f"{bad} cells differ between the launch orders or left NaN")


if __name__ == "__main__":
    main()
