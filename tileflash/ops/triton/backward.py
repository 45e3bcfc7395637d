"""FlashAttention backward in Triton, by recomputation: no N×N matrix is stored.

Only q, k, v, out and the LSE come from the forward. With P = exp(S - lse) recomputed block by
block (the standard FlashAttention-2 derivation and schedule):

    dV = Pᵀ dO          dP = dO Vᵀ          dS = P ∘ (dP − delta),  delta = rowsum(dO ∘ O)
    dQ = scale · dS K   dK = scale · dSᵀ Q

Three steps, no atomics, so the result is bitwise deterministic:

1. delta = rowsum(dO ∘ O) in fp32 per query row.
2. ``_bwd_dkdv``: one program per (K/V block, batch·kv_head); it loops over the query heads of
   its GQA group and over their Q blocks, accumulating dK and dV in registers.
3. ``_bwd_dq``: one program per (Q block, batch·head), looping over the K/V blocks.

By default step 1 is folded into step 3 (``FUSE_DELTA``): the dQ kernel, which loads its rows of
dO anyway, also loads O, computes their delta, uses it and stores it, and runs first; the dK/dV
kernel reads the stored delta after it. Two launches, and dO is read once less.
The debug switch ``dq_delta=0`` (``tileflash.options.DEBUG``) runs step 1 as its own kernel
(``_bwd_preprocess``, one program per (Q block, batch·head)) and then steps 2 and 3.

On Hopper, ``tileflash.ops.route`` runs the Gluon kernels of ``tileflash.ops.gluon.backward``
first where they take the call, and hands this launcher only what they could not take
(``run_dkdv`` / ``run_dq``, with the ``delta`` they computed).

Numerics follow ``tileflash.ops.triton.forward``: scores in base 2 (``qk_scale = scale·log2 e``), the
natural-log LSE is converted on load. A row that saw no key (lse = -inf) and rows past seqlen_q
get lse = +inf here, so their recomputed P is exactly 0 and they contribute nothing.
Rows/columns past the ragged ends are loaded as zeros: a zero key row or zero dO row adds
nothing to any stored gradient, so only the causal diagonal needs an element mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileflash.ops.launch import Launch, addresses
from tileflash.ops.triton.common import (LOG2E_C, block_ids, dropout_keep, head_scalars, kv_block_range,
                                         q_block_range, score_mods, seq_bounds, visible)
from tileflash.ops.triton.forward import _ensure_tma_allocator, block_d_for, interpreting, tma_requested, tma_supported
from tileflash.ops.utils import LOG2E, block_grid, cdiv, feature_args, problem_dims, rng_strides, strides3
from tileflash.options import DEBUG


@triton.jit(do_not_specialize=["seqlen_q"])
def _bwd_preprocess(
    O, DO, DELTA, ZERO,
    stride_ob, stride_om, stride_oh,
    stride_dob, stride_dom, stride_doh,
    nheads, seqlen_q, n_zero, zero_per,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, FLAT_GRID: tl.constexpr = False,
    ZERO_CHUNK: tl.constexpr = 0,
):
    """DELTA = rowsum(dO ∘ O) in fp32 for BLOCK_M rows of one (batch, head). With ``ZERO_CHUNK`` > 0
    it also zeroes ``zero_per`` int32 words of ZERO (the fused backward's fp32 dQ sums and counters,
    ``n_zero`` words in all) at the program's own offset, in ZERO_CHUNK-word stores, as FA4's
    preprocess kernel does: no separate memset launch (``compute_delta``'s ``zero``)."""
    pid_m, pid_bh = block_ids(seqlen_q, BLOCK_M, False, FLAT_GRID)  # grid: common.block_grid
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    o_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                                     # [BLOCK_M]
    o_d = tl.arange(0, BLOCK_D)                                                       # [BLOCK_D]
    m_md = (o_m < seqlen_q)[:, None] & (o_d < HEAD_DIM)[None, :]                       # [BLOCK_M, BLOCK_D]
    p_o = O + off_b * stride_ob + off_h * stride_oh + o_m[:, None].to(tl.int64) * stride_om + o_d[None, :]
    p_do = DO + off_b * stride_dob + off_h * stride_doh + o_m[:, None].to(tl.int64) * stride_dom + o_d[None, :]
    b_o = tl.load(p_o, mask=m_md, other=0.0).to(tl.float32)                           # [BLOCK_M, BLOCK_D]
    b_do = tl.load(p_do, mask=m_md, other=0.0).to(tl.float32)                         # [BLOCK_M, BLOCK_D]
    b_delta = tl.sum(b_o * b_do, 1)                                                   # [BLOCK_M]
    tl.store(DELTA + pid_bh.to(tl.int64) * seqlen_q + o_m, b_delta, mask=o_m < seqlen_q)
    if ZERO_CHUNK > 0:
        z0 = (pid_bh.to(tl.int64) * tl.cdiv(seqlen_q, BLOCK_M) + pid_m) * zero_per  # this program's words
        for i in range(0, zero_per, ZERO_CHUNK):
            o_z = z0 + i + tl.arange(0, ZERO_CHUNK)                                       # [ZERO_CHUNK]
            tl.store(ZERO + o_z, tl.zeros([ZERO_CHUNK], dtype=tl.int32), mask=o_z < n_zero)


@triton.jit
def _load_lse2(LSE, DELTA, row_base, o_m, seqlen_q, LOAD_DELTA: tl.constexpr = True):
    """Base-2 LSE and delta for rows o_m; rows that saw no key or lie past seqlen_q get +inf (P = 0).
    LOAD_DELTA False: delta is not read (returned as zeros; the caller computes it)."""
    m_m = o_m < seqlen_q
    lse = tl.load(LSE + row_base + o_m, mask=m_m, other=float("inf"))                 # [BLOCK]
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * LOG2E_C)
    if LOAD_DELTA:
        delta = tl.load(DELTA + row_base + o_m, mask=m_m, other=0.0)                  # [BLOCK]
    else:
        delta = tl.zeros_like(lse2)
    return lse2, delta


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, b_k, b_v,              # [BLOCK_N, BLOCK_D] fp32 x2, [BLOCK_N, BLOCK_D] x2
    q_base, do_base, LSE, DELTA, row_base, stride_qm, stride_dom,
    o_n, o_d, m_d, lo, hi, seqlen_q, shift, window_left, window_right,
    qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m, dropout_p,
    MASK: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr = False,
):
    """Fold the Q blocks starting in [lo, hi) into dK, dV of one K/V block (transposed form).

    USE_TMA: q_base/do_base are tensor descriptors of this (sequence, head) (seqlen_q, HEAD_DIM);
    the copy engine zero-fills rows past seqlen_q and columns past HEAD_DIM, as the masks do."""
    o_mb = tl.arange(0, BLOCK_M)                                                      # [BLOCK_M]
    for start_m in range(lo, hi, BLOCK_M):
        o_m = start_m + o_mb                                                          # [BLOCK_M]
        if USE_TMA:
            b_qt = tl.trans(q_base.load([tl.cast(start_m, tl.int32), 0]))             # [BLOCK_D, BLOCK_M]
            b_do = do_base.load([tl.cast(start_m, tl.int32), 0])                      # [BLOCK_M, BLOCK_D]
        else:
            m_m = o_m < seqlen_q
            row = tl.cast(start_m, tl.int64)          # int64 row offset; the loop variable stays int32
            p_qt = q_base + row * stride_qm + o_mb[None, :] * stride_qm + o_d[:, None]    # [BLOCK_D, BLOCK_M]
            p_do = do_base + row * stride_dom + o_mb[:, None] * stride_dom + o_d[None, :]  # [BLOCK_M, BLOCK_D]
            b_qt = tl.load(p_qt, mask=m_m[None, :] & m_d[:, None], other=0.0)            # [BLOCK_D, BLOCK_M]
            b_do = tl.load(p_do, mask=m_m[:, None] & m_d[None, :], other=0.0)            # [BLOCK_M, BLOCK_D]
        lse2, delta = _load_lse2(LSE, DELTA, row_base, o_m, seqlen_q)                 # [BLOCK_M] x2
        rel = o_m[None, :] + shift - o_n[:, None]                                     # [BLOCK_N, BLOCK_M] i + shift - j
        b_st, b_tt = score_mods(tl.dot(b_k, b_qt, input_precision=DOT_PRECISION), rel, qk_scale,
                                softcap_scale, softcap2, slope2, HAS_SOFTCAP, HAS_ALIBI)  # [BLOCK_N, BLOCK_M]
        b_pt = tl.math.exp2(b_st - lse2[None, :])                                     # [BLOCK_N, BLOCK_M]
        if MASK:
            b_pt = tl.where(visible(rel, window_left, window_right, HAS_LEFT, HAS_RIGHT), b_pt, 0.0)
        b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=DOT_PRECISION)           # [BLOCK_N, BLOCK_M]
        if HAS_DROPOUT:
            # the forward's mask, regenerated: dV = (P∘Z)ᵀ dO and dP = (dO Vᵀ)∘Z, Z = keep / (1 - p)
            keep = dropout_keep(seed, rng_base, o_m[None, :], o_n[:, None], rng_stride_m, dropout_p)
            dv = tl.dot(tl.where(keep, b_pt / (1.0 - dropout_p), 0.0).to(b_do.dtype), b_do, dv,
                        input_precision=DOT_PRECISION)                                # [BLOCK_N, BLOCK_D]
            b_dpt = tl.where(keep, b_dpt / (1.0 - dropout_p), 0.0)
        else:
            dv = tl.dot(b_pt.to(b_do.dtype), b_do, dv, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_D]
        b_dst = b_pt * (b_dpt - delta[None, :])                                       # [BLOCK_N, BLOCK_M]
        if HAS_SOFTCAP:
            b_dst = b_dst * (1.0 - b_tt * b_tt)  # d softcap·tanh(x·scale/softcap) / d(x·scale)
        dk = tl.dot(b_dst.to(b_qt.dtype), tl.trans(b_qt), dk, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_D]
    return dk, dv


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "causal_shift", "window_left", "window_right",
                             "rng_stride_bh", "rng_stride_m"])
