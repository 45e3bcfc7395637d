"""Joint (dK/dV, dQ) backward config sweep for one (head dim, causal), on the GPU.

Usage: PYTHONPATH=. python3 scripts/bwd_pair_sweep.py D CAUSAL(0/1) N [N ...] [--pairs BM,BN,W,S/BM,BN,W,S ...]
(--pairs: time only these dK/dV / dQ pairs, e.g. 64,128,8,2/128,64,8,3)
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
        pairs = [tuple(tuple(int(x) for x in half.split(",")) for half in p.split("/")) for p in argv[i + 1:]]
        argv = argv[:i]
    d, causal, sizes = int(argv[0]), bool(int(argv[1])), [int(x) for x in argv[2:]]
    score = {}
    for n in sizes:
        b, h = 16384 // n, 2048 // d
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
        out, lse = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
        flops = 4 * b * h * n * n * d * (0.5 if causal else 1) * 2.5
        ref = B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal)
        for a, c in pairs or itertools.product(*((DKDV_WIDE, DQ_WIDE) if d > 128 else (DKDV, DQ))):
            conf = {"dkdv": cfg(a), "dq": cfg(c)}
            try:
                g = B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal, config=conf)
                ok = all(torch.allclose(x, y, atol=2e-2, rtol=1e-2) for x, y in zip(g, ref))
                ms = do_bench(lambda: B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal, config=conf),
                              warmup=10, rep=40)
            except Exception as e:  # noqa: BLE001
                print(f"N={n} {a} {c}: FAILED {repr(e)[:100]}", flush=True)
                continue
            t = flops / ms * 1e-9
            score.setdefault((a, c), []).append(t)
            print(f"N={n} dkdv {a} dq {c}: {t:.0f} TFLOP/s ok={ok}", flush=True)
    best = max((v for v in score.items() if len(v[1]) == len(sizes)), key=lambda kv: sum(kv[1]))
    print(f"best D={d} causal={causal}: dkdv {best[0][0]} dq {best[0][1]}: " + ", ".join(f"{x:.0f}" for x in best[1]))


if __name__ == "__main__":
    main()
