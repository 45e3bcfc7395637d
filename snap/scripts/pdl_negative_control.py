"""Negative control for tests/test_kvcache.py::test_pdl_chain_reads_the_previous_output (GPU, sm90+).

Compiles the decode kernel with `gdc_wait` replaced by a no-op (so a PDL launch may read q before
the previous call has written it) and runs the same chain of calls, each call's q being the
previous call's output, eagerly and from a CUDA graph with NaN-poisoned outputs. Prints how many
chained outputs differ from the chain without PDL. If the count is zero, the test cannot see a
missing wait on this GPU; if it is not, the test's check does see it.

Usage: PYTHONPATH=. python scripts/pdl_negative_control.py [--trigger 1] [--reps 50]
"""

import argparse

import torch
import triton

from tileflash.ops import decode as dec


@triton.jit
def _no_wait():
    pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trigger", type=int, default=1)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    dec.gdc_wait = _no_wait   # before any compile: every PDL variant of the kernel lacks the wait
    g = torch.Generator().manual_seed(11)
    b, hq, hk, d, n = 2, 8, 2, 128, 4096
    q0 = torch.randn(b, 1, hq, d, generator=g).cuda().to(torch.bfloat16)
    kc = torch.randn(b, n, hk, d, generator=g).cuda().to(torch.bfloat16)
    vc = torch.randn(b, n, hk, d, generator=g).cuda().to(torch.bfloat16)

    def chain(pdl, q, splits):
        outs = []
        for _ in range(6):
            q = dec.decode_forward(q, kc, vc, None, d ** -0.5, False, num_splits=splits, max_seqlen_k=n,
                                   config={**dec.decode_config(d), "pdl": pdl})[0]
            outs.append(q)
        return outs

    for splits in (8, 1):
        want = chain(0, q0, splits)
        torch.cuda.synchronize()
        bad = total = 0
        for _ in range(args.reps):
            got = chain(args.trigger, q0, splits)
            torch.cuda.synchronize()
            bad += sum(not torch.equal(a, w) for a, w in zip(got, want))
            total += len(got)
        qin = q0.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = chain(args.trigger, qin, splits)
        gbad = gtotal = 0
        for _ in range(args.reps):
            for o in outs:
                o.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            gbad += sum(not torch.equal(a, w) for a, w in zip(outs, want))
            gtotal += len(outs)
        print(f"splits={splits} trigger={args.trigger} without gdc_wait: eager {bad}/{total} chained outputs "
              f"differ, graph {gbad}/{gtotal}", flush=True)


if __name__ == "__main__":
    main()
