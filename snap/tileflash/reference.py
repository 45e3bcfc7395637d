"""Plain reference implementations used by the tests and the benchmarks.

Two kinds of references live here:

* :func:`attention_ref` -- "eager" PyTorch attention in the flash-attn layout
  ``(batch, seqlen, nheads, headdim)``. It materialises the full score matrix,
  so it is only meant for correctness checks on moderate sizes.
* A small NumPy "teaching" version of the online softmax
  (:func:`online_softmax_merge`, :func:`online_softmax_attention_numpy`) next
  to the textbook two-pass softmax (:func:`two_pass_softmax_attention_numpy`).
  They operate on a single head, 2D arrays ``(seqlen, d)``, and exist to make
  the recurrence used by the kernels easy to read and to test.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

__all__ = [
    "visible_mask",
    "alibi_bias",
    "causal_visible_mask",
    "window_bounds",
    "check_alibi_slopes",
    "attention_ref",
    "online_softmax_merge",
    "online_softmax_attention_numpy",
    "two_pass_softmax_attention_numpy",
]


# ---------------------------------------------------------------------------
# PyTorch reference
# ---------------------------------------------------------------------------


def _shift(seqlen_q: int, seqlen_k: int, causal_shift: Optional[int]) -> int:
    return seqlen_k - seqlen_q if causal_shift is None else int(causal_shift)


def window_bounds(
    causal: bool, window_size: Sequence[int] = (-1, -1)
) -> Tuple[Optional[int], Optional[int]]:
    """Normalise ``(causal, window_size)`` to ``(left, right)``, ``None`` = unbounded.

    As in flash-attn 2, any negative side (``-1`` by convention) is unbounded and
    ``causal=True`` forces ``right = 0``.
    """
    if window_size is None:
        window_size = (-1, -1)
    if len(window_size) != 2:
        raise ValueError(f"window_size must be a pair (left, right), got {window_size!r}")
    left, right = (int(w) for w in window_size)
    left_b = left if left >= 0 else None
    right_b = 0 if causal else (right if right >= 0 else None)
    return left_b, right_b


def visible_mask(
    seqlen_q: int,
    seqlen_k: int,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    causal_shift: Optional[int] = None,
    device=None,
) -> torch.Tensor:
    """Boolean ``(seqlen_q, seqlen_k)`` mask, True where query i may see key j.

    With ``shift = causal_shift`` (default ``seqlen_k - seqlen_q``, flash-attn's
    bottom-right alignment) and ``(left, right) = window_size`` (negative = no
    bound on that side; ``causal`` forces ``right = 0``), query ``i`` sees key
    ``j`` iff ``i + shift - left <= j <= i + shift + right``. Without causal and
    window everything is visible.
    """
    left, right = window_bounds(causal, window_size)
    shift = _shift(seqlen_q, seqlen_k, causal_shift)
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    visible = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left is not None:
        visible &= j >= i + shift - left
    if right is not None:
        visible &= j <= i + shift + right
    return visible


def causal_visible_mask(
    seqlen_q: int, seqlen_k: int, device=None, causal_shift: Optional[int] = None
) -> torch.Tensor:
    """Boolean ``(seqlen_q, seqlen_k)`` mask, True where query i may see key j.

    Query ``i`` sees key ``j`` iff ``j <= i + causal_shift``. The default shift
    ``seqlen_k - seqlen_q`` is the bottom-right alignment (flash-attn >= 2.1);
    then, when ``seqlen_q > seqlen_k``, the first ``seqlen_q - seqlen_k`` query
    rows see no key at all. ``causal_shift=0`` is torch's top-left alignment.
    Same as ``visible_mask(seqlen_q, seqlen_k, causal=True, causal_shift=...)``.
    """
    return visible_mask(seqlen_q, seqlen_k, causal=True, causal_shift=causal_shift, device=device)


def check_alibi_slopes(alibi_slopes: torch.Tensor, batch: int, nheads: int) -> torch.Tensor:
    """Validate ``alibi_slopes`` ``(nheads,)`` or ``(batch, nheads)``; return a
    ``(batch, nheads)`` (broadcast, not copied) view."""
    if not torch.is_tensor(alibi_slopes) or not alibi_slopes.is_floating_point():
        raise ValueError("alibi_slopes must be a floating point tensor")
    if alibi_slopes.shape == (nheads,):
        return alibi_slopes.unsqueeze(0).expand(batch, nheads)
    if alibi_slopes.shape == (batch, nheads):
        return alibi_slopes
    raise ValueError(
        f"alibi_slopes must have shape (nheads,) = ({nheads},) or (batch, nheads) = "
        f"({batch}, {nheads}), got {tuple(alibi_slopes.shape)}"
    )


def alibi_bias(
    alibi_slopes: torch.Tensor,
    batch: int,
    nheads: int,
    seqlen_q: int,
    seqlen_k: int,
    causal_shift: Optional[int] = None,
    dtype: torch.dtype = torch.float32,
    device=None,
) -> torch.Tensor:
    """ALiBi bias ``(batch, nheads, seqlen_q, seqlen_k)``:
    ``-slope[b, h] * |i + shift - j|`` (flash-attn 2's non-causal form, used here
    for causal too; with causal it differs from flash-attn's ``slope * j`` only
    by a per-row constant, so the output is the same but the lse is not)."""
    slopes = check_alibi_slopes(alibi_slopes, batch, nheads).to(device=device, dtype=dtype)
    shift = _shift(seqlen_q, seqlen_k, causal_shift)
    i = torch.arange(seqlen_q, device=device).unsqueeze(1)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    dist = (i + shift - j).abs().to(dtype)
    return -slopes[:, :, None, None] * dist


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    upcast: bool = True,
    *,
    causal_shift: Optional[int] = None,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eager attention in the flash-attn layout.

    Args:
        q: ``(batch, seqlen_q, nheads, headdim)``.
        k, v: ``(batch, seqlen_k, nheads_k, headdim)`` with ``nheads % nheads_k == 0``;
            query head ``h`` uses kv head ``h // (nheads // nheads_k)``.
        softmax_scale: defaults to ``1 / sqrt(headdim)``.
        causal: bottom-right aligned causal mask (see :func:`causal_visible_mask`);
            the same as ``window_size=(left, 0)``.
        upcast: if True compute in float32 (float64 stays float64); if False
            compute everything (matmuls and softmax) in the input dtype -- the
            "same precision eager attention" baseline of flash-attn's error rule.
        causal_shift: keyword only; ``shift`` below (default ``seqlen_k - seqlen_q``).
            With ``causal``, query ``i`` sees key ``j`` iff ``j <= i + shift``.
        window_size: keyword only, ``(left, right)``; query ``i`` sees key ``j``
            iff ``i + shift - left <= j <= i + shift + right``; a negative side
            (``-1``) is unbounded. ``causal`` forces ``right = 0``.
        softcap: keyword only; if ``> 0`` the scaled score ``s`` becomes
            ``softcap * tanh(s / softcap)`` (before the ALiBi bias and the mask).
        alibi_slopes: keyword only, ``(nheads,)`` or ``(batch, nheads)``; adds
            ``-slope[b, h] * |i + shift - j|`` to the (soft-capped) score.

    Returns:
        ``(out, lse)``: ``out`` is ``(batch, seqlen_q, nheads, headdim_v)`` in the
        compute dtype (the caller casts); ``lse`` is ``(batch, nheads, seqlen_q)``
        float32 (float64 for float64 inputs), the natural-log logsumexp of the
        scaled, soft-capped, biased, masked scores. Rows without any visible key
        get ``out == 0`` and ``lse == -inf``. The function is differentiable (no
        NaN gradients on fully masked rows).
    """
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4D (batch, seqlen, nheads, headdim)")
    batch, seqlen_q, nheads, headdim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if nheads % nheads_k != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(headdim)
    softcap = float(softcap or 0.0)
    if softcap < 0:
        raise ValueError(f"softcap must be >= 0 (0 disables it), got {softcap}")

    if upcast:
        compute_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    else:
        compute_dtype = q.dtype
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32

    q, k, v = q.to(compute_dtype), k.to(compute_dtype), v.to(compute_dtype)
    group = nheads // nheads_k
    if group > 1:
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)

    # (batch, nheads, seqlen_q, seqlen_k)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * softmax_scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        scores = scores + alibi_bias(
            alibi_slopes, batch, nheads, seqlen_q, seqlen_k, causal_shift, compute_dtype, q.device
        )
    visible = visible_mask(seqlen_q, seqlen_k, causal, window_size, causal_shift, device=q.device)
    row_has_key = visible.any(dim=-1)  # (seqlen_q,)
    scores = scores.masked_fill(~visible, float("-inf"))
    # Rows with no visible key would give softmax(-inf, ..., -inf) = NaN; feed them
    # zeros instead and zero their output afterwards (torch.where keeps the
    # gradient of the discarded branch at exactly 0, so backward stays NaN-free).
    safe_scores = torch.where(row_has_key[:, None], scores, torch.zeros_like(scores))

    attn = torch.softmax(safe_scores, dim=-1)
    attn = attn * row_has_key[:, None].to(attn.dtype)
    out = torch.einsum("bhqk,bkhd->bqhd", attn, v)

    lse = torch.logsumexp(safe_scores.to(lse_dtype), dim=-1)
    lse = torch.where(row_has_key, lse, torch.full_like(lse, float("-inf")))
    return out, lse


