"""Which part of the backward's host work costs more on another thread than on the main one.

autograd runs a CUDA backward on its device thread; ``tools/host_autograd.py`` measured the route's
backward ~40% slower there than back to back on the main thread, and about as slow back to back on
another thread (benchmarks.md, "Host time per call"). This tool times the pieces of a replayed
backward, each back to back, on the main thread and on one long-lived worker thread, rounds
alternating between the two (median of the rounds, us per call): pure Python, one ``torch.empty``,
the current-stream query, a replayed forward, a replayed backward (B=1 N=128 H=16/8 D=128 causal bf16,
the host-cost shape), and the replayed backward with a sync per round only.

    python tools/host_thread.py [--calls 500] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch

from tileflash.ops import route


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, 128, 16, 128, device=dev, dtype=dt)
    k, v = (torch.randn(1, 128, 8, 128, device=dev, dtype=dt) for _ in range(2))
    do = torch.randn_like(q)
    scale = 128 ** -0.5
    out, lse = route.forward(q, k, v, scale, True, 0)
    out, lse = route.forward(q, k, v, scale, True, 0)
    fplan = route.planned_forward(q, k, v, scale, True, 0)
    for _ in range(2):
        route.backward(do, q, k, v, out, lse, scale, True, 0)
    kept = route.planned_backward(do, q, k, v, out, lse, scale, True, 0)
    assert fplan is not None and kept is not None, "no planned forward or kept backward at this shape"
    dev_index = torch.cuda.current_device()

    def python_work():
        s = 0
        for i in range(50):
            s += i
        return s

    pieces = {
        "python (50-step loop)": python_work,
        "torch.empty (1,128,16,128)": lambda: torch.empty(1, 128, 16, 128, dtype=dt, device=dev),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(dev_index),
        "replay_forward": lambda: route.replay_forward(fplan, q, k, v, scale),
        "replay_backward": lambda: route.replay_backward(kept, do, q, k, v, out, lse, scale),
    }

    def round_of(fn):
        t0 = time.perf_counter()
        for _ in range(a.calls):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / a.calls * 1e6

    jobs, results = [], {}
    go, done = threading.Event(), threading.Event()

    def worker():
        torch.cuda.set_device(dev_index)
        while True:
            go.wait()
            go.clear()
            if not jobs:
                return
            fn, name = jobs.pop()
            results.setdefault((name, "thread"), []).append(round_of(fn))
            done.set()

    th = threading.Thread(target=worker, daemon=True)
    th.start()
    for name, fn in pieces.items():
        fn()
        for r in range(a.rounds):
            for where in (("main", "thread") if r % 2 == 0 else ("thread", "main")):
                if where == "main":
                    results.setdefault((name, "main"), []).append(round_of(fn))
                else:
                    jobs.append((fn, name))
                    done.clear()
                    go.set()
                    done.wait()
    go.set()
    th.join()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {a.calls} calls x {a.rounds} rounds, "
          "median round, us per call")
    print("| piece | main thread | other thread | other / main |")
    print("|---|---|---|---|")
    for name in pieces:
        m, t = statistics.median(results[(name, "main")]), statistics.median(results[(name, "thread")])
        print(f"| {name} | {m:.2f} | {t:.2f} | {t / m:.2f} |")


if __name__ == "__main__":
    main()
