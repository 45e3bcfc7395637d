"""Where does the backward's host time go, and does it reach the benchmark's numbers? (GPU only.)

Per shape (fp16, B·N = 16k tokens, H = 2048 / D), for tileflash and cuDNN SDPA:

* ``do_bench``: the backward timed as ``tileflash bench`` times it (events around each
  ``torch.autograd.grad``, the L2 flushed by a memset before each call);
* ``kernels``: the sum of the GPU kernels' durations per call, from ``torch.profiler`` (no host
  share);
* ``host``: host time per call (300 calls, no sync).

If ``do_bench`` exceeds ``kernels`` by much, the GPU idles inside the timed interval, waiting for
the host.  Then, for tileflash, the host time per call of each layer of the call, from the top
(``autograd.grad``) down to each launch, so that the share of each is read by difference.

Usage: PYTHONPATH=. python3 scripts/bwd_host_breakdown.py [D:CAUSAL:N ...]   (default 128:1:1024
128:0:1024 64:0:1024 128:1:4096)
"""

import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash
from tileflash.ops import attention as att
from tileflash.ops import backward as bwd
from tileflash.ops import backward_sm90 as b90

from host_profile import host_us  # scripts/ is on sys.path when a script runs


def kernel_us(fn, n=20):
    """GPU kernel time per call (sum of the kernels' durations), from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0 and e.key != "")
    per = {e.key: e.device_time_total / n for e in prof.key_averages() if e.device_time_total > 0}
    # key_averages' device_time_total counts each kernel once per event; sum the top-level kernels
    total = sum(v for k, v in per.items() if not k.startswith("aten::") and not k.startswith("cuda"))
    return total, per


def main():
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:] if a.count(":") == 2] or \
        [(128, 1, 1024), (128, 0, 1024), (64, 0, 1024), (128, 1, 4096)]
    rows, layers = [], []
    for d, causal, n in shapes:
        causal = bool(causal)
        b, h = 16384 // n, 2048 // d
        fl = 2.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        outs = {
            "tileflash": tileflash.flash_attn_func(*leaves, causal=causal),
        }
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            outs["cudnn"] = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                                           is_causal=causal).transpose(1, 2)
        for name, out in outs.items():
            def full(out=out):
                return torch.autograd.grad(out, leaves, do, retain_graph=True)
            eager = do_bench(full, warmup=25, rep=100, return_mode="median") * 1e3
            kern, per = kernel_us(full)
            host = host_us(full, 300)
            rows.append(f"| D={d} causal={causal} N={n} | {name} | {eager:.0f} ({fl / eager * 1e-6:.0f}) | "
                        f"{kern:.0f} ({fl / kern * 1e-6:.0f}) | {host:.0f} | {eager - kern:+.0f} |")
            print(rows[-1], "\n   kernels:", {k[:60]: round(v, 1) for k, v in per.items()}, flush=True)
        # tileflash's layers, top down
        scale = d ** -0.5
        out, lse = tileflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]
        kw = att._kw(-1, -1, 0.0, None, None, None, 0, 0, 0.0, None)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        delta = bwd._delta(out, do, lse, False, h, d)
        flags = bwd.feature_args(scale, causal, (-1, -1), 0.0, None, b, 0.0, n, n)[0]
        steps = {
            "autograd.grad": lambda: torch.autograd.grad(outs["tileflash"], leaves, do, retain_graph=True),
            "_backward_impl": lambda: att._backward_impl(do, q, k, v, out, lse, scale, causal, 0, kw),
            "flash_attn_backward": lambda: bwd.flash_attn_backward(do, q, k, v, out, lse, scale, causal, 0),
            "supported()": lambda: b90.supported(do, q, k, v, out, lse, scale, causal, 0, flags, False, None,
                                                 dk=dk, dv=dv),
            "_delta (alloc + launch)": lambda: bwd._delta(out, do, lse, False, h, d),
            "dK/dV launch (backward_sm90.backward)": lambda: b90.backward(do, q, k, v, lse, delta, dq, dk, dv,
                                                                         scale, causal),
            "dQ launch (backward_sm90.backward_dq)": lambda: b90.backward_dq(do, q, k, v, lse, delta, dq, scale,
                                                                             causal),
            "4 x torch.empty": lambda: [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v, lse)],
            "torch.cuda.device(q.device) ctx": lambda: torch.cuda.device(q.device).__enter__(),
        }
        for what, fn in steps.items():
            layers.append(f"| D={d} causal={causal} N={n} | {what} | {host_us(fn, 300):.1f} |")
            print(layers[-1], flush=True)
        del q, k, v, do, leaves, outs, out, lse, dq, dk, dv, delta
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; backward, fp16")
    print("| shape | provider | do_bench us (TFLOP/s) | kernels us (TFLOP/s) | host us per call | do_bench - kernels |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| shape | tileflash layer | host us per call |\n|---|---|---|")
    print("\n".join(layers))


if __name__ == "__main__":
    main()
