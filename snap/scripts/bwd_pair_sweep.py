"""Joint (dK/dV, dQ) backward config sweep for one (head dim, causal), on the GPU.

Usage: PYTHONPATH=. python3 scripts/bwd_pair_sweep.py D CAUSAL(0/1) N [N ...] [--tma 0|1|both]
       [--pairs BM,BN,W,S/BM,BN,W,S ...]
(--pairs: time only these dK/dV / dQ pairs, e.g. 64,128,8,2/128,64,8,3, or "default" for the head
dim's default pair; --tma: pointer loads (0, the default), tensor descriptors (1), or both.
Gradients are checked against the default pointer-path backward.)
Prints the backward TFLOP/s (×2.5 convention) of each pair per N, and the best pair last.
"""

import itertools
import sys

import torch
from triton.testing import do_bench

from tileflash.ops import backward as B
from tileflash.ops import forward as F

DKDV = [(32, 64, 4, 2), (32, 128, 4, 2), (32, 64, 4, 3), (64, 64, 4, 2), (32, 128, 8, 3), (64, 128, 8, 2),
        (64, 128, 8, 3), (32, 128, 4, 3)]
DQ = [(64, 64, 4, 3), (64, 64, 4, 2), (128, 32, 8, 3), (64, 32, 4, 3), (128, 64, 8, 2)]
# D > 128 (BLOCK_D 256): the fp32 dK/dV (or dQ) accumulators alone take most of the registers
DKDV_WIDE = [(16, 64, 4, 2), (32, 64, 4, 2), (32, 64, 8, 2), (32, 32, 4, 2), (16, 32, 4, 2), (64, 64, 8, 2),
             (32, 64, 8, 1)]
DQ_WIDE = [(64, 32, 4, 2), (32, 64, 4, 2), (64, 32, 8, 2), (32, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2)]


def cfg(t):
    return dict(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2], num_stages=t[3])


def main():
    argv = sys.argv[1:]
    pairs = None
    if "--pairs" in argv:
        i = argv.index("--pairs")
        pairs = argv[i + 1:]
        argv = argv[:i]
    tmas = (False,)
    if "--tma" in argv:
        i = argv.index("--tma")
        tmas = {"0": (False,), "1": (True,), "both": (False, True)}[argv[i + 1]]
        argv = argv[:i] + argv[i + 2:]
    d, causal, sizes = int(argv[0]), bool(int(argv[1])), [int(x) for x in argv[2:]]
    if pairs is not None:
        dflt = B.default_bwd_config(d, causal)
        pairs = [tuple(tuple(dflt[f][k] for k in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")) for f in ("dkdv", "dq"))
                 if p == "default" else tuple(tuple(int(x) for x in half.split(",")) for half in p.split("/"))
                 for p in pairs]
    score = {}
    for n in sizes:
        b, h = 16384 // n, 2048 // d
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
        out, lse = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1) * 2.5
        ref = B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal)
        for (a, c), tma in itertools.product(pairs or list(itertools.product(
                *((DKDV_WIDE, DQ_WIDE) if d > 128 else (DKDV, DQ)))), tmas):
            conf = {"dkdv": cfg(a), "dq": cfg(c), "USE_TMA": tma}
            try:
                g = B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal, config=conf)
                ok = all(torch.allclose(x, y, atol=2e-2, rtol=1e-2) for x, y in zip(g, ref))
                ms = do_bench(lambda: B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal, config=conf),
                              warmup=10, rep=40)
            except Exception as e:  # noqa: BLE001
                print(f"N={n} {a} {c} tma={int(tma)}: FAILED {repr(e)[:100]}", flush=True)
                continue
            t = flops / ms * 1e-9
            score.setdefault((a, c, tma), []).append(t)
            print(f"N={n} dkdv {a} dq {c} tma={int(tma)}: {t:.0f} TFLOP/s ok={ok}", flush=True)
    for tma in tmas:
        cands = [kv for kv in score.items() if kv[0][2] == tma and len(kv[1]) == len(sizes)]
        if cands:
            best = max(cands, key=lambda kv: sum(kv[1]))
            print(f"best D={d} causal={causal} tma={int(tma)}: dkdv {best[0][0]} dq {best[0][1]}: "
                  + ", ".join(f"{x:.0f}" for x in best[1]))


if __name__ == "__main__":
    main()
