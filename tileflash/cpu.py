"""Tiled PyTorch attention for the CPU.

This is the fallback used when no CUDA device is available and
``TRITON_INTERPRET`` is not set (with ``TRITON_INTERPRET=1`` the Triton kernels
themselves run on the CPU through the interpreter instead, which is much
slower). It implements the same algorithm as the kernels, just with PyTorch
ops on blocks instead of Triton tiles:

* forward: for a chunk of ``block_m`` queries, stream over chunks of
  ``block_n`` keys/values, keeping an online softmax state (running max ``m``,
  running denominator ``l`` and an unnormalised fp32 accumulator); finish with
  ``acc / l`` and ``lse = m + log(l)``;
* backward: recompute the probabilities of each block from ``q``, ``k`` and
  the saved ``lse`` (``P = exp(S - lse)``), never storing them.

Memory is O(N * block) (plus the O(N * d) inputs/outputs/gradients); a
``(seqlen_q, seqlen_k)`` matrix is never materialised. Layout is flash-attn's:
``q`` ``(batch, seqlen_q, nheads, headdim)``, ``k``/``v``
``(batch, seqlen_k, nheads_k, headdim)``. GQA/MQA is handled by viewing the
query heads as ``(nheads_k, group)`` and folding the group into the rows of
each block, so k/v are never repeated in memory. Causal masking is bottom-right
aligned: query ``i`` sees key ``j`` iff ``j <= i + seqlen_k - seqlen_q``.

flash-attn 2's extras are supported with its semantics (``shift`` is
``causal_shift``, default ``seqlen_k - seqlen_q``):

* ``window_size=(left, right)``: query ``i`` sees key ``j`` iff
  ``i + shift - left <= j <= i + shift + right`` (a negative side is
  unbounded; ``causal`` forces ``right = 0``). Key chunks entirely outside a
  query chunk's window are skipped, so the cost grows with the window, not
  with ``seqlen_k``;
* ``softcap > 0``: the scaled score ``s`` becomes ``softcap * tanh(s / softcap)``
  (the backward multiplies ``dS`` by ``1 - tanh^2``);
* ``alibi_slopes`` ``(nheads,)`` or ``(batch, nheads)``: adds
  ``-slope[b, h] * |i + shift - j|`` after the softcap (no gradient).

Computation is in float32 for fp16/bf16/fp32 inputs and in float64 for
float64 inputs (so ``torch.autograd.gradcheck`` can be used). One exception:
for fp32 inputs the backward recomputes the scores S in float32, exactly as
the forward did, and does everything after (P, dP, dS and the three gradient
matmuls) in float64. With all of it in float32, dK/dV errors reached 3.2x
those of eager fp32 autograd (MQA, causal, on one of two CPUs tried); this
way they are at eager's level, for 2.3-2.5x the time of the fp32 backward (causal,
B=1, H=4, D=64, N=1k/2k, median of 5, on the 2-core CI-class VM, 2026-11-29).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from tileflash.reference import check_alibi_slopes, window_bounds

__all__ = ["attention_forward_cpu", "attention_backward_cpu"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _gradient_dtype(dtype: torch.dtype) -> torch.dtype:
    """The backward's dtype after S (see the module docstring)."""
    return torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Tuple[int, ...]:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be 4D (batch, seqlen, nheads, headdim)")
    batch, seqlen_q, nheads, headdim = q.shape
    if k.shape[0] != batch or v.shape[0] != batch:
        raise ValueError("batch size mismatch between q, k, v")
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if v.shape[1] != seqlen_k or v.shape[2] != nheads_k:
        raise ValueError("k and v must have the same (batch, seqlen_k, nheads_k)")
    if k.shape[3] != headdim:
        raise ValueError("q and k must have the same head dimension")
    if nheads_k == 0 or nheads % nheads_k != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_k ({nheads_k})")
    return batch, seqlen_q, nheads, headdim, seqlen_k, nheads_k, v.shape[3]