def _bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV, ALIBI, CU_Q, CU_K, SEED,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    stride_lb, stride_lh, stride_ab, stride_ah,
    nheads, nheads_k, seqlen_q, seqlen_k, causal_shift, window_left, window_right, kv_group,
    qk_scale, sm_scale, softcap_scale, softcap2, dropout_p, rng_stride_bh, rng_stride_m,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr = False, FLAT_GRID: tl.constexpr = False,
):
    """dK, dV of one K/V block of one (batch, kv head). USE_TMA (sm90+): the Q and dO blocks of the
    inner loop move through tensor descriptors. Grid: (K blocks, batch*kv heads), or one flat axis
    of both past 65535 batch*kv heads (FLAT_GRID, ``common.block_grid``)."""
    pid_n, pid_bhk = block_ids(seqlen_k, BLOCK_N, False, FLAT_GRID)
    off_b = (pid_bhk // nheads_k).to(tl.int64)
    off_hk = (pid_bhk % nheads_k).to(tl.int64)
    start_n = pid_n * BLOCK_N
    q_start, k_start, seqlen_q, seqlen_k, shift = seq_bounds(
        CU_Q, CU_K, off_b, seqlen_q, seqlen_k, causal_shift, IS_VARLEN)
    if start_n >= seqlen_k:
        return  # varlen: this sequence is shorter than the longest one
    o_nb = tl.arange(0, BLOCK_N)                                                      # [BLOCK_N]
    o_n = start_n + o_nb                                                              # [BLOCK_N]
    o_d = tl.arange(0, BLOCK_D)                                                       # [BLOCK_D]
    m_d = o_d < HEAD_DIM
    m_nd = (o_n < seqlen_k)[:, None] & m_d[None, :]                                   # [BLOCK_N, BLOCK_D]
    row_k = k_start + start_n
    p_k = K + off_b * stride_kb + off_hk * stride_kh + row_k * stride_kn + o_nb[:, None] * stride_kn + o_d[None, :]
    p_v = V + off_b * stride_vb + off_hk * stride_vh + row_k * stride_vn + o_nb[:, None] * stride_vn + o_d[None, :]
    b_k = tl.load(p_k, mask=m_nd, other=0.0)                                          # [BLOCK_N, BLOCK_D]
    b_v = tl.load(p_v, mask=m_nd, other=0.0)                                          # [BLOCK_N, BLOCK_D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)                               # [BLOCK_N, BLOCK_D]
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)                               # [BLOCK_N, BLOCK_D]

    # Q rows outside [lo, hi) see no key of this block and are skipped.
    lo, a, b, hi = q_block_range(start_n, seqlen_q, shift, window_left, window_right,
                                 HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)

    # GQA: dK/dV of kv head hk accumulate over query heads hk*G ... hk*G + G - 1, in registers.
    for g in range(0, kv_group):
        off_h = off_hk * kv_group + g
        rng_base = (off_b * nheads + off_h) * rng_stride_bh
        slope2, seed = head_scalars(ALIBI, SEED, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI, HAS_DROPOUT)
        q_base = Q + off_b * stride_qb + off_h * stride_qh + q_start * stride_qm
        do_base = DO + off_b * stride_dob + off_h * stride_doh + q_start * stride_dom
        if USE_TMA:  # this sequence's rows of query head h
            q_base = tl.make_tensor_descriptor(q_base, shape=[seqlen_q, HEAD_DIM], strides=[stride_qm, 1],
                                               block_shape=[BLOCK_M, BLOCK_D])
            do_base = tl.make_tensor_descriptor(do_base, shape=[seqlen_q, HEAD_DIM], strides=[stride_dom, 1],
                                                block_shape=[BLOCK_M, BLOCK_D])
        row_base = off_b * stride_lb + off_h * stride_lh + q_start
        if HAS_RIGHT:  # rows at the causal/right edge (lo = a = 0 without a right bound)
            dk, dv = _bwd_dkdv_inner(
                dk, dv, b_k, b_v, q_base, do_base, LSE, DELTA, row_base, stride_qm, stride_dom,
                o_n, o_d, m_d, lo, a, seqlen_q, shift, window_left, window_right,
                qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m, dropout_p,
                MASK=True, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA,
            )
        dk, dv = _bwd_dkdv_inner(
            dk, dv, b_k, b_v, q_base, do_base, LSE, DELTA, row_base, stride_qm, stride_dom,
            o_n, o_d, m_d, a, b, seqlen_q, shift, window_left, window_right,
            qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m, dropout_p,
            MASK=False, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
            HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA,
        )
        if HAS_LEFT:  # rows past the left window edge (b = hi without a left bound)
            dk, dv = _bwd_dkdv_inner(
                dk, dv, b_k, b_v, q_base, do_base, LSE, DELTA, row_base, stride_qm, stride_dom,
                o_n, o_d, m_d, b, hi, seqlen_q, shift, window_left, window_right,
                qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m, dropout_p,
                MASK=True, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP, HAS_ALIBI=HAS_ALIBI,
                HAS_DROPOUT=HAS_DROPOUT, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION, USE_TMA=USE_TMA,
            )
    dk = dk * sm_scale
    p_dk = DK + off_b * stride_dkb + off_hk * stride_dkh + row_k * stride_dkn + o_nb[:, None] * stride_dkn + o_d[None, :]
    p_dv = DV + off_b * stride_dvb + off_hk * stride_dvh + row_k * stride_dvn + o_nb[:, None] * stride_dvn + o_d[None, :]
    tl.store(p_dk, dk.to(DK.dtype.element_ty), mask=m_nd)
    tl.store(p_dv, dv.to(DV.dtype.element_ty), mask=m_nd)


