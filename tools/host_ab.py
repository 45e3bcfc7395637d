"""Host time per call with a boolean debug switch (``tileflash.options.Debug``) on and off, in one
process, beside SDPA's default backend: ``tileflash bench --host``'s cases (B=1 N=128 H=16/8 D=128
causal bf16 ``flash_attn_func``, forward and forward + backward; ``flash_attn_with_kvcache`` at
B=1 L=8k, read-only and with an append). Per case the arms take turns within every round,
starting one later each round (a drift of the host's speed touches each alike); each arm's median
round is printed, with its ratio to the switch-off arm and to SDPA.

    python tools/host_ab.py [--switch ptr_ints] [--calls 200] [--repeats 9] [--cases fwd,fwd+bwd,...]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import tileflash
from tileflash.bench import host
from tileflash.options import DEBUG


def _same_bits(switch):
    """Outputs and gradients of repeated (replayed) calls with the switch off and on: bitwise equal,
    or SystemExit (a launch that reads the wrong memory shows here before anything is timed)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 128, h, 128, device="cuda", dtype=torch.bfloat16, generator=g) for h in (16, 8, 8))
    do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
    k_cache = torch.randn(1, 8192, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v_cache = torch.randn_like(k_cache)
    qd = torch.randn(1, 1, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    kn, vn = (torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    seqlens = torch.full((1,), 8000, dtype=torch.int32, device="cuda")
    results = {}
    for on in (False, True):
        setattr(DEBUG, switch, on)
        for _ in range(3):  # (the first call plans; the later ones replay the kept launches)
            qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
            out = tileflash.flash_attn_func(qq, kk, vv, causal=True)
            out.backward(do)
            fwd = tileflash.flash_attn_func(q, k, v, causal=True)
            dec = tileflash.flash_attn_with_kvcache(qd, k_cache, v_cache, cache_seqlens=seqlens, causal=True)
            app = tileflash.flash_attn_with_kvcache(qd, k_cache, v_cache, kn, vn, cache_seqlens=seqlens, causal=True)
            res = (out, qq.grad, kk.grad, vv.grad, fwd, dec, app)
            results.setdefault("first", res)
            for name, a, b in zip(("out", "dq", "dk", "dv", "fwd", "decode", "append"), results["first"], res):
                if not torch.equal(a, b) or a.isnan().any():
                    raise SystemExit(f"{switch}={on}: {name} differs from the first call's")
    print(f"bits: outputs, gradients, decode and append outputs identical over 3 calls with {switch} off and on")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switch", default="ptr_ints")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--cases", default="fwd,fwd+bwd,decode,decode+append")
    a = ap.parse_args()
    if not isinstance(getattr(DEBUG, a.switch), bool):
        raise SystemExit(f"--switch {a.switch}: not a boolean debug switch")
    dt, saved = torch.bfloat16, getattr(DEBUG, a.switch)
    _same_bits(a.switch)
    tf = lambda q, k, v, c: tileflash.flash_attn_func(q, k, v, causal=c)  # noqa: E731
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; switch {a.switch}, {a.calls} calls x "
          f"{a.repeats} rounds, arms rotated; median round")
    print("| case | arm | us per call | us to issue | x off | x SDPA |")
    print("|---|---|---|---|---|---|")
    for case in a.cases.split(","):
        if case.startswith("decode"):
            base = host._decode_case("tileflash", case.endswith("append"), "cuda", dt, 8192)
            sdpa = host._decode_case("sdpa", case.endswith("append"), "cuda", dt, 8192)
        else:
            base = host._dense_case(case, "bshd", tf, "cuda", dt)
            sdpa = host._dense_case(case, "bhsd", host._sdpa("sdpa"), "cuda", dt)

        def arm(on):
            def step():
                setattr(DEBUG, a.switch, on)
                base()
            return step

        steps = {"off": arm(False), "on": arm(True), "sdpa": sdpa}
        for _ in range(3):
            for step in steps.values():
                step()
        torch.cuda.synchronize()
        times = {name: [] for name in steps}
        names = list(steps)
        for r in range(a.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(host._round(steps[name], a.calls, torch.cuda.synchronize))
        setattr(DEBUG, a.switch, saved)
        med = {name: statistics.median(x[0] for x in t) for name, t in times.items()}
        for name, t in times.items():
            issue = statistics.median(x[1] for x in t)
            print(f"| {case} | {name} | {med[name]:.1f} | {issue:.1f} | {med[name] / med['off']:.3f} | "
                  f"{med[name] / med['sdpa']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
