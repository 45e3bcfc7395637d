"""GPU time per kernel of a callable, from torch.profiler: shared by the backward's probes
(gluon_bwd_probe.py, dq_delta_ab.py)."""

from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_us(fn, iters=10):
    """Mean GPU time per call of each kernel launched by fn, by kernel name (µs)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = defaultdict(float)
    for ev in prof.key_averages():
        if ev.self_device_time_total > 0:
            out[ev.key] += ev.self_device_time_total / iters
    return dict(out)
