"""Where the host time of tileflash's forward + backward goes beyond a bare Python autograd
function (CUDA; B=1 N=128 H=16/8 D=128 causal bf16, the host-cost shape).

Variants between the floor and tileflash, timed back to back with one sync per round (the variants
take turns, median of 7 rounds):

* ``floor``: a Python autograd function that allocates our outputs and gradients, no kernel;
* ``floor+save_out``: the same, also saving its output for the backward, as ours does;
* ``floor+kernels``: the floor whose forward and backward call ``route.forward`` and
  ``route.backward`` (our kernels and plans, without the public function and its autograd class);
* ``eager_fn``: our autograd class with the op's arguments prepared (``attention_args``);
* ``tileflash``: ``flash_attn_func``;
* ``sdpa``: ``F.scaled_dot_product_attention``.

Each variant's line also gives the TMA descriptor encodings per step (triton's
``make_tensordesc_arg``, counted: a planned launch encodes only addresses it has not seen) and the
caching allocator's allocations per step. Then the route's own calls timed inside the autograd
step against the same calls back to back on the main thread and on another thread, the device
syncs per step (torch's sync debug mode) and a torch.profiler table of the host side of
tileflash's and SDPA's steps, every thread included.

    python tools/host_autograd.py
"""

from __future__ import annotations

import statistics
import threading
import time
import warnings

import torch
import torch.nn.functional as F

import tileflash
from tileflash.ops import attention as att
from tileflash.ops import route


def _count_encodings():
    """Count triton's TMA descriptor encodings (``make_tensordesc_arg``, which ``DescRunner`` calls
    for an address it has not seen): patched before any launcher is made, so that runners pick the
    counting version up. Returns the one-element counter list."""
    from triton.backends.nvidia import driver as nv_driver

    count = [0]
    real = nv_driver.make_tensordesc_arg

    def counting(arg, metadata):  # (two parameters, as DescRunner.make checks)
        count[0] += 1
        return real(arg, metadata)

    nv_driver.make_tensordesc_arg = counting
    return count


