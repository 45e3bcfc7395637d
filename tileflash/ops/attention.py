"""The torch.library custom ops: one op per direction, dispatched by device, plus autograd.

``tileflash::fwd`` and ``tileflash::bwd`` are the only entry points below the public API:

* CUDA tensors        -> the Triton kernel (``tileflash.ops.forward``);
* CPU tensors with ``TRITON_INTERPRET=1`` set before import -> the same Triton kernel,
  run by Triton's CPU interpreter (how CI tests the kernels);
* other CPU tensors   -> the tiled PyTorch path (``tileflash.cpu``), same algorithm.

Because these are ``torch.library.custom_op`` s with fake (meta) implementations,
``torch.compile(fullgraph=True)`` traces through them without a graph break.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from tileflash import cpu
from tileflash.ops import backward as _bwd
from tileflash.ops import forward as _fwd


# Triton decides interpreter-or-GPU when a kernel is decorated, i.e. at import.
_KERNELS_INTERPRETED = _fwd.interpreting()


def use_triton(t: Tensor) -> bool:
    """Whether the Triton kernels serve tensors on ``t``'s device (see module docstring)."""
    if t.is_cuda:
        return True
    if os.environ.get("TRITON_INTERPRET", "0") != "1":
        return False
    if not _KERNELS_INTERPRETED:
        raise RuntimeError(
            "TRITON_INTERPRET=1 was set after tileflash (and triton) were imported, so the kernels "
            "were built for the GPU. Set TRITON_INTERPRET=1 in the environment before importing "
            "tileflash, or unset it to use the tiled PyTorch CPU path."
        )
    return True


def _interpreter_dtype(t: Tensor) -> torch.dtype:
    # Triton's interpreter computes bf16 loads/stores/dots wrongly (see docs/testing.md):
    # run bf16 in fp32 there and cast the result back.
    return torch.float32 if t.dtype == torch.bfloat16 else t.dtype


@torch.library.custom_op("tileflash::fwd", mutates_args=())
def attention_fwd(
    q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, causal_shift: int
) -> tuple[Tensor, Tensor]:
    """Attention forward. q (b, sq, h, d), k/v (b, sk, hk, d) -> out (b, sq, h, d), lse (b, h, sq) fp32.

    ``causal_shift``: with ``causal``, query i sees key j iff ``j <= i + causal_shift``
    (``seqlen_k - seqlen_q`` is flash-attn's bottom-right alignment, 0 is torch's top-left).
    """
    if use_triton(q):
        if q.is_cuda:
            with torch.cuda.device(q.device):
                return _fwd.flash_attn_forward(q, k, v, softmax_scale, causal, causal_shift)
        dt = _interpreter_dtype(q)
        out, lse = _fwd.flash_attn_forward(q.to(dt), k.to(dt), v.to(dt), softmax_scale, causal, causal_shift)
        return out.to(q.dtype), lse
    return cpu.attention_forward_cpu(q, k, v, softmax_scale, causal, causal_shift=causal_shift)


@attention_fwd.register_fake
def _(q, k, v, softmax_scale, causal, causal_shift):
    batch, seqlen_q, nheads, head_dim = q.shape
    out = q.new_empty((batch, seqlen_q, nheads, head_dim))
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = q.new_empty((batch, nheads, seqlen_q), dtype=lse_dtype)
    return out, lse


@torch.library.custom_op("tileflash::bwd", mutates_args=())
def attention_bwd(
    dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
    softmax_scale: float, causal: bool, causal_shift: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Attention backward by recomputation from (q, k, v, out, lse) -> (dq, dk, dv).

    Deterministic: the Triton path uses no atomics (dK/dV and dQ are separate kernels).
    """
    if use_triton(q):
        if q.is_cuda:
            with torch.cuda.device(q.device):
                return _bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift)
        dt = _interpreter_dtype(q)
        grads = _bwd.flash_attn_backward(*(t.to(dt) for t in (dout, q, k, v, out)), lse, softmax_scale,
                                         causal, causal_shift)
        return tuple(g.to(q.dtype) for g in grads)
    return cpu.attention_backward_cpu(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift=causal_shift)


@attention_bwd.register_fake
def _(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift):
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(k.shape, dtype=k.dtype, device=k.device),
            torch.empty(v.shape, dtype=v.dtype, device=v.device))


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, causal_shift = inputs
    out, lse = output
    # Only q, k, v, out and the LSE are kept: P is recomputed in the backward.
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.softmax_scale = softmax_scale
    ctx.causal = causal
    ctx.causal_shift = causal_shift


def _backward(ctx, dout, dlse):
    # softmax_lse is returned for inspection and has no gradient (as in flash-attn); dlse is ignored.
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_bwd(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.causal_shift)
    return dq, dk, dv, None, None, None


attention_fwd.register_autograd(_backward, setup_context=_setup_context)
