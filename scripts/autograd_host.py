"""Host time per ``torch.autograd.grad`` call on CUDA tensors, through nodes of growing weight, to
split the backward's host time between the autograd engine and tileflash (GPU only).

Usage: PYTHONPATH=. python3 scripts/autograd_host.py
"""


import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tileflash
from tileflash.ops import attention as att

from host_profile import host_us  # scripts/ is on sys.path when a script runs


def main():
    b, n, h, d = 16, 1024, 16, 128
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    pre = tuple(torch.empty_like(t) for t in leaves)

    class One(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return q.clone()

        @staticmethod
        def backward(ctx, g):
            return pre

    class Two(torch.autograd.Function):  # two outputs, as tileflash's (out, lse)
        @staticmethod
        def forward(ctx, q, k, v):
            return q.clone(), torch.empty(b, h, n, device="cuda")

        @staticmethod
        def backward(ctx, g, g2):
            return pre

    class TwoNoMat(Two):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.set_materialize_grads(False)
            return q.clone(), torch.empty(b, h, n, device="cuda")

    rows = []

    def row(what, fn):
        rows.append(f"| {what} | {host_us(fn, 300):.1f} |")
        print(rows[-1], flush=True)

    o = (leaves[0] * 2)
    row("mul node (C++), autograd.grad", lambda: torch.autograd.grad(o, leaves[0], do, retain_graph=True))
    o1 = One.apply(*leaves)
    row("Python Function, 1 output, no work", lambda: torch.autograd.grad(o1, leaves, do, retain_graph=True))
    o2 = Two.apply(*leaves)[0]
    row("Python Function, 2 outputs, no work", lambda: torch.autograd.grad(o2, leaves, do, retain_graph=True))
    o3 = TwoNoMat.apply(*leaves)[0]
    row("same, set_materialize_grads(False)", lambda: torch.autograd.grad(o3, leaves, do, retain_graph=True))
    out = tileflash.flash_attn_func(*leaves, causal=True)
    real = att._backward_impl
    att._backward_impl = lambda *a, **kw: pre
    row("tileflash's Function, _backward_impl stubbed", lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
    att._backward_impl = real
    row("tileflash, full", lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
    # the same backward body outside autograd: on this thread, with grad mode off, on another thread,
    # and inside a trivial Function (so on the autograd engine's thread)
    q0, k0, v0 = (t.detach() for t in leaves)
    o0, lse0 = tileflash.flash_attn_func(q0, k0, v0, causal=True, return_attn_probs=True)[:2]
    kw = att._kw(-1, -1, 0.0, None, None, None, 0, 0, 0.0, None)

    def body():
        return real(do, q0, k0, v0, o0, lse0, d ** -0.5, True, 0, kw)
    row("_backward_impl alone, main thread", body)
    with torch.no_grad():
        row("_backward_impl alone, main thread, no_grad", body)
    import threading
    box = []
    th = threading.Thread(target=lambda: box.append(host_us(body, 300)))
    th.start()
    th.join()
    rows.append(f"| _backward_impl alone, another Python thread | {box[0]:.1f} |")
    print(rows[-1], flush=True)

    class Body(One):  # One's forward; the backward runs the body
        @staticmethod
        def backward(ctx, g):
            return body()
    ob = Body.apply(*leaves)
    row("_backward_impl inside a trivial Function", lambda: torch.autograd.grad(ob, leaves, do, retain_graph=True))

    def body_leaves():  # the tensors autograd hands over: the leaves (requiring grad), the graph's out/lse
        return att._backward_impl(do, *leaves, out, lse_graph, d ** -0.5, True, 0, kw)
    lse_graph = tileflash.flash_attn_func(*leaves, causal=True, return_attn_probs=True)[1]
    row("_backward_impl alone on the leaves and the graph's out", body_leaves)
    att._backward_impl = lambda *a, **k: body()
    row("tileflash's Function calling the body on detached tensors",
        lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
    att._backward_impl = real
    row("tileflash, full (again)", lambda: torch.autograd.grad(out, leaves, do, retain_graph=True))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        oc = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in leaves), is_causal=True).transpose(1, 2)
    row("cuDNN SDPA, full", lambda: torch.autograd.grad(oc, leaves, do, retain_graph=True))
    print(f"\n{torch.cuda.get_device_name()} torch {torch.__version__}; B={b} N={n} H={h} D={d} fp16 causal")
    print("| autograd.grad through | host us per call |\n|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
