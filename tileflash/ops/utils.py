"""Host-side helpers shared by every kernel family (Triton and Gluon) and by the router: the
numerics constants, launch-grid arithmetic and the one encoding of the attention pattern
(causal / window / softcap / ALiBi / dropout) into kernel flags and scalars.

Nothing here imports triton: the kernels' device helpers live in ``ops/triton/common.py``.
"""

from __future__ import annotations

import torch

# softmax in base 2: scores are scaled by log2(e) once, and the LSE converted back with ln(2)
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def cdiv(a: int, b: int) -> int:
    """Host-side ceil(a / b) for launch arithmetic (``triton.cdiv`` is a JIT function: about 1.5 us
    per host call, and a decode call makes ten of them)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """Host-side ``triton.next_power_of_2`` (0 for 0), without its JIT-call overhead."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


# CUDA's grid: x up to 2**31 - 1 programs, y and z up to 65535
GRID_YZ_MAX = 65535


def block_grid(n_blocks: int, batch_heads: int) -> tuple:
    """The launch grid of a (block, batch·head) kernel and its ``FLAT_GRID`` constexpr: (n_blocks,
    batch_heads) with the blocks fastest, or, where batch·heads exceeds a grid's y limit (65535),
    one flat axis of n_blocks·batch_heads programs in the same order (:func:`block_ids`)."""
    if batch_heads <= GRID_YZ_MAX:
        return (n_blocks, batch_heads), False
    if n_blocks * batch_heads >= 2 ** 31:
        raise ValueError(f"tileflash: {n_blocks} blocks x {batch_heads} batch*heads programs exceed CUDA's grid "
                         f"limit of 2**31 - 1; split the batch into smaller calls")
    return (n_blocks * batch_heads,), True


def strides3(t, varlen: bool):
    """(batch, row, head) strides; varlen tensors are (total, nheads, d) with no batch stride."""
    return (0, t.stride(0), t.stride(1)) if varlen else (t.stride(0), t.stride(1), t.stride(2))


def problem_dims(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k):
    """(varlen, batch, seqlen_q, seqlen_k, lse_shape, lse_strides) of a dense or varlen call.

    Varlen lengths are the maxima (they size the grid); the LSE is (nheads, total_q) there and
    (batch, nheads, seqlen_q) for dense inputs, addressed with (batch, head) strides.
    """
    nheads = q.shape[-2]
    if cu_seqlens_q is not None:
        total_q = q.shape[0]
        return True, cu_seqlens_q.shape[0] - 1, int(max_seqlen_q), int(max_seqlen_k), (nheads, total_q), (0, total_q)
    batch, seqlen_q = q.shape[0], q.shape[1]
    return False, batch, seqlen_q, k.shape[1], (batch, nheads, seqlen_q), (nheads * seqlen_q, seqlen_q)


def rng_strides(seqlen_q: int, seqlen_k: int):
    """Dropout's Philox counter for (batch·head, i, j) is bh·Sq·Sk + i·Sk + j (max lengths)."""
    return seqlen_q * seqlen_k, seqlen_k


def feature_args(softmax_scale, causal, window, softcap, alibi_slopes, batch, dropout_p=0.0,
                 seqlen_q=0, seqlen_k=0):
    """Host-side flags and scalars shared by every launcher (see tileflash.ops.triton.common)."""
    left, right = window
    # |i + shift - j| < seqlen_q + seqlen_k: a wider window is unbounded (and would overflow the
    # block-range arithmetic in the kernels)
    span = seqlen_q + seqlen_k
    left = -1 if left >= span else left
    right = -1 if right >= span else right
    if causal:
        right = 0  # flash-attn: causal means window_size[1] = 0
    alibi_strides = (0, 0)
    if alibi_slopes is not None:
        alibi_strides = (alibi_slopes.stride(0), alibi_slopes.stride(1)) if alibi_slopes.dim() == 2 \
            else (0, alibi_slopes.stride(0))
    flags = dict(HAS_LEFT=left >= 0, HAS_RIGHT=right >= 0, HAS_SOFTCAP=softcap > 0,
                 HAS_ALIBI=alibi_slopes is not None, HAS_DROPOUT=dropout_p > 0)
    scalars = dict(window_left=max(left, 0), window_right=max(right, 0),
                   softcap_scale=softmax_scale / softcap if softcap > 0 else 0.0,
                   softcap2=softcap * LOG2E)
    return flags, scalars, alibi_strides


def apply_rotary(x, cos, sin, pos, interleaved: bool):
    """Rotary embedding of x (batch, seqlen, nheads, d) at integer positions pos (batch, seqlen).

    cos/sin: (seqlen_ro, rotary_dim / 2); the first rotary_dim channels rotate, the rest pass.
    interleaved=True (GPT-J) rotates channel pairs (0, 1), (2, 3), ...; False (GPT-NeoX) rotates
    channel i with channel i + rotary_dim / 2.
    """
    rd = cos.shape[1] * 2
    c = cos[pos].unsqueeze(2).float()  # (batch, seqlen, 1, rd/2)
    s = sin[pos].unsqueeze(2).float()
    xr = x[..., :rd].float()
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rot = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2:]
        rot = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rot.to(x.dtype), x[..., rd:]), dim=-1)


# A write-only fp32 buffer per device (CUDA; the interpreter's CPU too) that takes the LSE of calls whose caller discards it
# (a forward without gradient, a decode step that does not return it): an allocation less per
# call. Its contents are never read, so concurrent calls on several streams writing it at once
# are harmless; every buffer made stays alive (``_KEPT``: at most about twice the largest, as each
# growth at least doubles it), so a kernel still writing an old one on another stream never writes
# memory the allocator handed out again.
LSE_SCRATCH_MAX = 1 << 20  # floats (4 MiB): larger LSEs are allocated per call (their kernels dwarf it)
_LSE_SCRATCH: dict = {}
_KEPT: list = []


def lse_scratch(n: int, device: torch.device):
    """A write-only fp32 tensor of at least n elements on ``device`` for an LSE nobody reads,
    or None where n exceeds ``LSE_SCRATCH_MAX`` or the buffer would have to grow during a CUDA
    graph capture (the caller then allocates its own)."""
    buf = _LSE_SCRATCH.get(device)
    if buf is not None and buf.numel() >= n:
        return buf
    if n > LSE_SCRATCH_MAX or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return None
    buf = torch.empty(max(n, 4096, 2 * (0 if buf is None else buf.numel())), dtype=torch.float32, device=device)
    _KEPT.append(buf)  # (every buffer made, also one that loses a race between threads growing it)
    _LSE_SCRATCH[device] = buf
    return buf
