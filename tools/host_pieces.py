"""Where the host time of one tileflash forward + backward step goes, piece by piece, inside the
real step (CUDA; B=1 N=128 H=16/8 D=128 causal bf16, ``tileflash bench --host``'s shape).

The step is ``flash_attn_func`` then ``torch.autograd.backward`` (as ``bench --host`` times it).
Timing wrappers (two ``perf_counter`` calls each) are put around the pieces of the call path:
the public call and ``torch.autograd.backward`` in the step itself, ``_EagerAttention.forward`` /
``backward``, ``route.replay_forward`` / ``replay_backward``, ``gluon.backward.replay_default``
and its two launches (``_run_dq``, ``_run_dkdv``). Each piece's time is summed per step; what
remains of an enclosing piece is its own work (e.g. ``autograd.backward`` less ``backward``: the
engine and its device thread). Rounds of 200 steps, wrapped and bare steps and SDPA's taking
turns, median of 9 rounds; a wrapper of nothing is timed too (the wrappers' own cost).

After the rounds, the launcher each kept launch took (``DescRunner`` or triton's own runner).

Then a decode step (``flash_attn_with_kvcache``, B=1 L=8k, read-only and with an append) with
``decode.split_scratch`` against its two separate lookups (``split_partials`` then
``ticket_counters``, as before it), rotated in the same way.

    python tools/host_pieces.py
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import tileflash
from tileflash.ops import attention as att
from tileflash.ops import route
from tileflash.ops.gluon import backward as gb

ACC: dict[str, float] = {}


def timed(fn, name):
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            ACC[name] = ACC.get(name, 0.0) + time.perf_counter() - t0
    return wrapper


def main():
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(1, 128, h, 128, device=dev, dtype=dt, requires_grad=True) for h in (16, 8, 8))
    do = torch.randn(1, 128, 16, 128, device=dev, dtype=dt)
    qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dos = do.transpose(1, 2)
    nothing = timed(lambda: None, "wrapper of nothing")

    def bare():
        out = tileflash.flash_attn_func(q, k, v, causal=True)
        torch.autograd.backward(out, do)
        q.grad = k.grad = v.grad = None

    def wrapped():
        t0 = time.perf_counter()
        out = tileflash.flash_attn_func(q, k, v, causal=True)
        t1 = time.perf_counter()
        torch.autograd.backward(out, do)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        ACC["flash_attn_func"] = ACC.get("flash_attn_func", 0.0) + t1 - t0
        ACC["autograd.backward"] = ACC.get("autograd.backward", 0.0) + t2 - t1
        nothing()

    def sdpa():
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        torch.autograd.backward(out, dos)
        qs.grad = ks.grad = vs.grad = None

    patches = [(att._EagerAttention, "forward", "_EagerAttention.forward", True),
               (att._EagerAttention, "backward", "_EagerAttention.backward", True),
               (route, "replay_forward", "route.replay_forward", False),
               (route, "replay_backward", "route.replay_backward", False),
               (gb, "replay_default", "gb.replay_default", False),
               (gb, "_run_dq", "gb._run_dq", False), (gb, "_run_dkdv", "gb._run_dkdv", False)]
    saved = [(obj, attr, obj.__dict__[attr]) for obj, attr, _, _ in patches]

    def patch(on):
        for (obj, attr, name, static), (_, _, orig) in zip(patches, saved):
            fn = orig.__func__ if isinstance(orig, staticmethod) else orig
            new = timed(fn, name) if on else fn
            setattr(obj, attr, staticmethod(new) if static else new)

    calls, rounds = 200, 9
    steps = {"bare": bare, "wrapped": wrapped, "sdpa": sdpa}
    for name, s in steps.items():
        patch(name == "wrapped")
        s()
        s()
    torch.cuda.synchronize()
    times = {n: [] for n in steps}
    pieces: dict[str, list] = {}
    names = list(steps)
    for r in range(rounds):
        for name in names[r % 3:] + names[:r % 3]:
            patch(name == "wrapped")
            ACC.clear()
            t0 = time.perf_counter()
            for _ in range(calls):
                steps[name]()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
            if name == "wrapped":
                for p, t in ACC.items():
                    pieces.setdefault(p, []).append(t / calls * 1e6)
    patch(False)
    runners()
    med = statistics.median
    print(f"{'step':28} {'us per step':>12}")
    for name in names:
        print(f"{name:28} {med(times[name]):12.1f}")
    print(f"\n{'piece (wrapped step)':28} {'us per step':>12}")
    for p, ts in pieces.items():
        print(f"{p:28} {med(ts):12.1f}")
    decode_ab(calls, rounds)
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, triton "
          f"{__import__('triton').__version__}, {rounds} rounds x {calls} steps, median round")


def runners():
    """Which launcher each kept launch of the step took: ``DescRunner`` (TMA descriptors encoded once
    per address) or triton's own runner (descriptors encoded at every launch)."""
    from tileflash import interface
    from tileflash.ops.launch import DescRunner

    for entry in interface._FAST_FWD.values():
        fwd, bwd = entry[0], entry[2]
        kept = [("forward", fwd[1])] if fwd else []
        if bwd and len(bwd[2][1]) == 2:
            kept += [("dQ", bwd[2][1][0]), ("dK/dV", bwd[2][1][1])]
        elif bwd:
            kept += [("fused", bwd[2][1][1])]
        for name, launch in kept:
            runner = launch.runner[1] if launch.runner else None
            print(f"kept launch {name:8} {launch.kernel.fn.__name__:28} runner "
                  f"{type(runner).__name__}{'' if isinstance(runner, DescRunner) else ' (not a DescRunner)'}")


def decode_ab(calls, rounds):
    from tileflash.ops.triton import decode as dec

    dev, dt = "cuda", torch.bfloat16
    kc, vc = (torch.randn(1, 8192, 8, 128, device=dev, dtype=dt) for _ in range(2))
    q = torch.randn(1, 1, 16, 128, device=dev, dtype=dt)
    kn, vn = (torch.randn(1, 1, 8, 128, device=dev, dtype=dt) for _ in range(2))
    lens = torch.full((1,), 8191, dtype=torch.int32, device=dev)
    real = dec.split_scratch

    def separate(n, n_counters, device):
        return dec.split_partials(n, device), dec.ticket_counters(n_counters, device)

    cases = {"decode": lambda: tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True),
             "decode+append": lambda: tileflash.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens,
                                                                        causal=True)}
    print(f"\n{'decode case':16} {'arm':14} {'us per call':>12}")
    for case, fn in cases.items():
        arms = {"split_scratch": real, "two lookups": separate}
        outs = {}
        for arm, impl in arms.items():
            dec.split_scratch = impl
            outs[arm] = fn().clone()
        assert torch.equal(outs["split_scratch"], outs["two lookups"]), "arms differ"
        times = {a: [] for a in arms}
        names = list(arms)
        for r in range(rounds):
            for arm in names[r % 2:] + names[:r % 2]:
                dec.split_scratch = arms[arm]
                fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
                times[arm].append((time.perf_counter() - t0) / calls * 1e6)
        dec.split_scratch = real
        for arm in names:
            print(f"{case:16} {arm:14} {statistics.median(times[arm]):12.1f}")


if __name__ == "__main__":
    main()