@triton.jit
def _bwd_dq_inner(
    dq, b_q, b_do, lse2, delta,    # [BLOCK_M, BLOCK_D] fp32, [BLOCK_M, BLOCK_D] x2, [BLOCK_M] x2
    k_base, v_base, stride_kn, stride_vn,
    o_m, o_d, m_d, lo, hi, seqlen_k, shift, window_left, window_right,
    qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m, dropout_p,
    MASK: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr = False,
):
    """Fold the K/V blocks starting in [lo, hi) into dQ of one Q block.

    USE_TMA: k_base/v_base are tensor descriptors of this (sequence, kv head) (seqlen_k, HEAD_DIM),
    zero-filled past seqlen_k and HEAD_DIM."""
    o_nb = tl.arange(0, BLOCK_N)                                                      # [BLOCK_N]
    for start_n in range(lo, hi, BLOCK_N):
        o_n = start_n + o_nb                                                          # [BLOCK_N]
        m_n = o_n < seqlen_k
        if USE_TMA:
            b_kt = tl.trans(k_base.load([tl.cast(start_n, tl.int32), 0]))             # [BLOCK_D, BLOCK_N]
            b_vt = tl.trans(v_base.load([tl.cast(start_n, tl.int32), 0]))             # [BLOCK_D, BLOCK_N]
        else:
            p_kt = k_base + start_n * stride_kn + o_nb[None, :] * stride_kn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
            p_vt = v_base + start_n * stride_vn + o_nb[None, :] * stride_vn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
            b_kt = tl.load(p_kt, mask=m_n[None, :] & m_d[:, None], other=0.0)            # [BLOCK_D, BLOCK_N]
            b_vt = tl.load(p_vt, mask=m_n[None, :] & m_d[:, None], other=0.0)            # [BLOCK_D, BLOCK_N]
        rel = o_m[:, None] + shift - o_n[None, :]                                     # [BLOCK_M, BLOCK_N]
        b_s, b_t = score_mods(tl.dot(b_q, b_kt, input_precision=DOT_PRECISION), rel, qk_scale,
                              softcap_scale, softcap2, slope2, HAS_SOFTCAP, HAS_ALIBI)  # [BLOCK_M, BLOCK_N]
        b_p = tl.math.exp2(b_s - lse2[:, None])                                       # [BLOCK_M, BLOCK_N]
        if MASK:
            # keys past seqlen_k too: their zero-loaded score gives P = exp(-lse), which overflows
            # (then inf * 0 = NaN in dQ) when every real score of the row is very negative
            b_p = tl.where(m_n[None, :] & visible(rel, window_left, window_right, HAS_LEFT, HAS_RIGHT), b_p, 0.0)
        b_dp = tl.dot(b_do, b_vt, input_precision=DOT_PRECISION)                     # [BLOCK_M, BLOCK_N]
        if HAS_DROPOUT:
            keep = dropout_keep(seed, rng_base, o_m[:, None], o_n[None, :], rng_stride_m, dropout_p)
            b_dp = tl.where(keep, b_dp / (1.0 - dropout_p), 0.0)
        b_ds = b_p * (b_dp - delta[:, None])                                          # [BLOCK_M, BLOCK_N]
        if HAS_SOFTCAP:
            b_ds = b_ds * (1.0 - b_t * b_t)
        dq = tl.dot(b_ds.to(b_kt.dtype), tl.trans(b_kt), dq, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_D]
    return dq


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "causal_shift", "window_left", "window_right",
                             "rng_stride_bh", "rng_stride_m"])
