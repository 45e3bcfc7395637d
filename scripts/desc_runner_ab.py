"""Host time with and without ``forward_sm90._DescRunner`` (TMA descriptors encoded once per address),
in one process, the two modes alternated in rounds (the host's speed drifts within a run).

Per shape: host time per call (200 calls, no sync) of the forward (``flash_attn_func``) and of the
backward (``torch.autograd.grad``), and ``do_bench`` of each (what ``tileflash bench`` reads), for
tileflash with the runner on and off, and cuDNN SDPA as the yardstick. Prints a table last.

Usage: PYTHONPATH=. python3 scripts/desc_runner_ab.py [--rounds 4] [B:N:H:D:CAUSAL ...]
       (default: 16:1024:16:128:1 16:1024:32:64:0 1:512:8:128:1)
"""

import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash
from tileflash.ops import forward_sm90 as g90
from host_profile import host_us


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shapes", nargs="*", default=["16:1024:16:128:1", "16:1024:32:64:0", "1:512:8:128:1"])
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    table = []
    for spec in args.shapes:
        b, n, h, d, causal = (int(x) for x in spec.split(":"))
        causal = bool(causal)
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
        do = torch.randn_like(q)
        out = tileflash.flash_attn_func(q, k, v, causal=causal)

        def fwd():
            return tileflash.flash_attn_func(q, k, v, causal=causal)

        def bwd():
            return torch.autograd.grad(out, (q, k, v), do, retain_graph=True)

        qt, kt, vt = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            out_c = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def cfwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def cbwd():
            return torch.autograd.grad(out_c, (qt, kt, vt), do.transpose(1, 2), retain_graph=True)

        res = {}
        for r in range(args.rounds):
            for mode in ((True, False) if r % 2 == 0 else (False, True)):
                g90._DescRunner.ENABLED = mode
                for name, fn in (("fwd", fwd), ("bwd", bwd)):
                    res.setdefault((name, mode, "host"), []).append(host_us(fn))
                    res.setdefault((name, mode, "bench"), []).append(do_bench(fn, warmup=10, rep=50,
                                                                              return_mode="median") * 1e3)
            for name, fn in (("fwd", cfwd), ("bwd", cbwd)):
                res.setdefault((name, "cudnn", "host"), []).append(host_us(fn))
                res.setdefault((name, "cudnn", "bench"), []).append(do_bench(fn, warmup=10, rep=50,
                                                                             return_mode="median") * 1e3)
        g90._DescRunner.ENABLED = True
        for key_, vals in res.items():  # every round, in order (rounds alternate which mode goes first)
            print(f"# {spec} {key_[0]} {'on' if key_[1] is True else 'off' if key_[1] is False else key_[1]} "
                  f"{key_[2]}: " + " ".join(f"{x:.0f}" for x in vals), flush=True)
        for name in ("fwd", "bwd"):
            med = {m: {x: statistics.median(res[(name, m, x)]) for x in ("host", "bench")} for m in (True, False, "cudnn")}
            spread = {m: (min(res[(name, m, "host")]), max(res[(name, m, "host")])) for m in (True, False)}
            row = (f"| {name} B={b} N={n} H={h} D={d} causal={int(causal)} | {med[False]['host']:.0f} "
                   f"({spread[False][0]:.0f}-{spread[False][1]:.0f}) | {med[True]['host']:.0f} "
                   f"({spread[True][0]:.0f}-{spread[True][1]:.0f}) | {med['cudnn']['host']:.0f} | "
                   f"{med[False]['bench']:.1f} | {med[True]['bench']:.1f} | {med['cudnn']['bench']:.1f} |")
            print(row, flush=True)
            table.append(row)
        del q, k, v, out, qt, kt, vt, out_c
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; {args.rounds} rounds, medians (min-max)")
    print("| call | host us, runner off | host us, runner on | host us, cuDNN | do_bench us, off | do_bench us, on | "
          "do_bench us, cuDNN |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(table))


if __name__ == "__main__":
    main()
