"""Sweep backward block configs on the GPU (one kernel family at a time, the other at its default).

Prints, per (D, causal), the backward TFLOP/s (×2.5 convention) of each candidate. Used to fill
``default_bwd_config`` (tileflash/ops/triton/backward.py).
"""

import sys

import torch
from triton.testing import do_bench

from tileflash.ops.triton import backward as B
from tileflash.ops.triton import forward as F

DKDV = [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (32, 64, 4, 2),
        (64, 128, 4, 2), (64, 64, 4, 2), (64, 64, 8, 3), (128, 64, 8, 2), (32, 128, 8, 3)]
DQ = [(128, 64, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 8, 3), (64, 128, 8, 2), (64, 32, 4, 2)]


def cfg(t):
    return dict(BLOCK_M=t[0], BLOCK_N=t[1], num_warps=t[2], num_stages=t[3])


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    dims = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else [64, 128]
    for d in dims:
        for causal in (True, False):
            b, h = 16384 // n, 2048 // d
            q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
            out, lse = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
            flops = 4 * b * h * n * n * d * (0.5 if causal else 1) * 2.5
            base = B.default_bwd_config(d, causal)
            ref = B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal, config=base)
            for fam, cands in (("dkdv", DKDV), ("dq", DQ)):
                for c in cands:
                    conf = dict(base)
                    conf[fam] = cfg(c)
                    try:
                        g = B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal, config=conf)
                        ok = all(torch.allclose(x, y, atol=2e-2, rtol=1e-2) for x, y in zip(g, ref))
                        ms = do_bench(lambda: B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal,
                                                                    config=conf), warmup=25, rep=100)
                        print(f"D={d} causal={causal} {fam} {c}: {flops / ms * 1e-9:.0f} TFLOP/s ok={ok}", flush=True)
                    except Exception as e:
                        print(f"D={d} causal={causal} {fam} {c}: FAILED {repr(e)[:120]}", flush=True)


if __name__ == "__main__":
    main()