def _grouped(x: torch.Tensor, nheads_k: int) -> torch.Tensor:
    """``(B, S, H, D)`` -> view ``(B, Hk, G, S, D)`` (no copy, any strides)."""
    return x.unflatten(2, (nheads_k, x.shape[2] // nheads_k)).permute(0, 2, 3, 1, 4)


def _rows(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Chunk ``(B, Hk, G, m, D)`` -> contiguous ``(B, Hk, G*m, D)`` in ``dtype``."""
    b, hk, g, m, d = x.shape
    return x.to(dtype).reshape(b, hk, g * m, d)


class _ScoreMod:
    """Masking / softcap / ALiBi settings shared by the forward and the backward.

    ``left``/``right`` are the window bounds (``None`` = unbounded) after
    folding in ``causal``; ``slopes`` is ``None`` or ``(B, Hk, G, 1, 1)`` in the
    compute dtype, matching the ``(B, Hk, G*bm, bn)`` block layout.
    """

    def __init__(self, q, seqlen_q, seqlen_k, nheads_k, causal, causal_shift,
                 window_size, softcap, alibi_slopes, cdt):
        batch, _, nheads, _ = q.shape
        self.shift = seqlen_k - seqlen_q if causal_shift is None else int(causal_shift)
        self.left, self.right = window_bounds(causal, window_size)
        self.seqlen_k = seqlen_k
        softcap = float(softcap or 0.0)
        if softcap < 0:
            raise ValueError(f"softcap must be >= 0 (0 disables it), got {softcap}")
        self.softcap = softcap
        self.slopes = None
        if alibi_slopes is not None:
            slopes = check_alibi_slopes(alibi_slopes, batch, nheads)
            self.slopes = slopes.to(device=q.device, dtype=cdt).reshape(
                batch, nheads_k, nheads // nheads_k, 1, 1
            )

    def key_range(self, q_start: int, q_stop: int) -> Tuple[int, int]:
        """Keys ``[lo, hi)`` that some query of ``[q_start, q_stop)`` may see."""
        lo = 0 if self.left is None else max(0, q_start + self.shift - self.left)
        hi = self.seqlen_k if self.right is None else min(self.seqlen_k, q_stop + self.shift + self.right)
        return lo, hi

    def mask(self, q_start: int, q_stop: int, k_start: int, k_stop: int, device) -> Optional[torch.Tensor]:
        """Visibility ``(bm, bn)`` of a (Q chunk, K chunk) pair, or None when
        every key of the chunk is visible to every query of the chunk."""
        left_ok = self.left is None or k_start >= q_stop - 1 + self.shift - self.left
        right_ok = self.right is None or k_stop - 1 <= q_start + self.shift + self.right
        if left_ok and right_ok:
            return None
        rel = self._rel(q_start, q_stop, k_start, k_stop, device)  # j - (i + shift)
        vis = torch.ones(rel.shape, dtype=torch.bool, device=device)
        if self.left is not None:
            vis &= rel >= -self.left
        if self.right is not None:
            vis &= rel <= self.right
        return vis

    def _rel(self, q_start: int, q_stop: int, k_start: int, k_stop: int, device) -> torch.Tensor:
        """``(bm, bn)`` integer ``j - (i + shift)``."""
        qi = torch.arange(q_start, q_stop, device=device)
        kj = torch.arange(k_start, k_stop, device=device)
        return kj[None, :] - (qi[:, None] + self.shift)

    def apply(
        self, s: torch.Tensor, q_start: int, q_stop: int, k_start: int, k_stop: int, want_tanh: bool = False
    ) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Turn the scaled scores ``s`` ``(B, Hk, G*bm, bn)`` (contiguous, used as
        scratch) into the final ones: softcap, ALiBi bias, then ``-inf`` where
        masked. Returns ``(s, t)`` with ``t = tanh(s_scaled / softcap)`` if
        ``want_tanh`` and softcap is on, else ``None``."""
        t = None
        if self.softcap > 0:
            s.div_(self.softcap).tanh_()
            if want_tanh:
                t, s = s, s * self.softcap
            else:
                s.mul_(self.softcap)
        b, hk, rows, bn = s.shape
        bm = q_stop - q_start
        s5 = s.view(b, hk, rows // bm, bm, bn)  # rows are (group, query)
        if self.slopes is not None:
            dist = self._rel(q_start, q_stop, k_start, k_stop, s.device).abs_().to(s.dtype)
            s5.sub_(self.slopes * dist)
        mask = self.mask(q_start, q_stop, k_start, k_stop, s.device)
        if mask is not None:
            s5.masked_fill_(~mask, float("-inf"))
        return s, t


def _mix31(x: torch.Tensor) -> torch.Tensor:
    """One round of a 31-bit integer hash (every product stays below 2**62: no int64 overflow)."""
    m = 0x7FFFFFFF
    x = ((x ^ (x >> 15)) * 0x2C1B3C6D) & m
    x = ((x ^ (x >> 12)) * 0x297A2D39) & m
    return x ^ (x >> 15)


def dropout_keep_cpu(seed: int, b0: int, nheads: int, seqlen_q: int, seqlen_k: int, batch: int,
                     nheads_k: int, group: int, q_start: int, q_stop: int, k_start: int, k_stop: int, p: float,
                     device) -> torch.Tensor:
    """Dropout keep mask of a (Q chunk, K chunk) block, shaped like its scores (B, Hk, G*bm, bn).

    A counter-based hash of (seed, batch, head, i, j), so the backward regenerates the forward's
    mask block by block without storing it. (The Triton kernels use Philox instead: the two paths
    draw different masks, each self-consistent.)
    """
    bm = q_stop - q_start
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1) + b0
    h = (torch.arange(nheads_k, device=device).view(1, -1, 1, 1) * group
         + (torch.arange(group * bm, device=device) // bm).view(1, 1, -1, 1))
    i = (q_start + torch.arange(group * bm, device=device) % bm).view(1, 1, -1, 1)
    j = torch.arange(k_start, k_stop, device=device).view(1, 1, 1, -1)
    idx = ((b * nheads + h) * seqlen_q + i) * seqlen_k + j
    lo, hi = idx & 0x7FFFFFFF, (idx >> 31) & 0x7FFFFFFF
    x = _mix31(lo ^ (seed & 0x7FFFFFFF))
    x = _mix31(x ^ hi ^ ((seed >> 31) & 0x7FFFFFFF))
    x = _mix31(x ^ 0x5BD1E995)
    return (x.to(torch.float64) / 2.0 ** 31) >= p


def attention_forward_cpu(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    block_m: int = 256,
    block_n: int = 256,
    *,
    causal_shift: Optional[int] = None,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    rng_batch_offset: int = 0,
    rng_seqlens: Optional[Tuple[int, int]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Blockwise exact attention forward.

    ``dropout_p > 0`` drops entries of P after the softmax (kept ones scaled by 1/(1-p)) with
    the mask of :func:`dropout_keep_cpu` for ``dropout_seed``; the LSE ignores dropout.
    ``rng_batch_offset`` shifts the batch index of that mask and ``rng_seqlens`` (default: this
    call's lengths) sizes its counter space, so that varlen, which runs one sequence per call,
    gives every sequence its own disjoint counters (max lengths, as in the kernels).

    Returns ``(out, lse)``: ``out`` has ``q``'s dtype and shape
    ``(batch, seqlen_q, nheads, headdim_v)`` (contiguous); ``lse`` is
    ``(batch, nheads, seqlen_q)``, float32 (float64 for float64 inputs), the
    natural-log logsumexp of the scaled scores. Rows that see no key get
    ``out == 0`` and ``lse == -inf``.

    Keyword-only options (flash-attn 2 semantics, see the module docstring):
    ``causal_shift`` is the alignment ``shift`` of the causal mask, the window
    and the ALiBi distance -- with ``causal`` query ``i`` sees key ``j`` iff
    ``j <= i + shift``; the default ``seqlen_k - seqlen_q`` is the bottom-right
    alignment, 0 gives torch's top-left alignment. ``window_size=(left, right)``
    (negative = unbounded; ``causal`` forces ``right = 0``), ``softcap`` (0 =
    off) and ``alibi_slopes`` (``(nheads,)`` or ``(batch, nheads)``). The lse is
    that of the final (soft-capped, biased, masked) scores.
    """
    batch, seqlen_q, nheads, _, seqlen_k, nheads_k, headdim_v = _check_shapes(q, k, v)
    if block_m < 1 or block_n < 1:
        raise ValueError("block_m and block_n must be >= 1")
    group = nheads // nheads_k
    cdt = _compute_dtype(q.dtype)
    device = q.device
    mod = _ScoreMod(q, seqlen_q, seqlen_k, nheads_k, causal, causal_shift, window_size, softcap, alibi_slopes, cdt)
    neg_inf = float("-inf")

    out = torch.empty(batch, seqlen_q, nheads, headdim_v, dtype=q.dtype, device=device)
    lse = torch.empty(batch, nheads, seqlen_q, dtype=cdt, device=device)
    q_g = _grouped(q, nheads_k)  # (B, Hk, G, Sq, D)
    out_g = _grouped(out, nheads_k)  # (B, Hk, G, Sq, Dv), writable view
    lse_g = lse.view(batch, nheads_k, group, seqlen_q)
    k_h = k.permute(0, 2, 1, 3)  # (B, Hk, Sk, D)
    v_h = v.permute(0, 2, 1, 3)

    for q_start in range(0, seqlen_q, block_m):
        q_stop = min(q_start + block_m, seqlen_q)
        bm = q_stop - q_start
        qc = _rows(q_g[:, :, :, q_start:q_stop], cdt)  # (B, Hk, G*bm, D)
        rows = qc.shape[2]
        m_i = torch.full((batch, nheads_k, rows), neg_inf, dtype=cdt, device=device)
        l_i = torch.zeros((batch, nheads_k, rows), dtype=cdt, device=device)
        acc = torch.zeros((batch, nheads_k, rows, headdim_v), dtype=cdt, device=device)

        # Keys [k_lo, k_hi) are the only ones some query of this chunk can see
        # (causal / window); the chunks outside are skipped.
        k_lo, k_hi = mod.key_range(q_start, q_stop)
        for k_start in range(k_lo, k_hi, block_n):
            k_stop = min(k_start + block_n, k_hi)
            kc = k_h[:, :, k_start:k_stop].to(cdt)
            vc = v_h[:, :, k_start:k_stop].to(cdt)
            s = torch.matmul(qc, kc.transpose(-1, -2))
            s.mul_(softmax_scale)
            s, _ = mod.apply(s, q_start, q_stop, k_start, k_stop)
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            # Keep the value we subtract finite: a row whose max is still -inf
            # (nothing visible yet) subtracts 0, so exp(-inf - 0) = 0, not NaN.
            m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m_i - m_safe)
            p = torch.exp(s.sub_(m_safe.unsqueeze(-1)))
            l_i = l_i * alpha + p.sum(dim=-1)  # the denominator ignores dropout
            acc.mul_(alpha.unsqueeze(-1))
            if dropout_p > 0:
                keep = dropout_keep_cpu(dropout_seed, rng_batch_offset, nheads, *(rng_seqlens or (seqlen_q, seqlen_k)),
                                        batch, nheads_k, group, q_start, q_stop, k_start, k_stop, dropout_p, device)
                p = p.mul_(keep).mul_(1.0 / (1.0 - dropout_p))
            acc.add_(torch.matmul(p, vc))
            m_i = m_new

        has_key = l_i > 0
        l_safe = torch.where(has_key, l_i, torch.ones_like(l_i))
        o = acc / l_safe.unsqueeze(-1)  # rows without keys have acc == 0 -> 0
        lse_c = torch.where(has_key, m_i + torch.log(l_safe), torch.full_like(l_i, neg_inf))
        out_g[:, :, :, q_start:q_stop] = o.view(batch, nheads_k, group, bm, headdim_v)
        lse_g[:, :, :, q_start:q_stop] = lse_c.view(batch, nheads_k, group, bm)

    return out, lse


def attention_backward_cpu(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    softmax_scale: float,
    causal: bool,
    block_m: int = 256,
    block_n: int = 256,
    *,
    causal_shift: Optional[int] = None,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    dropout_seed: int = 0,
    rng_batch_offset: int = 0,
    rng_seqlens: Optional[Tuple[int, int]] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blockwise attention backward using the saved ``lse``.

    With ``S = scale * Q K^T`` (masked), ``P = exp(S - lse)`` (0 where masked
    or where ``lse == -inf``) and ``delta = rowsum(dO * O)``::

        dV = P^T dO,   dP = dO V^T,   dS = P * (dP - delta),
        dQ = scale * dS K,   dK = scale * dS^T Q.

    For GQA the contributions of all query heads of a group are summed into
    their shared kv head (folded into the block matmuls, no repeated K/V).
    ``lse`` may be longer than ``seqlen_q`` in its last dim (padding is
    ignored). ``causal_shift``, ``window_size``, ``softcap`` and
    ``alibi_slopes`` must be the ones used in the forward. With softcap the
    probabilities are recomputed from the capped scores and, with
    ``t = tanh(scale * q.k / softcap)``, ``dS`` is multiplied by ``1 - t^2``
    before the ``dQ``/``dK`` matmuls; ALiBi has no gradient. Returns
    contiguous ``(dq, dk, dv)`` in the dtypes/shapes of ``q``, ``k``, ``v``.
    """
    batch, seqlen_q, nheads, headdim, seqlen_k, nheads_k, headdim_v = _check_shapes(q, k, v)
    if block_m < 1 or block_n < 1:
        raise ValueError("block_m and block_n must be >= 1")
    if dout.shape != (batch, seqlen_q, nheads, headdim_v) or out.shape != dout.shape:
        raise ValueError("dout and out must have shape (batch, seqlen_q, nheads, headdim_v)")
    group = nheads // nheads_k
    cdt = _compute_dtype(q.dtype)
    device = q.device
    mod = _ScoreMod(q, seqlen_q, seqlen_k, nheads_k, causal, causal_shift, window_size, softcap, alibi_slopes, cdt)

    q_g, do_g, o_g = _grouped(q, nheads_k), _grouped(dout, nheads_k), _grouped(out, nheads_k)
    gdt = _gradient_dtype(q.dtype)  # P, dP, dS and the gradients
    lse_g = lse[..., :seqlen_q].to(gdt).reshape(batch, nheads_k, group, seqlen_q)
    k_h = k.permute(0, 2, 1, 3)
    v_h = v.permute(0, 2, 1, 3)

    # Accumulators in the compute dtype, O(N * d).
    dq = torch.zeros(batch, nheads_k, group, seqlen_q, headdim, dtype=gdt, device=device)
    dk = torch.zeros(batch, nheads_k, seqlen_k, headdim, dtype=gdt, device=device)
    dv = torch.zeros(batch, nheads_k, seqlen_k, headdim_v, dtype=gdt, device=device)

    for q_start in range(0, seqlen_q, block_m):
        q_stop = min(q_start + block_m, seqlen_q)
        bm = q_stop - q_start
        k_lo, k_hi = mod.key_range(q_start, q_stop)
        if k_lo >= k_hi:
            continue  # no query of this chunk sees any key: all gradients are 0
        qc = _rows(q_g[:, :, :, q_start:q_stop], cdt)  # (B, Hk, G*bm, D)
        qg = qc.to(gdt)
        doc = _rows(do_g[:, :, :, q_start:q_stop], gdt)  # (B, Hk, G*bm, Dv)
        oc = _rows(o_g[:, :, :, q_start:q_stop], gdt)
        delta = (doc * oc).sum(dim=-1)  # (B, Hk, G*bm)
        lse_c = lse_g[:, :, :, q_start:q_stop].reshape(batch, nheads_k, group * bm)
        # lse == -inf means the row sees nothing: subtract +inf so P = exp(-inf) = 0.
        lse_c = torch.where(torch.isneginf(lse_c), torch.full_like(lse_c, float("inf")), lse_c)
        lse_c = lse_c.unsqueeze(-1)
        dqc = torch.zeros_like(qg)

        for k_start in range(k_lo, k_hi, block_n):
            k_stop = min(k_start + block_n, k_hi)
            kc = k_h[:, :, k_start:k_stop].to(cdt)
            vc = v_h[:, :, k_start:k_stop].to(gdt)
            s = torch.matmul(qc, kc.transpose(-1, -2))  # in the forward's dtype, as the forward did
            s.mul_(softmax_scale)
            # masked entries are -inf, so P = exp(-inf - lse) = 0 there
            s, t = mod.apply(s, q_start, q_stop, k_start, k_stop, want_tanh=True)
            s, t = s.to(gdt), (t.to(gdt) if t is not None else None)
            kc = kc.to(gdt)
            p = torch.exp(s.sub_(lse_c))
            dp = torch.matmul(doc, vc.transpose(-1, -2))
            if dropout_p > 0:
                # the forward's mask Z = keep / (1 - p): dV = (P∘Z)^T dO, dP = (dO V^T)∘Z
                z = dropout_keep_cpu(dropout_seed, rng_batch_offset, nheads, *(rng_seqlens or (seqlen_q, seqlen_k)),
                                     batch, nheads_k, group, q_start, q_stop, k_start, k_stop, dropout_p,
                                     device).to(gdt)
                z.mul_(1.0 / (1.0 - dropout_p))
                dv[:, :, k_start:k_stop].add_(torch.matmul((p * z).transpose(-1, -2), doc))
                dp.mul_(z)
            else:
                # dV_j += P^T dO (sums over the rows, i.e. over queries and group heads)
                dv[:, :, k_start:k_stop].add_(torch.matmul(p.transpose(-1, -2), doc))
            ds = p.mul_(dp.sub_(delta.unsqueeze(-1)))  # reuse p's storage
            if t is not None:  # through softcap * tanh(x / softcap): factor 1 - t^2
                ds.mul_(t.square_().neg_().add_(1.0))
            dqc.add_(torch.matmul(ds, kc), alpha=softmax_scale)
            dk[:, :, k_start:k_stop].add_(torch.matmul(ds.transpose(-1, -2), qg), alpha=softmax_scale)

        dq[:, :, :, q_start:q_stop] = dqc.view(batch, nheads_k, group, bm, headdim)

    dq_out = dq.permute(0, 3, 1, 2, 4).reshape(batch, seqlen_q, nheads, headdim)
    dk_out = dk.permute(0, 2, 1, 3)
    dv_out = dv.permute(0, 2, 1, 3)
    return (
        dq_out.to(q.dtype).contiguous(),
        dk_out.to(k.dtype).contiguous(),
        dv_out.to(v.dtype).contiguous(),
    )


# ----------------------------------------------------------------------------------------------
# Glue for the custom ops (``tileflash.ops.route``): varlen one sequence at a time, dropout's
# counters, and KV-cache decoding over gathered cache rows.
# ----------------------------------------------------------------------------------------------

def _dropout_kw(kw, b0=0):
    if kw["dropout_p"] <= 0:
        return {}
    rng = dict(dropout_p=kw["dropout_p"], dropout_seed=int(kw["seed"].item()), rng_batch_offset=b0)
    if kw["cu_seqlens_q"] is not None:
        rng["rng_seqlens"] = (kw["max_seqlen_q"], kw["max_seqlen_k"])  # disjoint counters per sequence
    return rng


def _sequences(cu_seqlens_q, cu_seqlens_k, alibi_slopes):
    """Per-sequence (index, q rows, k rows, alibi) of a varlen batch, run one sequence at a time."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        slopes = alibi_slopes
        if alibi_slopes is not None and alibi_slopes.dim() == 2:
            slopes = alibi_slopes[b]
        yield b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1]), slopes


def forward(q, k, v, softmax_scale, causal, causal_shift, kw):
    """The op-level forward on CPU tensors: dense, or varlen (``kw`` holds the feature arguments of
    ``tileflash::fwd``: window, softcap, alibi_slopes, cu_seqlens_q/k, max_seqlen_q/k, dropout_p, seed)."""
    feats = dict(window_size=kw["window"], softcap=kw["softcap"])
    if kw["cu_seqlens_q"] is None:
        return attention_forward_cpu(q, k, v, softmax_scale, causal, causal_shift=causal_shift,
                                     alibi_slopes=kw["alibi_slopes"], **feats, **_dropout_kw(kw))
    out = torch.zeros_like(q)
    lse_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=lse_dtype)
    for b, sq, sk, slopes in _sequences(kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["alibi_slopes"]):
        o, l_ = attention_forward_cpu(q[None, sq], k[None, sk], v[None, sk], softmax_scale, causal,
                                      alibi_slopes=slopes, **feats, **_dropout_kw(kw, b))
        out[sq], lse[:, sq] = o[0], l_[0]
    return out, lse


def backward(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, kw):
    """The op-level backward on CPU tensors (arguments as :func:`forward`)."""
    feats = dict(window_size=kw["window"], softcap=kw["softcap"])
    if kw["cu_seqlens_q"] is None:
        return attention_backward_cpu(dout, q, k, v, out, lse, softmax_scale, causal,
                                      causal_shift=causal_shift, alibi_slopes=kw["alibi_slopes"], **feats,
                                      **_dropout_kw(kw))
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b, sq, sk, slopes in _sequences(kw["cu_seqlens_q"], kw["cu_seqlens_k"], kw["alibi_slopes"]):
        g = attention_backward_cpu(dout[None, sq], q[None, sq], k[None, sk], v[None, sk], out[None, sq],
                                   lse[None, :, sq], softmax_scale, causal, alibi_slopes=slopes, **feats,
                                   **_dropout_kw(kw, b))
        dq[sq], dk[sk], dv[sk] = g[0][0], g[1][0], g[2][0]
    return dq, dk, dv


def gather_cache(cache, b, n, cache_batch_idx=None, block_table=None):
    """The first n rows of batch entry b's cache as (1, n, nheads_k, d)."""
    if block_table is None:
        cb = int(cache_batch_idx[b]) if cache_batch_idx is not None else b
        return cache[cb: cb + 1, :n]
    ps = cache.shape[1]
    pages = block_table[b, : -(-n // ps)].long()
    return cache[pages].reshape(-1, *cache.shape[2:])[:n][None]


def kvcache_forward(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap, alibi_slopes,
                    cache_batch_idx, block_table, max_seqlen_k, cache_leftpad, seqlen_add=0):
    """Attention over a contiguous or paged KV cache on the CPU: one batch entry at a time over its
    gathered cache rows (arguments as ``tileflash.ops.attention.kvcache_forward``). The output is
    contiguous whatever q's strides, as the CUDA decode path and the op's fake output are."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    lengths = ([n + seqlen_add for n in seqlens_k.tolist()] if seqlens_k is not None
               else [max_seqlen_k] * q.shape[0])
    firsts = cache_leftpad.tolist() if cache_leftpad is not None else [0] * q.shape[0]
    for b, n in enumerate(lengths):
        # keys [first, n): bottom-right alignment and relative distances only depend on the end
        first = min(max(firsts[b], 0), n)
        kb = gather_cache(k_cache, b, n, cache_batch_idx, block_table)[:, first:]
        vb = gather_cache(v_cache, b, n, cache_batch_idx, block_table)[:, first:]
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, l_ = attention_forward_cpu(q[b: b + 1], kb, vb, softmax_scale, causal, window_size=window,
                                      softcap=softcap, alibi_slopes=slopes)
        out[b], lse[b] = o[0], l_[0]
    return out, lse


def append_kv(k_cache, v_cache, k, v, seqlens, seqlen_fixed, cache_batch_idx=None, block_table=None):
    """The KV-cache append with PyTorch indexing (CPU tensors, whose values
    ``flash_attn_with_kvcache`` has checked): k/v (batch, seqlen_new, nheads_k, d) go to positions
    seqlens[b] + t (seqlen_fixed + t when seqlens is None) of each row's cache, in place."""
    batch, seqlen_new = k.shape[:2]
    dev = k.device
    start = seqlens.long() if seqlens is not None else torch.full((batch,), seqlen_fixed, dtype=torch.long,
                                                                  device=dev)
    pos = start[:, None] + torch.arange(seqlen_new, device=dev)[None, :]        # (batch, seqlen_new)
    if block_table is not None:
        ps = k_cache.shape[1]
        rows = (torch.gather(block_table.long(), 1, pos // ps), pos % ps)
    else:
        cb = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(batch, device=dev)
        rows = (cb[:, None].expand_as(pos), pos)
    with torch.no_grad():
        k_cache[rows] = k
        v_cache[rows] = v
