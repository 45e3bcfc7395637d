"""Host time per layer of tileflash's call path on CUDA (us per call, back to back, one sync at the
end): the public function, the route below it, the kernel launch alone, and torch's allocation,
at the host-cost shapes of ``tileflash bench --host`` (B=1 N=128 H=16/8 D=128 causal; decode
B=1 L=8k). Tells which layer to make cheaper. Two reference rows: a Python autograd function that
allocates what ours does and launches nothing (the floor under our forward + backward), and SDPA's
forward + backward.

    python tools/host_layers.py
"""

from __future__ import annotations

import time

import torch

import tileflash
from tileflash.ops import route
from tileflash.ops.triton import decode as tr_dec


def per_call(fn, calls=300, repeats=5):
    fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best.append((time.perf_counter() - t0) / calls * 1e6)
    best.sort()
    return best[len(best) // 2]


def main():
    dev, dt = "cuda", torch.bfloat16
    q = torch.randn(1, 128, 16, 128, device=dev, dtype=dt)
    k, v = (torch.randn(1, 128, 8, 128, device=dev, dtype=dt) for _ in range(2))
    scale = 128 ** -0.5
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = route.forward(q, k, v, scale, True, 0)
    do = torch.randn_like(out)
    kc, vc = (torch.randn(1, 8192, 8, 128, device=dev, dtype=dt) for _ in range(2))
    q1 = torch.randn(1, 1, 16, 128, device=dev, dtype=dt)
    k1, v1 = (torch.randn(1, 1, 8, 128, device=dev, dtype=dt) for _ in range(2))
    sl = torch.full((1,), 8191, dtype=torch.int32, device=dev)

    def fwd_bwd():
        o = tileflash.flash_attn_func(qg, kg, vg, causal=True)
        torch.autograd.backward(o, do)
        qg.grad = kg.grad = vg.grad = None

    class Floor(torch.autograd.Function):
        """The least a Python autograd function with our inputs and outputs costs: no checks, no
        kernel, only the output and gradient allocations (the floor under tileflash's fwd + bwd)."""

        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            ctx.set_materialize_grads(False)
            return torch.empty_like(q), torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)

        @staticmethod
        def backward(ctx, dout, dlse):
            q, k, v = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def floor_fwd_bwd():
        o = Floor.apply(qg, kg, vg)[0]
        torch.autograd.backward(o, do)
        qg.grad = kg.grad = vg.grad = None

    qs, ks, vs = (t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v))
    dos = do.transpose(1, 2)

    def sdpa_fwd_bwd():
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)
        torch.autograd.backward(o, dos)
        qs.grad = ks.grad = vs.grad = None

    rows = [
        ("torch.empty x2", lambda: (torch.empty(q.shape, dtype=dt, device=dev),
                                    torch.empty((1, 16, 128), dtype=torch.float32, device=dev))),
        ("flash_attn_func, no grad", lambda: tileflash.flash_attn_func(q, k, v, causal=True)),
        ("route.forward", lambda: route.forward(q, k, v, scale, True, 0)),
        ("flash_attn_func, grad (fwd only)", lambda: tileflash.flash_attn_func(qg, kg, vg, causal=True)),
        ("fwd + bwd", fwd_bwd),
        ("autograd.Function floor fwd + bwd", floor_fwd_bwd),
        ("SDPA fwd + bwd", sdpa_fwd_bwd),
        ("route.backward", lambda: route.backward(do, q, k, v, out, lse, scale, True, 0)),
        ("flash_attn_func q=1 vs 8k keys", lambda: tileflash.flash_attn_func(q1, kc, vc, causal=True)),
        ("with_kvcache read-only", lambda: tileflash.flash_attn_with_kvcache(q1, kc, vc, cache_seqlens=sl,
                                                                             causal=True)),
        ("decode_forward", lambda: tr_dec.decode_forward(q1, kc, vc, sl, scale, True)),
        ("with_kvcache append", lambda: tileflash.flash_attn_with_kvcache(q1, kc, vc, k1, v1, cache_seqlens=sl,
                                                                          causal=True)),
        ("route.kvcache_append", lambda: route.kvcache_append(kc, vc, k1, v1, sl, 0)),
    ]
    print(f"{'layer':36} {'us/call':>8}")
    for name, fn in rows:
        print(f"{name:36} {per_call(fn):8.1f}", flush=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, bf16")


if __name__ == "__main__":
    main()
