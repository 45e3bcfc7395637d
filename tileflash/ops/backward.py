"""FlashAttention backward in Triton, by recomputation: no N×N matrix is stored.

Only q, k, v, out and the LSE come from the forward. With P = exp(S - lse) recomputed block by
block (seed 002's derivation, FA2's schedule):

    dV = Pᵀ dO          dP = dO Vᵀ          dS = P ∘ (dP − delta),  delta = rowsum(dO ∘ O)
    dQ = scale · dS K   dK = scale · dSᵀ Q

Three launches, no atomics, so the result is bitwise deterministic:

1. ``_bwd_preprocess``: delta = rowsum(dO ∘ O) in fp32, one program per (Q block, batch·head).
2. ``_bwd_dkdv``: one program per (K/V block, batch·kv_head); it loops over the query heads of
   its GQA group and over their Q blocks, accumulating dK and dV in registers.
3. ``_bwd_dq``: one program per (Q block, batch·head), looping over the K/V blocks.

Numerics follow ``tileflash.ops.forward``: scores in base 2 (``qk_scale = scale·log2 e``), the
natural-log LSE is converted on load. A row that saw no key (lse = -inf) and rows past seqlen_q
get lse = +inf here, so their recomputed P is exactly 0 and they contribute nothing.
Rows/columns past the ragged ends are loaded as zeros: a zero key row or zero dO row adds
nothing to any stored gradient, so only the causal diagonal needs an element mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tileflash.ops.forward import LOG2E, block_d_for, interpreting


@triton.jit(do_not_specialize=["seqlen_q"])
def _bwd_preprocess(
    O, DO, DELTA,
    stride_ob, stride_om, stride_oh,
    stride_dob, stride_dom, stride_doh,
    nheads, seqlen_q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
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


@triton.jit
def _load_lse2(LSE, DELTA, row_base, o_m, seqlen_q):
    """Base-2 LSE and delta for rows o_m; rows that saw no key or lie past seqlen_q get +inf (P = 0)."""
    m_m = o_m < seqlen_q
    lse = tl.load(LSE + row_base + o_m, mask=m_m, other=float("inf"))                 # [BLOCK]
    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634)
    delta = tl.load(DELTA + row_base + o_m, mask=m_m, other=0.0)                      # [BLOCK]
    return lse2, delta


@triton.jit
def _bwd_dkdv_inner(
    dk, dv, b_k, b_v,              # [BLOCK_N, BLOCK_D] fp32 x2, [BLOCK_N, BLOCK_D] x2
    q_base, do_base, LSE, DELTA, row_base, stride_qm, stride_dom,
    o_n, o_d, m_d, lo, hi, seqlen_q, causal_shift, qk_scale,
    MASK: tl.constexpr, BLOCK_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Fold the Q blocks starting in [lo, hi) into dK, dV of one K/V block (transposed form)."""
    o_mb = tl.arange(0, BLOCK_M)                                                      # [BLOCK_M]
    for start_m in range(lo, hi, BLOCK_M):
        o_m = start_m + o_mb                                                          # [BLOCK_M]
        m_m = o_m < seqlen_q
        p_qt = q_base + start_m * stride_qm + o_mb[None, :] * stride_qm + o_d[:, None]    # [BLOCK_D, BLOCK_M]
        p_do = do_base + start_m * stride_dom + o_mb[:, None] * stride_dom + o_d[None, :]  # [BLOCK_M, BLOCK_D]
        b_qt = tl.load(p_qt, mask=m_m[None, :] & m_d[:, None], other=0.0)            # [BLOCK_D, BLOCK_M]
        b_do = tl.load(p_do, mask=m_m[:, None] & m_d[None, :], other=0.0)            # [BLOCK_M, BLOCK_D]
        lse2, delta = _load_lse2(LSE, DELTA, row_base, o_m, seqlen_q)                 # [BLOCK_M] x2
        b_st = tl.dot(b_k, b_qt, input_precision=DOT_PRECISION) * qk_scale           # [BLOCK_N, BLOCK_M]
        b_pt = tl.math.exp2(b_st - lse2[None, :])                                     # [BLOCK_N, BLOCK_M]
        if MASK:
            # bottom-right (shifted) causal: key j visible to query i iff j <= i + shift
            b_pt = tl.where(o_n[:, None] <= o_m[None, :] + causal_shift, b_pt, 0.0)
        dv = tl.dot(b_pt.to(b_do.dtype), b_do, dv, input_precision=DOT_PRECISION)    # [BLOCK_N, BLOCK_D]
        b_dpt = tl.dot(b_v, tl.trans(b_do), input_precision=DOT_PRECISION)           # [BLOCK_N, BLOCK_M]
        b_dst = b_pt * (b_dpt - delta[None, :])                                       # [BLOCK_N, BLOCK_M]
        dk = tl.dot(b_dst.to(b_qt.dtype), tl.trans(b_qt), dk, input_precision=DOT_PRECISION)  # [BLOCK_N, BLOCK_D]
    return dk, dv


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "causal_shift"])
def _bwd_dkdv(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh,
    nheads, nheads_k, seqlen_q, seqlen_k, causal_shift, kv_group, qk_scale, sm_scale,
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bhk = tl.program_id(1)
    off_b = (pid_bhk // nheads_k).to(tl.int64)
    off_hk = (pid_bhk % nheads_k).to(tl.int64)
    start_n = pid_n * BLOCK_N
    o_nb = tl.arange(0, BLOCK_N)                                                      # [BLOCK_N]
    o_n = start_n + o_nb                                                              # [BLOCK_N]
    o_d = tl.arange(0, BLOCK_D)                                                       # [BLOCK_D]
    m_d = o_d < HEAD_DIM
    m_nd = (o_n < seqlen_k)[:, None] & m_d[None, :]                                   # [BLOCK_N, BLOCK_D]
    off_n = start_n.to(tl.int64)
    p_k = K + off_b * stride_kb + off_hk * stride_kh + off_n * stride_kn + o_nb[:, None] * stride_kn + o_d[None, :]
    p_v = V + off_b * stride_vb + off_hk * stride_vh + off_n * stride_vn + o_nb[:, None] * stride_vn + o_d[None, :]
    b_k = tl.load(p_k, mask=m_nd, other=0.0)                                          # [BLOCK_N, BLOCK_D]
    b_v = tl.load(p_v, mask=m_nd, other=0.0)                                          # [BLOCK_N, BLOCK_D]
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)                               # [BLOCK_N, BLOCK_D]
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)                               # [BLOCK_N, BLOCK_D]

    q_end = ((seqlen_q + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        # first query row that sees key start_n: i >= start_n - shift; rows i >= start_n + BLOCK_N - 1 - shift
        # see the whole block (no mask). Q blocks entirely below that are skipped.
        lo = (tl.maximum(start_n - causal_shift, 0) // BLOCK_M) * BLOCK_M
        mid = ((tl.maximum(start_n + BLOCK_N - 1 - causal_shift, 0) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
        lo = tl.minimum(lo, q_end)
        mid = tl.minimum(mid, q_end)
    else:
        lo = q_end * 0
        mid = q_end * 0
    lo = lo.to(tl.int64)
    mid = mid.to(tl.int64)
    q_end = q_end.to(tl.int64)

    # GQA: dK/dV of kv head hk accumulate over query heads hk*G ... hk*G + G - 1, in registers.
    for g in range(0, kv_group):
        off_h = off_hk * kv_group + g
        q_base = Q + off_b * stride_qb + off_h * stride_qh
        do_base = DO + off_b * stride_dob + off_h * stride_doh
        row_base = (off_b * nheads + off_h) * seqlen_q
        dk, dv = _bwd_dkdv_inner(
            dk, dv, b_k, b_v, q_base, do_base, LSE, DELTA, row_base, stride_qm, stride_dom,
            o_n, o_d, m_d, lo, mid, seqlen_q, causal_shift, qk_scale,
            MASK=True, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION,
        )
        dk, dv = _bwd_dkdv_inner(
            dk, dv, b_k, b_v, q_base, do_base, LSE, DELTA, row_base, stride_qm, stride_dom,
            o_n, o_d, m_d, mid, q_end, seqlen_q, causal_shift, qk_scale,
            MASK=False, BLOCK_M=BLOCK_M, DOT_PRECISION=DOT_PRECISION,
        )
    dk = dk * sm_scale
    p_dk = DK + off_b * stride_dkb + off_hk * stride_dkh + off_n * stride_dkn + o_nb[:, None] * stride_dkn + o_d[None, :]
    p_dv = DV + off_b * stride_dvb + off_hk * stride_dvh + off_n * stride_dvn + o_nb[:, None] * stride_dvn + o_d[None, :]
    tl.store(p_dk, dk.to(DK.dtype.element_ty), mask=m_nd)
    tl.store(p_dv, dv.to(DV.dtype.element_ty), mask=m_nd)


@triton.jit
def _bwd_dq_inner(
    dq, b_q, b_do, lse2, delta,    # [BLOCK_M, BLOCK_D] fp32, [BLOCK_M, BLOCK_D] x2, [BLOCK_M] x2
    k_base, v_base, stride_kn, stride_vn,
    o_m, o_d, m_d, lo, hi, seqlen_k, causal_shift, qk_scale,
    MASK: tl.constexpr, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Fold the K/V blocks starting in [lo, hi) into dQ of one Q block."""
    o_nb = tl.arange(0, BLOCK_N)                                                      # [BLOCK_N]
    for start_n in range(lo, hi, BLOCK_N):
        o_n = start_n + o_nb                                                          # [BLOCK_N]
        m_n = o_n < seqlen_k
        p_kt = k_base + start_n * stride_kn + o_nb[None, :] * stride_kn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
        p_vt = v_base + start_n * stride_vn + o_nb[None, :] * stride_vn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
        b_kt = tl.load(p_kt, mask=m_n[None, :] & m_d[:, None], other=0.0)            # [BLOCK_D, BLOCK_N]
        b_vt = tl.load(p_vt, mask=m_n[None, :] & m_d[:, None], other=0.0)            # [BLOCK_D, BLOCK_N]
        b_s = tl.dot(b_q, b_kt, input_precision=DOT_PRECISION) * qk_scale            # [BLOCK_M, BLOCK_N]
        b_p = tl.math.exp2(b_s - lse2[:, None])                                       # [BLOCK_M, BLOCK_N]
        if MASK:
            b_p = tl.where(o_n[None, :] <= o_m[:, None] + causal_shift, b_p, 0.0)
        b_dp = tl.dot(b_do, b_vt, input_precision=DOT_PRECISION)                     # [BLOCK_M, BLOCK_N]
        b_ds = b_p * (b_dp - delta[:, None])                                          # [BLOCK_M, BLOCK_N]
        dq = tl.dot(b_ds.to(b_kt.dtype), tl.trans(b_kt), dq, input_precision=DOT_PRECISION)  # [BLOCK_M, BLOCK_D]
    return dq


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "causal_shift"])
def _bwd_dq(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh,
    stride_dqb, stride_dqm, stride_dqh,
    nheads, seqlen_q, seqlen_k, causal_shift, kv_group, qk_scale, sm_scale,
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m  # heaviest Q blocks first
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    off_hk = off_h // kv_group
    start_m = pid_m * BLOCK_M
    o_mb = tl.arange(0, BLOCK_M)                                                      # [BLOCK_M]
    o_m = start_m + o_mb                                                              # [BLOCK_M]
    o_d = tl.arange(0, BLOCK_D)                                                       # [BLOCK_D]
    m_d = o_d < HEAD_DIM
    m_md = (o_m < seqlen_q)[:, None] & m_d[None, :]                                   # [BLOCK_M, BLOCK_D]
    off_m = start_m.to(tl.int64)
    p_q = Q + off_b * stride_qb + off_h * stride_qh + off_m * stride_qm + o_mb[:, None] * stride_qm + o_d[None, :]
    p_do = DO + off_b * stride_dob + off_h * stride_doh + off_m * stride_dom + o_mb[:, None] * stride_dom + o_d[None, :]
    b_q = tl.load(p_q, mask=m_md, other=0.0)                                          # [BLOCK_M, BLOCK_D]
    b_do = tl.load(p_do, mask=m_md, other=0.0)                                        # [BLOCK_M, BLOCK_D]
    lse2, delta = _load_lse2(LSE, DELTA, pid_bh.to(tl.int64) * seqlen_q, o_m, seqlen_q)  # [BLOCK_M] x2
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)                               # [BLOCK_M, BLOCK_D]

    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    if IS_CAUSAL:
        # same block split as the forward: unmasked blocks left of the diagonal, then the diagonal
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + causal_shift, 0), seqlen_k)
        full_hi = tl.minimum((tl.maximum(start_m + causal_shift + 1, 0) // BLOCK_N) * BLOCK_N, hi)
    else:
        hi = seqlen_k + 0 * start_m
        full_hi = hi
    hi = hi.to(tl.int64)
    full_hi = full_hi.to(tl.int64)
    dq = _bwd_dq_inner(
        dq, b_q, b_do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
        o_m, o_d, m_d, full_hi * 0, full_hi, seqlen_k, causal_shift, qk_scale,
        MASK=False, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
    )
    dq = _bwd_dq_inner(
        dq, b_q, b_do, lse2, delta, k_base, v_base, stride_kn, stride_vn,
        o_m, o_d, m_d, full_hi, hi, seqlen_k, causal_shift, qk_scale,
        MASK=True, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
    )
    dq = dq * sm_scale
    p_dq = DQ + off_b * stride_dqb + off_h * stride_dqh + off_m * stride_dqm + o_mb[:, None] * stride_dqm + o_d[None, :]
    tl.store(p_dq, dq.to(DQ.dtype.element_ty), mask=m_md)


# ----------------------------------------------------------------------------------------------
# Configs: a small table per head dim (the backward holds two fp32 accumulators per K block, so
# the tile that fits D=64 spills at D=128; see docs/results.md for what was measured).
# ----------------------------------------------------------------------------------------------

INTERPRET_BWD_CONFIG = {"dkdv": dict(BLOCK_M=16, BLOCK_N=32), "dq": dict(BLOCK_M=32, BLOCK_N=16)}


def _c(bm, bn, w, s):
    return dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)


def default_bwd_config(head_dim: int, causal: bool = False) -> dict:
    """Per-head-dim block configs, picked by ``scripts/bwd_sweep.py`` on an H200 (fp16, N=8k;
    see docs/results.md). D=256 was not swept: it uses small tiles that fit its registers."""
    if head_dim <= 64:
        return {"dkdv": _c(32, 128, 4, 3), "dq": _c(64, 64, 4, 3) if causal else _c(128, 64, 8, 3)}
    if head_dim <= 128:
        return {"dkdv": _c(32, 64, 4, 2) if causal else _c(64, 128, 8, 3), "dq": _c(128, 64, 8, 3)}
    return {"dkdv": _c(32, 64, 4, 2), "dq": _c(64, 32, 4, 2)}


def flash_attn_backward(dout, q, k, v, out, lse, softmax_scale: float, causal: bool,
                        causal_shift: int | None = None, config: dict | None = None,
                        dq=None, dk=None, dv=None):
    """Launch the three backward kernels. Returns (dq, dk, dv), contiguous, in the input dtypes.

    Layouts as in ``flash_attn_forward``; ``lse`` is the forward's natural-log LSE.
    ``dq``/``dk``/``dv`` may be given preallocated (tests pass NaN-filled buffers).
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if causal_shift is None:
        causal_shift = seqlen_k - seqlen_q
    if dout.stride(-1) != 1:
        # e.g. the expanded ones of loss = out.sum(): the kernels need a unit stride on headdim
        dout = dout.contiguous()
    lse = lse.contiguous()  # the kernels address rows as (batch*nheads + h) * seqlen_q + m
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if dv is None else dv
    if q.numel() == 0 or k.numel() == 0:
        # no query or no key: every gradient is zero, nothing to launch
        return dq.zero_(), dk.zero_(), dv.zero_()
    if config is None:
        config = INTERPRET_BWD_CONFIG if interpreting() else default_bwd_config(head_dim, causal)
    block_d = block_d_for(head_dim)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    delta = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    pre_m = 64 if not interpreting() else 32
    _bwd_preprocess[(triton.cdiv(seqlen_q, pre_m), batch * nheads)](
        out, dout, delta,
        out.stride(0), out.stride(1), out.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        nheads, seqlen_q, HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=pre_m,
    )
    common = dict(IS_CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_D=block_d, DOT_PRECISION=precision)
    c = config["dkdv"]
    _bwd_dkdv[(triton.cdiv(seqlen_k, c["BLOCK_N"]), batch * nheads_k)](
        q, k, v, dout, lse, delta, dk, dv,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        dk.stride(0), dk.stride(1), dk.stride(2),
        dv.stride(0), dv.stride(1), dv.stride(2),
        nheads, nheads_k, seqlen_q, seqlen_k, causal_shift, nheads // nheads_k,
        softmax_scale * LOG2E, softmax_scale, **common, **c,
    )
    c = config["dq"]
    _bwd_dq[(triton.cdiv(seqlen_q, c["BLOCK_M"]), batch * nheads)](
        q, k, v, dout, lse, delta, dq,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2),
        dq.stride(0), dq.stride(1), dq.stride(2),
        nheads, seqlen_q, seqlen_k, causal_shift, nheads // nheads_k,
        softmax_scale * LOG2E, softmax_scale, **common, **c,
    )
    return dq, dk, dv