# ---------------------------------------------------------------------------
# NumPy teaching version of the online softmax
# ---------------------------------------------------------------------------


def online_softmax_merge(
    m: np.ndarray,
    l: np.ndarray,
    o: np.ndarray,
    s_block: np.ndarray,
    v_block: np.ndarray,
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Fold one block of keys into the running online-softmax state.

    State per query row (``rows`` rows): the running maximum ``m`` of all
    scores seen so far, the running denominator ``l = sum_j exp(s_j - m)`` and
    the *unnormalised* accumulator ``o = sum_j exp(s_j - m) v_j`` (shape
    ``(rows, d)``). The new block brings scores ``s_block`` ``(rows, n)`` and
    values ``v_block`` ``(n, d)``.

    Recurrence::

        m_new = max(m_old, rowmax(s))
        alpha = exp(m_old - m_new)                 # rescales the old state
        p     = exp(s - m_new)                     # (rows, n), entries in [0, 1]
        l_new = alpha * l_old + rowsum(p)
        o_new = alpha * o_old + p @ v

    Why the end result is exact. Claim: after processing blocks ``1..t``
    (all keys ``j`` in a set ``J_t``) the state satisfies

        m_t = max_{j in J_t} s_j,
        l_t = sum_{j in J_t} exp(s_j - m_t),
        o_t = sum_{j in J_t} exp(s_j - m_t) v_j.

    Base case: the empty state ``m_0 = -inf, l_0 = 0, o_0 = 0`` satisfies it
    (empty sums are 0, the max of nothing is -inf). Induction step: with
    ``m_{t+1} = max(m_t, rowmax(s))``, multiplying every old term
    ``exp(s_j - m_t)`` by ``alpha = exp(m_t - m_{t+1})`` gives
    ``exp(s_j - m_{t+1})``, i.e. the old sums re-expressed relative to the new
    maximum; adding the new block's terms ``exp(s_j - m_{t+1})`` completes
    the sums over ``J_{t+1}``. So after the last block

        o / l = sum_j exp(s_j - m) v_j / sum_j exp(s_j - m) = softmax(s) @ v,

    because the common factor ``exp(-m)`` cancels -- exactly what the two-pass
    algorithm computes (its ``m`` is the global max, ours is too). The
    logsumexp is ``m + log(l)``. Since every exponent is ``<= 0`` nothing
    overflows, just like the two-pass version.

    ``-inf`` handling. At the start ``m_old = -inf``; if the block is also
    entirely ``-inf`` for a row (fully masked), ``m_new = -inf`` and the
    naive ``m_old - m_new`` / ``s - m_new`` would be ``-inf - (-inf) = NaN``.
    We therefore subtract a *finite* stand-in ``m_safe`` (0 where ``m_new`` is
    ``-inf``): then ``alpha = exp(-inf - 0) = 0`` and ``p = exp(-inf - 0) = 0``,
    so the row's state stays ``(-inf, 0, 0)``. Where ``m_new`` is finite,
    ``m_safe == m_new`` and nothing changes. A row that never sees a finite
    score ends with ``l == 0``; the finisher maps it to output 0.

    Returns ``(m_new, l_new, o_new)``; the inputs are not modified.
    """
    s_block = np.asarray(s_block)
    v_block = np.asarray(v_block)
    if s_block.shape[1] == 0:
        return m.copy(), l.copy(), o.copy()
    m_new = np.maximum(m, s_block.max(axis=1))
    m_safe = np.where(np.isneginf(m_new), 0.0, m_new)
    alpha = np.exp(m - m_safe)
    p = np.exp(s_block - m_safe[:, None])
    l_new = alpha * l + p.sum(axis=1)
    o_new = alpha[:, None] * o + p @ v_block
    return m_new, l_new, o_new


def _scores_numpy(q, k, softmax_scale, mask):
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[1])
    s = (q @ k.T) * softmax_scale
    if mask is not None:
        s = np.where(np.asarray(mask, dtype=bool), s, -np.inf)
    return s


def online_softmax_attention_numpy(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    block_n: int,
    softmax_scale: Optional[float] = None,
    mask: Optional[np.ndarray] = None,
    return_lse: bool = False,
):
    """Single-head attention, keys processed ``block_n`` at a time.

    ``q`` ``(seqlen_q, d)``, ``k`` ``(seqlen_k, d)``, ``v`` ``(seqlen_k, dv)``.
    ``mask`` (optional, bool ``(seqlen_q, seqlen_k)``): False entries get score
    ``-inf``. For readability the scores of a block are sliced out of the full
    score matrix; the kernels compute them block by block instead. Rows with no
    visible key give output 0 (and lse ``-inf``).
    """
    if block_n < 1:
        raise ValueError("block_n must be >= 1")
    s = _scores_numpy(q, k, softmax_scale, mask)
    v = np.asarray(v, dtype=np.float64)
    rows, dv = s.shape[0], v.shape[1]
    m = np.full(rows, -np.inf)
    l = np.zeros(rows)
    o = np.zeros((rows, dv))
    for start in range(0, s.shape[1], block_n):
        stop = start + block_n
        m, l, o = online_softmax_merge(m, l, o, s[:, start:stop], v[start:stop])
    has_key = l > 0
    out = np.where(has_key[:, None], o / np.where(has_key, l, 1.0)[:, None], 0.0)
    if return_lse:
        lse = np.where(has_key, m + np.log(np.where(has_key, l, 1.0)), -np.inf)
        return out, lse
    return out


def two_pass_softmax_attention_numpy(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    softmax_scale: Optional[float] = None,
    mask: Optional[np.ndarray] = None,
    return_lse: bool = False,
):
    """Textbook attention: pass 1 gets the row max and the row sum, pass 2 normalises.

    Same arguments and output as :func:`online_softmax_attention_numpy`.
    """
    s = _scores_numpy(q, k, softmax_scale, mask)
    v = np.asarray(v, dtype=np.float64)
    # pass 1: row max and denominator
    m = s.max(axis=1) if s.shape[1] else np.full(s.shape[0], -np.inf)
    has_key = np.isfinite(m)
    m_safe = np.where(has_key, m, 0.0)
    e = np.exp(s - m_safe[:, None])
    l = e.sum(axis=1)
    # pass 2: normalise and weight the values
    p = e / np.where(has_key, l, 1.0)[:, None]
    out = p @ v
    if return_lse:
        lse = np.where(has_key, m_safe + np.log(np.where(has_key, l, 1.0)), -np.inf)
        return out, lse
    return out
