"""The registry of attention providers that ``tileflash bench`` measures.

Every provider takes the flash-attn layout, q ``(batch, seqlen, nheads, headdim)`` and k/v
``(batch, seqlen, nheads_k, headdim)``, with ``seqlen_q == seqlen_k`` (so torch's top-left and
flash-attn's bottom-right causal masks agree), and returns out in q's layout. A provider that
cannot run here says why through ``unavailable(device)``; the bench then skips it with that note.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Provider:
    name: str
    fn: Callable  # (q, k, v, causal) -> out
    unavailable: Callable[[str], Optional[str]]  # device -> reason it cannot run, or None


def _tileflash(q, k, v, causal):
    import tileflash

    return tileflash.flash_attn_func(q, k, v, causal=causal)


def _tileflash_deterministic(q, k, v, causal):
    """tileflash with ``deterministic=True``: the bitwise-reproducible backward (the default,
    ``deterministic=False``, may take the fused kernel with unordered dQ sums where faster)."""
    import tileflash

    return tileflash.flash_attn_func(q, k, v, causal=causal, deterministic=True)


def _tileflash_triton(q, k, v, causal):
    """tileflash on its portable Triton kernels only (``Options(backend="triton")``): what GPUs
    other than Hopper run, measured on Hopper."""
    import tileflash

    return tileflash.flash_attn_func(q, k, v, causal=causal, options=tileflash.Options(backend="triton"))


def eager_attention(q, k, v, causal):
    """Standard attention as the textbook writes it: S and P materialised, one kernel per op.

    ``S = (q kᵀ) * scale`` -> (causal: masked_fill) -> ``P = softmax(S)`` -> ``O = P v``, in the
    input dtype. GQA repeats K/V to the query heads (a real eager implementation's cost).
    """
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # (b, h, s, d)
    group = qh.shape[1] // kh.shape[1]
    if group > 1:
        kh, vh = kh.repeat_interleave(group, 1), vh.repeat_interleave(group, 1)
    s = torch.matmul(qh, kh.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n_q, n_k = s.shape[-2], s.shape[-1]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).triu(n_k - n_q + 1)
        s = s.masked_fill(mask, float("-inf"))
    p = s.softmax(dim=-1)
    return torch.matmul(p, vh).transpose(1, 2)


def _sdpa(name):
    def fn(q, k, v, causal):
        with sdpa_backend(name):
            return sdpa_call(q, k, v, causal)

    return fn


def sdpa_call(q, k, v, causal):
    """SDPA on flash-attn-layout tensors with whatever backend is enabled (no context of its own):
    inside ``sdpa_backend(name)``, the per-call cost of an SDPA provider without the cost of
    entering its backend context every call (what a model that sets the backend once pays)."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=causal, enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


_SDPA_BACKENDS = {"sdpa_math": "MATH", "sdpa_efficient": "EFFICIENT_ATTENTION", "sdpa_flash": "FLASH_ATTENTION",
                  "sdpa_cudnn": "CUDNN_ATTENTION"}


def sdpa_backend(name):
    """The context that pins an ``sdpa_*`` provider's backend (``torch.nn.attention.sdpa_kernel``);
    a null context for any other provider name."""
    if name not in _SDPA_BACKENDS:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, _SDPA_BACKENDS[name]))


_FLEX = {}


def _flex(q, k, v, causal):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    if "fn" not in _FLEX:
        # one compiled graph per shape and mask: a sweep over N, causal on and off and fwd/bwd
        # outgrows dynamo's default limit of 8 recompiles, after which flex_attention silently
        # runs unfused (the first H200 bench run's flex rows at causal 8k/16k and in bwd: 7-31 TFLOP/s)
        import torch._dynamo.config as dcfg

        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(dcfg, name):
                setattr(dcfg, name, max(getattr(dcfg, name), 256))
        _FLEX["fn"] = torch.compile(flex_attention, dynamic=False)
    mask = None
    if causal:
        n = q.shape[1]
        key = (n, q.device)
        if key not in _FLEX:
            _FLEX[key] = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, n, n, device=q.device)
        mask = _FLEX[key]
    out = _FLEX["fn"](q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask,
                      enable_gqa=q.shape[2] != k.shape[2])
    return out.transpose(1, 2)


def _flash_attn(q, k, v, causal):
    from flash_attn import flash_attn_func

    return flash_attn_func(q, k, v, causal=causal)


def _fa4(q, k, v, causal):
    """FA4 (flash-attn-4's CuTe-DSL kernels; Hopper and Blackwell): ``flash_attn.cute``."""
    from flash_attn.cute import flash_attn_func

    out = flash_attn_func(q, k, v, causal=causal)
    return out[0] if isinstance(out, tuple) else out


def _always(device):
    return None


def _cuda_only(device):
    return None if device == "cuda" else "runs on CUDA only"


def _flex_ok(device):
    if device != "cuda":
        return "benchmarked on CUDA only (compiled FlexAttention)"
    try:
        import torch.nn.attention.flex_attention  # noqa: F401
    except ImportError:
        return "torch.nn.attention.flex_attention is not in this torch"
    return None


def _flash_attn_ok(device):
    if device != "cuda":
        return "runs on CUDA only"
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "flash-attn is not installed"
    return None


def _fa4_ok(device):
    if device != "cuda":
        return "runs on CUDA only"
    try:
        import flash_attn.cute  # noqa: F401
    except ImportError:
        return "flash-attn-4 (flash_attn.cute) is not installed"
    return None


PROVIDERS = {
    p.name: p
    for p in [
        Provider("tileflash", _tileflash, _always),
        Provider("tileflash_det", _tileflash_deterministic, _always),
        Provider("tileflash_triton", _tileflash_triton, _cuda_only),
        Provider("eager", eager_attention, _always),
        Provider("sdpa_math", _sdpa("sdpa_math"), _always),
        Provider("sdpa_efficient", _sdpa("sdpa_efficient"), _cuda_only),
        Provider("sdpa_flash", _sdpa("sdpa_flash"), _always),
        Provider("sdpa_cudnn", _sdpa("sdpa_cudnn"), _cuda_only),
        Provider("flex", _flex, _flex_ok),
        Provider("flash_attn", _flash_attn, _flash_attn_ok),
        Provider("fa4", _fa4, _fa4_ok),
    ]
}


@contextlib.contextmanager
def tiled_cpu_path():
    """Make tileflash's CPU tensors take the tiled PyTorch path (not the Triton interpreter)."""
    import os

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = old
