"""Host time of a forward + backward step under the host-time debug switches (``delta_scratch``,
``grad_pack``, ``one_output``: tileflash.options.Debug), each alone and all together, in one process,
beside SDPA's default backend (``tileflash bench --host``'s fwd+bwd case: B=1 N=128 H=16/8 D=128
causal bf16 through ``flash_attn_func`` under autograd; ``--case fwd+bwd@2k`` at N=2048). The arms
take turns within every round (a drift of the host's speed touches each alike); each arm's median
round is printed, and its ratio to the switch-off arm and to SDPA.

    python tools/host_ab.py [--calls 200] [--repeats 9] [--case fwd+bwd]
"""

from __future__ import annotations

import argparse
import statistics

import torch

import tileflash
from tileflash.bench import host
from tileflash.options import DEBUG

SWITCHES = ("delta_scratch", "grad_pack", "one_output")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--case", default="fwd+bwd", choices=["fwd+bwd", "fwd+bwd@2k"])
    a = ap.parse_args()
    dt = torch.bfloat16
    tf = lambda q, k, v, c: tileflash.flash_attn_func(q, k, v, causal=c)  # noqa: E731
    base = host._dense_case(a.case, "bshd", tf, "cuda", dt)
    saved = {name: getattr(DEBUG, name) for name in SWITCHES}

    def arm(on):
        def step():
            for name in SWITCHES:
                setattr(DEBUG, name, name in on)
            base()
        return step

    steps = {"off": arm(())}
    steps.update({name: arm((name,)) for name in SWITCHES})
    steps["all"] = arm(SWITCHES)
    steps["sdpa"] = host._dense_case(a.case, "bhsd", host._sdpa("sdpa"), "cuda", dt)
    for _ in range(3):
        for step in steps.values():
            step()
    torch.cuda.synchronize()
    times = {name: [] for name in steps}
    for r in range(a.repeats):
        names = list(steps)
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(host._round(steps[name], a.calls, torch.cuda.synchronize))
    for name, value in saved.items():
        setattr(DEBUG, name, value)
    med = {name: statistics.median(x[0] for x in t) for name, t in times.items()}
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {a.case}, {a.calls} calls x {a.repeats} "
          "rounds, arms rotated; median round")
    print("| arm | us per call | us to issue | x off | x SDPA |")
    print("|---|---|---|---|---|")
    for name, t in times.items():
        issue = statistics.median(x[1] for x in t)
        print(f"| {name} | {med[name]:.1f} | {issue:.1f} | {med[name] / med['off']:.3f} | "
              f"{med[name] / med['sdpa']:.3f} |")


if __name__ == "__main__":
    main()
