"""The fused backward's dQ postprocess, two ways on the same tensors: torch's
``torch.mul(acc, scale, out=dq)`` (what ``gluon.backward._run_fused`` ran before) against
``triton.backward.scale_cast`` (the kernel it runs with the debug switch ``scale_cast=1``; opt-in until
measured). Checks that both give the same bits first; then ``triton.testing.do_bench`` medians, the
arms' order rotated over rounds (``fused_ab.rotated_medians``).

    python tools/cast_ab.py [--tokens 16384] [--width 2048] [--rounds 5]
"""

from __future__ import annotations

import argparse

import torch
from triton.testing import do_bench

from tileflash.ops.triton.backward import scale_cast

from fused_ab import rotated_medians  # tools/ is on sys.path when run as a script


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384, help="B·N (default 16384, the grid's)")
    ap.add_argument("--width", type=int, default=2048, help="H·D (default 2048, the grid's)")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    acc = torch.randn(a.tokens, a.width, device="cuda") * 50
    scale = 128 ** -0.5
    rows = []
    for dt in (torch.float16, torch.bfloat16):
        dq = torch.full_like(acc, float("nan"), dtype=dt)
        ref = torch.mul(acc, scale, out=torch.empty_like(dq))
        scale_cast(acc, dq, scale)
        assert torch.equal(dq, ref), f"{dt}: scale_cast differs from torch.mul"
        arms = {"torch.mul": lambda: torch.mul(acc, scale, out=dq), "scale_cast": lambda: scale_cast(acc, dq, scale)}
        medians = rotated_medians(arms, a.rounds,
                                  lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e3)
        gb = acc.numel() * (4 + dq.element_size()) / 1e9
        for name, us in medians.items():
            rows.append((str(dt).split(".")[-1], name, us, gb / us * 1e6 / 1e3))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {a.tokens} x {a.width} fp32 -> dq, "
          f"median of {a.rounds} rounds")
    print("| dtype | arm | us | TB/s (read fp32 + write dq) |")
    print("|---|---|---|---|")
    for dt, name, us, tbs in rows:
        print(f"| {dt} | {name} | {us:.1f} | {tbs:.2f} |")


if __name__ == "__main__":
    main()
