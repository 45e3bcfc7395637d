"""A/B of the fused backward's preprocess on a CUDA GPU: delta = rowsum(dO * O) plus the zeroing of
the fp32 dQ sums and counters, as one kernel (``compute_delta(..., zero=words)``, over a sweep of
its store chunk and warps) against two launches (the delta kernel, then a memset of the words:
the way before 6f72bbd). Each arm is checked first (poisoned words come back zero,
delta right), then timed with triton's do_bench in rotated rounds (``fused_ab.rotated_medians``).

    python tools/zero_ab.py [--dims 64 128] [--seqlens 2048 16384] [--rounds 5]
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from tileflash.ops.gluon import backward as gb
from tileflash.ops.triton import backward as tr_bwd

import fused_ab  # tools/ is on sys.path when run as a script


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[2048, 16384])
    ap.add_argument("--chunks", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rows = []
    for d in a.dims:
        for n in a.seqlens:
            b, h = 16384 // n, 2048 // d
            g = torch.Generator(device="cuda").manual_seed(n + d)
            out, dout = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16, generator=g) for _ in range(2))
            lse = torch.empty(b, h, n, device="cuda")
            bm = gb.fused_config_for(d, False, False)["BLOCK_M"]
            words = gb.fused_buffers(out, bm, zeroed=False)[2]
            want = (out.float() * dout.float()).sum(-1).transpose(1, 2)
            fns = {}

            def separate():
                tr_bwd.compute_delta(out, dout, lse, False, h, d)
                words.zero_()
            fns["separate"] = separate
            for chunk in a.chunks:
                for warps in a.warps:
                    tr_bwd.ZERO_CHUNK, tr_bwd.ZERO_WARPS = chunk, warps
                    tr_bwd._PRE_LAUNCHES.clear()
                    words.fill_(-7)
                    delta = tr_bwd.compute_delta(out, dout, lse, False, h, d, zero=words)
                    assert int(words.count_nonzero()) == 0, (chunk, warps)
                    torch.testing.assert_close(delta, want, rtol=1e-3, atol=1e-3)
                    (launch,) = tr_bwd._PRE_LAUNCHES.values()
                    fns[f"c{chunk}w{warps}"] = (lambda launch=launch, delta=delta:
                                                launch((), (out, dout, delta, words), (), True))
            ms = fused_ab.rotated_medians(fns, a.rounds, lambda fn: do_bench(fn, warmup=10, rep=50,
                                                                             return_mode="median"))
            print(f"D={d} N={n} B={b} H={h}: " + " ".join(f"{k}={v * 1e3:.1f}us" for k, v in ms.items()), flush=True)
            rows.append((d, n, ms))
    names = list(rows[0][2])
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}; us per call, median of rotated rounds")
    print("| D | N | " + " | ".join(names) + " |")
    print("|---" * (2 + len(names)) + "|")
    for d, n, ms in rows:
        print(f"| {d} | {n} | " + " | ".join(f"{ms[k] * 1e3:.1f}" for k in names) + " |")


if __name__ == "__main__":
    main()
