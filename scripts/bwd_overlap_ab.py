"""The dQ kernel launched with programmatic dependent launch (PDL) after the dK/dV kernel, A/B in
one run (perf-notes §27).

Usage: PYTHONPATH=. python3 scripts/bwd_overlap_ab.py [--dtype float16 bfloat16] [--sizes 1024 ... 16384]
       [--d 64 128] [--rounds 2] [--chain 20]
For each (dtype, D, causal, N), B·N = 16k tokens and H = 2048 / D (the bench's grid), the two
Gluon kernels of the backward (dK/dV, then dQ; delta computed once beforehand):
* "serial": config_for / dq_config_for as they are;
* "pdl": the dK/dV kernel lets its dependents launch from its start (PDL_TRIGGER) and the dQ
  kernel is launched with PDL, so its programs take the SMs that the dK/dV kernel's last ones
  free. The dQ kernel reads nothing the dK/dV kernel writes.
Checks: dQ, dK and dV bitwise equal between the two, no NaN left in NaN-poisoned buffers; and
--chain times over: poison, run the pdl pair, then at once (no sync) reduce dK, dV and dQ with
ordinary torch kernels: the sums must equal the serial ones, i.e. a kernel launched after the
pair waits for both kernels. Timing: do_bench medians (ms) of each pair, alternated for --rounds
rounds; TFLOP/s-equivalent = the whole backward's flops over the pair's time (delta excluded).
The table is printed last.
"""

import argparse

import torch
from triton.testing import do_bench

from bwd_order_ab import cells, grid_args
from tileflash.ops import backward_sm90 as GB


def main():
    ap = argparse.ArgumentParser()
    grid_args(ap)
    ap.add_argument("--chain", type=int, default=20)
    args = ap.parse_args()
    rows, bad = [], 0
    for dt, d, causal, n, q, k, v, do, scale, lse, delta, flops in cells(args):
        kv_cfg, dq_cfg = GB.config_for(d, causal, n), GB.dq_config_for(d, causal)
        variants = {"serial": (dict(kv_cfg, PDL_TRIGGER=False), dict(dq_cfg, PDL=False)),
                    "pdl": (dict(kv_cfg, PDL_TRIGGER=True), dict(dq_cfg, PDL=True))}

        def pair(bufs, cfgs):
            GB.backward(do, q, k, v, lse, delta, bufs[0], bufs[1], bufs[2], scale, causal, cfgs[0])
            GB.backward_dq(do, q, k, v, lse, delta, bufs[0], scale, causal, cfgs[1])

        got = {}
        for name, cfgs in variants.items():
            bufs = [torch.full_like(x, float("nan")) for x in (q, k, v)]
            pair(bufs, cfgs)
            got[name] = bufs
        same = all(torch.equal(x, y) for x, y in zip(got["serial"], got["pdl"]))
        nan = any(torch.isnan(x).any().item() for g in got.values() for x in g)
        want = torch.stack([x.float().sum() for x in got["serial"]])
        chain_bad = 0
        for _ in range(args.chain):
            bufs = got["pdl"]
            for x in bufs:
                x.fill_(float("nan"))
            pair(bufs, variants["pdl"])
            sums = torch.stack([x.float().sum() for x in bufs])   # launched right after, no sync
            chain_bad += not torch.equal(sums, want)
        bad += (not same) or nan or chain_bad > 0
        ms = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, cfgs in variants.items():
                bufs = got[name]
                ms[name].append(do_bench(lambda: pair(bufs, cfgs), warmup=25, rep=100))
        a, p = (sum(x) / len(x) for x in (ms["serial"], ms["pdl"]))
        row = (dt, d, int(causal), n, a, p, flops / a * 1e-9, flops / p * 1e-9, a / p, same, nan, chain_bad)
        rows.append(row)
        print("{} D={} causal={} N={}: serial {:.4f} ms pdl {:.4f} ms ({:.0f} -> {:.0f} TFLOP/s, "
              "speedup {:.3f}); bitwise {} nan {} chain failures {}; rounds {}".format(
                  *row, {k2: [round(x, 4) for x in v2] for k2, v2 in ms.items()}), flush=True)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; dK/dV then dQ, serial against PDL, "
          f"do_bench medians averaged over {args.rounds} alternated rounds")
    print("| dtype | D | causal | N | serial ms | PDL ms | serial TFLOP/s | PDL TFLOP/s | speedup | same bits, no NaN, "
          f"{args.chain} chained |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dt, d, c, n, a, p, ta, tp, sp, same, nan, cb in rows:
        ok = "yes" if same and not nan and cb == 0 else f"NO (same {same}, nan {nan}, chain failures {cb})"
        print(f"| {dt} | {d} | {c} | {n} | {a:.4f} | {p:.4f} | {ta:.0f} | {tp:.0f} | {sp:.3f} | {ok} |")
    if bad:
        raise SystemExit(f"{bad} cells failed a check")


if __name__ == "__main__":
    main()
