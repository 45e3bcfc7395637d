"""Host time of a forward + backward step with the debug switch ``delta_scratch`` off and on, in one
process (``tileflash bench --host``'s fwd+bwd case: B=1 N=128 H=16/8 D=128 causal bf16 through
``flash_attn_func`` under autograd), beside SDPA's default backend. The arms take turns within every
round (a drift of the host's speed touches each alike); each arm's median round is printed. The
switch changes only where a replayed split backward puts delta (``gluon.backward.replay_default``).

    python tools/host_delta_ab.py [--calls 200] [--repeats 9] [--case fwd+bwd]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import tileflash
from tileflash.bench import host
from tileflash.options import DEBUG


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--case", default="fwd+bwd", choices=["fwd+bwd", "fwd+bwd@2k"])
    a = ap.parse_args()
    dt = torch.bfloat16
    tf = lambda q, k, v, c: tileflash.flash_attn_func(q, k, v, causal=c)  # noqa: E731
    base = host._dense_case(a.case, "bshd", tf, "cuda", dt)

    def arm(switch):
        def step():
            DEBUG.delta_scratch = switch
            base()
        return step

    steps = {"delta_scratch=0": arm(False), "delta_scratch=1": arm(True),
             "sdpa": host._dense_case(a.case, "bhsd", host._sdpa("sdpa"), "cuda", dt)}
    for step in steps.values():
        step()
    torch.cuda.synchronize()
    times = {name: [] for name in steps}
    for r in range(a.repeats):
        names = list(steps)
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(host._round(steps[name], a.calls, torch.cuda.synchronize))
    DEBUG.delta_scratch = False
    sdpa = statistics.median(t[0] for t in times["sdpa"])
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {a.case}, {a.calls} calls x {a.repeats} "
          "rounds, arms rotated; median round")
    print("| arm | us per call | us to issue | x SDPA |")
    print("|---|---|---|---|")
    for name, t in times.items():
        call, issue = statistics.median(x[0] for x in t), statistics.median(x[1] for x in t)
        print(f"| {name} | {call:.1f} | {issue:.1f} | {call / sdpa:.3f} |")


if __name__ == "__main__":
    main()