def _bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ, ALIBI, CU_Q, CU_K, SEED, O,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    stride_lb, stride_lh, stride_ab, stride_ah,
    stride_ob, stride_om, stride_oh,
    nheads, seqlen_q, seqlen_k, causal_shift, window_left, window_right, kv_group,
    qk_scale, sm_scale, softcap_scale, softcap2, dropout_p, rng_stride_bh, rng_stride_m,
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr = False, FLAT_GRID: tl.constexpr = False,
    FUSE_DELTA: tl.constexpr = False,
):
    """dQ of one Q block of one (batch, head). USE_TMA (sm90+): the K and V blocks of the inner
    loop move through tensor descriptors. Grid: (Q blocks, batch*heads), or one flat axis of both
    past 65535 batch*heads (FLAT_GRID, ``common.block_grid``). FUSE_DELTA: the program computes
    its rows' delta = rowsum(dO ∘ O) from O (``_bwd_preprocess``'s arithmetic), uses it and stores
    it into DELTA for the dK/dV kernel launched after this one; else it reads DELTA and O is None."""
    pid_m, pid_bh = block_ids(seqlen_q, BLOCK_M, HAS_RIGHT, FLAT_GRID)  # causal: heaviest Q blocks first
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    off_hk = off_h // kv_group
    start_m = pid_m * BLOCK_M
    q_start, k_start, seqlen_q, seqlen_k, shift = seq_bounds(
        CU_Q, CU_K, off_b, seqlen_q, seqlen_k, causal_shift, IS_VARLEN)
    if start_m >= seqlen_q:
        return
    o_mb = tl.arange(0, BLOCK_M)                                                      # [BLOCK_M]
    o_m = start_m + o_mb                                                              # [BLOCK_M]
    o_d = tl.arange(0, BLOCK_D)                                                       # [BLOCK_D]
    m_d = o_d < HEAD_DIM
    m_md = (o_m < seqlen_q)[:, None] & m_d[None, :]                                   # [BLOCK_M, BLOCK_D]
    slope2, seed = head_scalars(ALIBI, SEED, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI, HAS_DROPOUT)
    rng_base = pid_bh.to(tl.int64) * rng_stride_bh
    row0 = q_start + start_m
    p_q = Q + off_b * stride_qb + off_h * stride_qh + row0 * stride_qm + o_mb[:, None] * stride_qm + o_d[None, :]
    p_do = DO + off_b * stride_dob + off_h * stride_doh + row0 * stride_dom + o_mb[:, None] * stride_dom + o_d[None, :]
    b_q = tl.load(p_q, mask=m_md, other=0.0)                                          # [BLOCK_M, BLOCK_D]
    b_do = tl.load(p_do, mask=m_md, other=0.0)                                        # [BLOCK_M, BLOCK_D]
    row_lse = off_b * stride_lb + off_h * stride_lh + q_start
    lse2, delta = _load_lse2(LSE, DELTA, row_lse, o_m, seqlen_q, LOAD_DELTA=not FUSE_DELTA)
    if FUSE_DELTA:
        p_o = O + off_b * stride_ob + off_h * stride_oh + row0 * stride_om + o_mb[:, None] * stride_om + o_d[None, :]
        b_o = tl.load(p_o, mask=m_md, other=0.0)                                      # [BLOCK_M, BLOCK_D]
        delta = tl.sum(b_o.to(tl.float32) * b_do.to(tl.float32), 1)                   # [BLOCK_M]
        tl.store(DELTA + row_lse + o_m, delta, mask=o_m < seqlen_q)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)                               # [BLOCK_M, BLOCK_D]

    k_base = K + off_b * stride_kb + off_hk * stride_kh + k_start * stride_kn
    v_base = V + off_b * stride_vb + off_hk * stride_vh + k_start * stride_vn
    if USE_TMA:  # this sequence's rows of kv head hk
        k_base = tl.make_tensor_descriptor(k_base, shape=[seqlen_k, HEAD_DIM], strides=[stride_kn, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
        v_base = tl.make_tensor_descriptor(v_base, shape=[seqlen_k, HEAD_DIM], strides=[stride_vn, 1],
                                           block_shape=[BLOCK_N, BLOCK_D])
    # same block split as the forward: masked left edge, unmasked middle, masked right edge/tail
    lo, a, b, hi = kv_block_range(start_m, seqlen_k, shift, window_left, window_right,
                                  HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    if HAS_LEFT:  # left window edge (lo = a = 0 without a left bound)
        dq = _bwd_dq_inner(
            dq, b_q, b_do, lse2, delta, k_base, v_base, stride_kn, stride_vn, o_m, o_d, m_d, lo, a, seqlen_k,
            shift, window_left, window_right, qk_scale, softcap_scale, softcap2, slope2, seed, rng_base,
            rng_stride_m, dropout_p, MASK=True, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP,
            HAS_ALIBI=HAS_ALIBI, HAS_DROPOUT=HAS_DROPOUT, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
            USE_TMA=USE_TMA,
        )
    dq = _bwd_dq_inner(
        dq, b_q, b_do, lse2, delta, k_base, v_base, stride_kn, stride_vn, o_m, o_d, m_d, a, b, seqlen_k,
        shift, window_left, window_right, qk_scale, softcap_scale, softcap2, slope2, seed, rng_base,
        rng_stride_m, dropout_p, MASK=False, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP,
        HAS_ALIBI=HAS_ALIBI, HAS_DROPOUT=HAS_DROPOUT, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
        USE_TMA=USE_TMA,
    )
    dq = _bwd_dq_inner(
        dq, b_q, b_do, lse2, delta, k_base, v_base, stride_kn, stride_vn, o_m, o_d, m_d, b, hi, seqlen_k,
        shift, window_left, window_right, qk_scale, softcap_scale, softcap2, slope2, seed, rng_base,
        rng_stride_m, dropout_p, MASK=True, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP,
        HAS_ALIBI=HAS_ALIBI, HAS_DROPOUT=HAS_DROPOUT, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
        USE_TMA=USE_TMA,
    )
    dq = dq * sm_scale
    p_dq = DQ + off_b * stride_dqb + off_h * stride_dqh + row0 * stride_dqm + o_mb[:, None] * stride_dqm + o_d[None, :]
    tl.store(p_dq, dq.to(DQ.dtype.element_ty), mask=m_md)


# ----------------------------------------------------------------------------------------------
# Configs: a small table per head dim (the backward holds two fp32 accumulators per K block, so
# the tile that fits D=64 spills at D=128; default_bwd_config says what was measured).
# ----------------------------------------------------------------------------------------------

INTERPRET_BWD_CONFIG = {"dkdv": dict(BLOCK_M=16, BLOCK_N=32), "dq": dict(BLOCK_M=32, BLOCK_N=16)}


def _c(bm, bn, w, s):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)


def default_bwd_config(head_dim: int, causal: bool = False) -> dict:
    """Per-head-dim block configs, picked by joint sweeps of the dK/dV and dQ tiles on an H200 (fp16,
    N = 4k and 16k; re-swept after the dK/dV loop went int32, see docs/perf-notes.md). D=64 non-causal shares
    the causal winner (not swept separately). D > 128: swept at D=256, N=4k."""
    if head_dim <= 64:
        # joint sweep after the int32 loop fix (causal, N = 4k / 16k): 246 / 270 TFLOP/s
        return {"dkdv": _c(32, 128, 4, 3), "dq": _c(128, 32, 8, 3)}
    if head_dim <= 128:
        # pair sweeps, then the earlier dQ tiles (128, 64, 8, 3) re-timed with the int32 loop,
        # TFLOP/s at 4k / 16k:
        if causal:  # 268 / 313, against 260 / 300 with dQ (64, 32, 4, 3)
            return {"dkdv": _c(64, 128, 8, 2), "dq": _c(128, 64, 8, 3)}
        return {"dkdv": _c(64, 128, 8, 3), "dq": _c(128, 64, 8, 3)}  # 334 / 347, against 320 / 324
    # D > 128: pair sweep at D=256, N=4k, non-causal: 193 TFLOP/s,
    # against 87 for the previous (32,64,4,2)/(64,32,4,2)
    return {"dkdv": _c(64, 64, 8, 2), "dq": _c(128, 32, 8, 2)}


# Head dims whose backward takes tensor descriptors by default where the forward does (Hopper).
# H200, fp16, N 4k / 16k, default tiles, pointers -> descriptors: D=128 non-causal
# 347/352 -> 352/362 TFLOP/s, causal 267/313 -> 282/333; D=64 causal 244/273 -> 231/260 (slower,
# so off). D=256 (default tiles): non-causal 4k 191 -> 238; 4k / 16k with descriptors 237/239
# non-causal, 175/197 causal, against 193/194 and 172/194 without (a bench grid). Other head dims (96, which takes the Gluon kernels on Hopper; 160, 192) not measured (off).
BWD_TMA_HEAD_DIMS = frozenset({128, 256})


def bwd_tma_requested(config=None, device=None, head_dim: int = 128, use_tma=None) -> bool:
    """Whether the backward asks for tensor descriptors: ``config["USE_TMA"]`` if given, else
    ``use_tma`` (``Options.use_tma``) if not None, else for head dims in BWD_TMA_HEAD_DIMS where
    the forward would use them (``forward.tma_requested``: compiled kernels on Hopper)."""
    if config is not None and "USE_TMA" in config:
        return bool(config["USE_TMA"])
    if use_tma is not None:
        return bool(use_tma)
    return head_dim in BWD_TMA_HEAD_DIMS and tma_requested(None, device)


# (layout key) -> ops.launch.Launch of _bwd_preprocess
_PRE_LAUNCHES: dict = {}
# int32 words per store loop step where the delta kernel zeroes a buffer (compute_delta's zero), and
# its warps then. tools/zero_ab.py (H100, 2026-12-06 08:25 UTC, fp16, B*N = 16k, H*D = 2048, D 64/128 at
# 2k/16k): 1024 words with 8 warps took 97.5-101.9 us per call against 99.0-99.8 for the delta kernel
# plus a memset (wider chunks 1-6% slower): level on the GPU, one launch less on the host.
ZERO_CHUNK = 1024
ZERO_WARPS = 8


def compute_delta(out, dout, lse, varlen: bool, nheads: int, head_dim: int, zero=None):
    """delta = rowsum(dO * O) in fp32, laid out like the (contiguous) LSE; varlen is one "batch" of
    total_q rows. ``zero``: a contiguous int32 tensor the same kernel sets to zero (the fused
    backward's fp32 dQ sums and counters, ``gluon.backward.fused_buffers``: FA4's preprocess does
    this too, and it saves a memset launch). The launch is kept per layout (``ops.launch.Launch``: on
    a GPU, later calls skip triton's argument binding; host time: docs/perf-notes.md, "Host path")."""
    delta = torch.empty(lse.shape, dtype=torch.float32, device=out.device)
    o4, do4 = (out[None], dout[None]) if varlen else (out, dout)
    if zero is not None and (zero.dtype != torch.int32 or not zero.is_contiguous()):
        raise ValueError(f"compute_delta: zero must be a contiguous int32 tensor, got {zero.dtype} "
                         f"with strides {zero.stride()}")
    if zero is not None and zero.numel() == 0:
        zero = None  # (nothing to zero: the same launch, ZERO a None constant, as the key says)
    n_zero = 0 if zero is None else zero.numel()
    key = (o4.shape, o4.stride(), do4.stride(), o4.dtype, do4.dtype, o4.device, nheads, head_dim, n_zero,
           interpreting())
    launch = _PRE_LAUNCHES.get(key)
    if launch is None:
        pre_b, pre_s = o4.shape[0], o4.shape[1]
        pre_m = 64 if not interpreting() else 32
        n_blocks = cdiv(pre_s, pre_m)
        chunk = (ZERO_CHUNK if not interpreting() else 64) if n_zero else 0
        # words per program, a whole number of chunks: the programs' ranges tile [0, n_zero)
        per = cdiv(cdiv(n_zero, n_blocks * pre_b * nheads), chunk) * chunk if n_zero else 0
        ints = (o4.stride(0), o4.stride(1), o4.stride(2), do4.stride(0), do4.stride(1), do4.stride(2), nheads, pre_s,
                n_zero, per)
        grid, flat = block_grid(n_blocks, pre_b * nheads)
        launch = Launch(_bwd_preprocess, grid, (), 4, ints, 0,
                        dict(HEAD_DIM=head_dim, BLOCK_D=block_d_for(head_dim), BLOCK_M=pre_m, FLAT_GRID=flat,
                             ZERO_CHUNK=chunk, **(dict(num_warps=ZERO_WARPS) if n_zero else {})))
        if len(_PRE_LAUNCHES) >= 1024:
            _PRE_LAUNCHES.clear()
        _PRE_LAUNCHES[key] = launch
    launch((), (o4, do4, delta, zero), (), o4.is_cuda and addresses(o4, do4, delta, zero))
    return delta


@triton.jit
def _scale_cast(SRC, DST, n, scale, BLOCK: tl.constexpr):
    """DST[i] = (scale · SRC[i]) in DST's dtype, over n contiguous elements: the fused backward's
    fp32 dQ sums into dq (FA4's "postprocess"), one read of the sums and one write of dq."""
    o = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)                   # [BLOCK]
    m = o < n
    x = tl.load(SRC + o, mask=m, other=0.0)                                          # [BLOCK] fp32
    tl.store(DST + o, (x * scale).to(DST.dtype.element_ty), mask=m)


# (n, dtypes, device) -> ops.launch.Launch of _scale_cast
_CAST_LAUNCHES: dict = {}
_CAST_BLOCK = 4096


def scale_cast(src, dst, scale: float):
    """dst = scale · src cast to dst's dtype, for contiguous tensors of one shape (src fp32). The
    launch is kept per size (``ops.launch.Launch``); elsewhere (other layouts, the CPU) it is
    ``torch.mul(src, scale, out=dst)``, the same values (one rounding of the fp32 product). The CPU
    interpreter runs the kernel too (tests), except into bf16, whose stores it gets wrong. The caller
    has the tensors' device current (``gluon.backward._run_fused`` runs under the route's device
    switch), as the cached launch uses the current device's stream."""
    if not ((src.is_cuda and not interpreting()) or (interpreting() and dst.dtype != torch.bfloat16)) \
            or not (src.is_contiguous() and dst.is_contiguous()) or src.shape != dst.shape or src.dtype != torch.float32:
        return torch.mul(src, scale, out=dst)
    n = src.numel()
    key = (n, dst.dtype, src.device, interpreting())
    launch = _CAST_LAUNCHES.get(key)
    if launch is None:
        block = _CAST_BLOCK if not interpreting() else 256
        launch = Launch(_scale_cast, (cdiv(n, block),), (), 2, (n,), 1, dict(BLOCK=block, num_warps=8))
        if len(_CAST_LAUNCHES) >= 1024:
            _CAST_LAUNCHES.clear()
        _CAST_LAUNCHES[key] = launch
    launch((), (src, dst), (scale,), src.is_cuda and addresses(src, dst))
    return dst


def flash_attn_backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool,
                        causal_shift: int | None = None, *, window=(-1, -1), softcap: float = 0.0,
                        alibi_slopes=None, dropout_p: float = 0.0, seed=None, cu_seqlens_q=None, cu_seqlens_k=None,
                        max_seqlen_q=None, max_seqlen_k=None, config: dict | None = None, dq=None, dk=None, dv=None,
                        use_tma: bool | None = None, delta=None, run_dkdv: bool = True, run_dq: bool = True):
    """Launch the Triton backward kernels. Returns (dq, dk, dv) in the input shapes and dtypes.

    Layouts and feature arguments as in ``flash_attn_forward``; ``lse`` is the forward's
    natural-log LSE. ``dq``/``dk``/``dv`` may be given preallocated (tests pass NaN-filled buffers).
    ``config``: {"dkdv": tiles, "dq": tiles} and optionally "USE_TMA"; the inner loops' Q/dO and
    K/V blocks move through tensor descriptors where the forward would use them
    (``forward.tma_requested`` / ``tma_supported``: by default on Hopper; ``use_tma`` overrides).
    ``delta`` (rowsum(dO∘O), fp32, laid out like the LSE) if already computed; ``run_dkdv`` /
    ``run_dq`` False skip a kernel whose gradients another kernel wrote (``tileflash.ops.route``
    runs the Hopper Gluon kernels first and hands over what they could not take).
    """
    varlen, batch, seqlen_q, seqlen_k, _, lse_strides = problem_dims(q, k, cu_seqlens_q, max_seqlen_q, max_seqlen_k)
    nheads, head_dim, nheads_k = q.shape[-2], q.shape[-1], k.shape[-2]
    if causal_shift is None:
        causal_shift = seqlen_k - seqlen_q
    if dout.stride(-1) != 1:
        # e.g. the expanded ones of loss = out.sum(): the kernels need a unit stride on headdim
        dout = dout.contiguous()
    lse = lse.contiguous()  # rows are addressed as in lse_strides
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if dv is None else dv
    if q.numel() == 0 or k.numel() == 0 or batch == 0:
        # no query or no key: every gradient is zero, nothing to launch
        return dq.zero_(), dk.zero_(), dv.zero_()
    flags, sc, alibi_strides = feature_args(softmax_scale, causal, window, softcap, alibi_slopes, batch, dropout_p,
                                            seqlen_q + abs(causal_shift), seqlen_k + abs(causal_shift))
    seed = seed if dropout_p > 0 else None
    # Without a delta yet, the dQ kernel computes it (FUSE_DELTA) and runs before the dK/dV kernel,
    # as the Gluon route does; the debug switch dq_delta=0 runs the delta kernel instead.
    fuse_delta = delta is None and run_dq and DEBUG.dq_delta and out.stride(-1) == 1
    if fuse_delta:
        delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)
    elif delta is None:
        delta = compute_delta(out, dout, lse, varlen, nheads, head_dim)
    use_tma = bwd_tma_requested(config, q.device, head_dim, use_tma) and tma_supported(q, k, v, dout)
    if use_tma and q.is_cuda:
        _ensure_tma_allocator()
    if config is None or "dkdv" not in config:
        config = INTERPRET_BWD_CONFIG if interpreting() else default_bwd_config(head_dim, flags["HAS_RIGHT"])
    block_d = block_d_for(head_dim)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    common = dict(**flags, IS_VARLEN=varlen, HEAD_DIM=head_dim, BLOCK_D=block_d, DOT_PRECISION=precision,
                  USE_TMA=use_tma)
    tail = (sc["window_left"], sc["window_right"], nheads // nheads_k,
            softmax_scale * LOG2E, softmax_scale, sc["softcap_scale"], sc["softcap2"], float(dropout_p),
            *rng_strides(seqlen_q, seqlen_k))

    def launch_dq():
        c = config["dq"]
        grid, flat = block_grid(cdiv(seqlen_q, c["BLOCK_M"]), batch * nheads)
        _bwd_dq[grid](
            q, k, v, dout, lse, delta, dq, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seed,
            out if fuse_delta else None,
            *strides3(q, varlen), *strides3(k, varlen), *strides3(v, varlen), *strides3(dout, varlen),
            *strides3(dq, varlen), *lse_strides, *alibi_strides, *(strides3(out, varlen) if fuse_delta else (0, 0, 0)),
            nheads, seqlen_q, seqlen_k, causal_shift, *tail, **common, **c, FLAT_GRID=flat, FUSE_DELTA=fuse_delta,
        )

    if fuse_delta:
        launch_dq()  # first: it writes delta, which the dK/dV kernel reads
    if run_dkdv:
        c = config["dkdv"]
        grid, flat = block_grid(cdiv(seqlen_k, c["BLOCK_N"]), batch * nheads_k)
        _bwd_dkdv[grid](
            q, k, v, dout, lse, delta, dk, dv, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seed,
            *strides3(q, varlen), *strides3(k, varlen), *strides3(v, varlen), *strides3(dout, varlen),
            *strides3(dk, varlen), *strides3(dv, varlen), *lse_strides, *alibi_strides,
            nheads, nheads_k, seqlen_q, seqlen_k, causal_shift, *tail, **common, **c, FLAT_GRID=flat,
        )
    if run_dq and not fuse_delta:
        launch_dq()
    return dq, dk, dv