def main():
    encodings = _count_encodings()
    dev, dt = "cuda", torch.bfloat16
    q0 = torch.randn(1, 128, 16, 128, device=dev, dtype=dt)
    k0, v0 = (torch.randn(1, 128, 8, 128, device=dev, dtype=dt) for _ in range(2))
    do = torch.randn_like(q0)
    scale = 128 ** -0.5
    q, k, v = (t.clone().requires_grad_() for t in (q0, k0, v0))
    qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_() for t in (q0, k0, v0))
    dos = do.transpose(1, 2)

    def make(save_out, kernels):
        class Variant(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                if kernels:
                    out, lse = route.forward(q, k, v, scale, True, 0)
                else:
                    out, lse = torch.empty_like(q), torch.empty(1, 16, 128, device=dev)
                ctx.save_for_backward(q, k, v, out, lse) if save_out or kernels else ctx.save_for_backward(q, k, v)
                ctx.set_materialize_grads(False)
                return out, lse

            @staticmethod
            def backward(ctx, dout, dlse):
                saved = ctx.saved_tensors
                if kernels:
                    return route.backward(dout, *saved, scale, True, 0)
                return torch.empty_like(saved[0]), torch.empty_like(saved[1]), torch.empty_like(saved[2])
        return Variant

    args = att.op_args(scale, True, 0)

    def step_of(fn, leaves=(q, k, v), grad=do):
        def step():
            out = fn()
            torch.autograd.backward(out, grad)
            for t in leaves:
                t.grad = None
        return step

    # (each class is made once, not per call: making a class costs time of its own)
    floor, floor_saved, floor_kernels = make(False, False), make(True, False), make(True, True)
    variants = {
        "floor": step_of(lambda: floor.apply(q, k, v)[0]),
        "floor+save_out": step_of(lambda: floor_saved.apply(q, k, v)[0]),
        "floor+kernels": step_of(lambda: floor_kernels.apply(q, k, v)[0]),
        "eager_fn": step_of(lambda: att.attention_args(q, k, v, args)[0]),
        "tileflash": step_of(lambda: tileflash.flash_attn_func(q, k, v, causal=True)),
        "sdpa": step_of(lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True),
                        (qs, ks, vs), dos),
    }
    calls = 200
    for step in variants.values():
        step()
    torch.cuda.synchronize()
    times = {n: [] for n in variants}
    # per step: TMA descriptor encodings (a new tensor address in a cached launch costs one each)
    # and caching-allocator allocations
    per_step = {n: [0, 0] for n in variants}
    for _ in range(7):
        for name, step in variants.items():
            enc0 = encodings[0]
            alloc0 = torch.cuda.memory_stats().get("allocation.all.allocated", 0)
            t0 = time.perf_counter()
            for _ in range(calls):
                step()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
            per_step[name][0] += encodings[0] - enc0
            per_step[name][1] += torch.cuda.memory_stats().get("allocation.all.allocated", 0) - alloc0
    print(f"{'variant':16} {'us/step':>8} {'encodings/step':>15} {'allocations/step':>17}")
    for name, ts in times.items():
        enc, allocs = (x / (7 * calls) for x in per_step[name])
        print(f"{name:16} {statistics.median(ts):8.1f} {enc:15.2f} {allocs:17.2f}")

    # where floor+kernels' extra time goes: the route's calls timed inside the autograd step, then
    # the same calls back to back on the main thread and on another thread (the autograd engine
    # runs a CUDA backward on its own device thread)
    acc = {"fwd": 0.0, "bwd": 0.0}

    def timed(fn, name):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            res = fn(*a, **kw)
            acc[name] += time.perf_counter() - t0
            return res
        return wrapper

    real_fwd, real_bwd = route.forward, route.backward
    route.forward, route.backward = timed(real_fwd, "fwd"), timed(real_bwd, "bwd")
    try:
        step = variants["floor+kernels"]
        inside = {"fwd": [], "bwd": [], "step": []}
        for _ in range(7):
            acc["fwd"] = acc["bwd"] = 0.0
            t0 = time.perf_counter()
            for _ in range(calls):
                step()
            torch.cuda.synchronize()
            inside["step"].append((time.perf_counter() - t0) / calls * 1e6)
            inside["fwd"].append(acc["fwd"] / calls * 1e6)
            inside["bwd"].append(acc["bwd"] / calls * 1e6)
    finally:
        route.forward, route.backward = real_fwd, real_bwd
    qd, kd, vd = (t.detach() for t in (q, k, v))
    out_d, lse_d = route.forward(qd, kd, vd, scale, True, 0)

    def loop(fn, n=calls):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e6

    direct = {"fwd": [], "bwd": [], "bwd_thread": []}
    for _ in range(7):
        direct["fwd"].append(loop(lambda: route.forward(qd, kd, vd, scale, True, 0)))
        direct["bwd"].append(loop(lambda: route.backward(do, qd, kd, vd, out_d, lse_d, scale, True, 0)))
        box = []
        th = threading.Thread(target=lambda: box.append(
            loop(lambda: route.backward(do, qd, kd, vd, out_d, lse_d, scale, True, 0))))
        th.start()
        th.join()
        direct["bwd_thread"].append(box[0])
    med = statistics.median
    print("floor+kernels, us per step (median of 7 rounds): step {:.1f}, route.forward inside {:.1f}, "
          "route.backward inside {:.1f}".format(med(inside["step"]), med(inside["fwd"]), med(inside["bwd"])))
    print("called back to back: route.forward {:.1f}, route.backward {:.1f} (main thread), {:.1f} (another "
          "thread)".format(med(direct["fwd"]), med(direct["bwd"]), med(direct["bwd_thread"])))

    for name in ("tileflash", "sdpa"):
        torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(10):
                variants[name]()
        torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message)]
        print(f"{name}: {len(syncs) / 10:.1f} device syncs per step" + (f" ({syncs[0].message})" if syncs else ""))

    from torch.profiler import ProfilerActivity, profile
    for name in ("tileflash", "sdpa"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                variants[name]()
            torch.cuda.synchronize()
        print(f"== {name}: torch.profiler, 50 steps, host side ==")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")


if __name__ == "__main__":
    main()
