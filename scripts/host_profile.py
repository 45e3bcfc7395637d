"""Is a small-N cell of the performance grid bound by host time? On the GPU, per shape:

* the public call timed as `tileflash bench` times it (`do_bench`: events around each call, L2
  flushed between calls) and replayed from a CUDA graph (kernels only);
* host time per call (200 calls, no sync), for tileflash and cuDNN SDPA;
* with --cprofile, the top host functions of tileflash's forward call.

With --host-only, only the host time per call (no do_bench, no graph): quick enough to
alternate two trees in separate processes (the machine's host speed drifts within a run).

Usage: PYTHONPATH=. python3 scripts/host_profile.py [--cprofile] [--fwd-only] [--host-only] [D:CAUSAL:N ...]   (default 128:0:1024 64:1:1024
128:0:4096)
"""

import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

import tileflash
from tileflash.bench.bench import _graph_of


def graph_time(fn):
    return do_bench(_graph_of([fn]), warmup=25, rep=100, return_mode="median")


def host_us(fn, n=200, warmup=5):
    """Host time per call in us (n calls after `warmup` calls, no sync inside)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    return dt


def main():
    rows = []
    shapes = [tuple(int(x) for x in a.split(":")) for a in sys.argv[1:] if a.count(":") == 2] or \
        [(128, 0, 1024), (64, 1, 1024), (128, 0, 4096)]
    for d, causal, n in shapes:
        causal = bool(causal)
        b, h = 16384 // n, 2048 // d
        q, k, v = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(3))
        fl = 4 * b * h * n * n * d * (0.5 if causal else 1.0)

        def tf():
            return tileflash.flash_attn_func(q, k, v, causal=causal)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal)
        for name, fn in (("tileflash", tf), ("cudnn", cudnn)):
            if "--host-only" in sys.argv:
                rows.append(f"| fwd D={d} causal={causal} N={n} | {name} | - | - | {host_us(fn):.0f} us |")
                print(rows[-1], flush=True)
                continue
            eager = do_bench(fn, warmup=25, rep=100, return_mode="median")
            graph = graph_time(fn)
            rows.append(f"| fwd D={d} causal={causal} N={n} | {name} | {eager * 1e3:.0f} us ({fl / eager * 1e-9:.0f}) | "
                        f"{graph * 1e3:.0f} us ({fl / graph * 1e-9:.0f}) | {host_us(fn):.0f} us |")
            print(rows[-1], flush=True)
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        do = torch.randn_like(q)
        providers = (("tileflash", lambda: tileflash.flash_attn_func(*leaves, causal=causal)), ("cudnn", None))
        for name, fwd in () if "--fwd-only" in sys.argv else providers:
            if fwd is None:
                def fwd():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves),
                                                              is_causal=causal).transpose(1, 2)
            out = fwd()

            def bwd(out=out):
                return torch.autograd.grad(out, leaves, do, retain_graph=True)
            if "--host-only" in sys.argv:
                rows.append(f"| bwd D={d} causal={causal} N={n} | {name} | - | - | {host_us(bwd):.0f} us |")
                print(rows[-1], flush=True)
                continue
            eager = do_bench(bwd, warmup=25, rep=100, return_mode="median")
            rows.append(f"| bwd D={d} causal={causal} N={n} | {name} | {eager * 1e3:.0f} us ({2.5 * fl / eager * 1e-9:.0f}) "
                        f"| - | {host_us(bwd):.0f} us |")
            print(rows[-1], flush=True)
        del q, k, v, leaves
        torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; time (TFLOP/s)")
    print("| shape | provider | do_bench (as the bench) | CUDA graph replay | host per call |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    if "--cprofile" in sys.argv:
        import cProfile
        import pstats

        q, k, v = (torch.randn(16, 1024, 16, 128, device="cuda", dtype=torch.float16) for _ in range(3))
        for _ in range(20):
            tileflash.flash_attn_func(q, k, v)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            tileflash.flash_attn_func(q, k, v)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
        print("backward (torch.autograd.grad of flash_attn_func), same shape:")
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = tileflash.flash_attn_func(*leaves)
        do = torch.randn_like(out)
        for _ in range(20):
            torch.autograd.grad(out, leaves, do, retain_graph=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(100):
            torch.autograd.grad(out, leaves, do, retain_graph=True)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(35)


if __name__ == "__main__":
    main()
