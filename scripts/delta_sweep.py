"""The backward's delta kernel (rowsum(dO * O), ``backward._bwd_preprocess``) over its tile
choices: time per call (``do_bench``, L2 flushed) and the read bandwidth, checked against torch
(GPU only).

Usage: PYTHONPATH=. python3 scripts/delta_sweep.py
"""

import itertools

import torch
from triton.testing import do_bench

from tileflash.ops import backward as B
from tileflash.ops.common import block_grid, cdiv


def main():
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; fp16; time us (TB/s of O and dO read)")
    print("| B, N, H, D | " + " | ".join(f"M{m}/w{w}" for m, w in itertools.product((32, 64, 128), (2, 4, 8))) + " |")
    print("|---" * 10 + "|")
    for b, n, h, d in ((16, 1024, 16, 128), (1, 16384, 16, 128), (16, 1024, 32, 64), (1, 16384, 32, 64)):
        o, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(2))
        ref = (o.float() * do.float()).sum(-1).transpose(1, 2)
        cells = []
        for bm, w in itertools.product((32, 64, 128), (2, 4, 8)):
            delta = torch.full((b, h, n), float("nan"), device="cuda")
            grid, flat = block_grid(cdiv(n, bm), b * h)

            def run():
                B._bwd_preprocess[grid](o, do, delta, o.stride(0), o.stride(1), o.stride(2), do.stride(0),
                                        do.stride(1), do.stride(2), h, n, HEAD_DIM=d, BLOCK_D=d, BLOCK_M=bm,
                                        FLAT_GRID=flat, num_warps=w)
            run()
            torch.cuda.synchronize()
            err = (delta - ref).abs().max().item()
            assert err < 1e-2, f"delta wrong: {err}"
            us = do_bench(run, warmup=25, rep=200, return_mode="median") * 1e3
            cells.append(f"{us:.1f} ({2 * o.numel() * 2 / us * 1e-6:.2f})")
        print(f"| {b}, {n}, {h}, {d} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
