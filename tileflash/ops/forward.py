"""FlashAttention forward in Triton: tiling + online softmax, LSE saved for the backward.

Order in this file: the ``@triton.jit`` inner loop and kernel, then the host launcher.

Numerics conventions (shared by every kernel in ``tileflash.ops``):

* ``qk_scale = softmax_scale * log2(e)`` is folded into the scores once, so the
  softmax uses ``exp2`` instead of ``exp``.
* The running max ``m_i`` and the LSE are base-2 inside the kernel; the LSE is
  converted to natural log (``* ln 2``) when stored, so every op boundary speaks
  natural-log LSE (flash-attn's ``softmax_lse``).
* ``m_i`` may be ``-inf`` for a row that has seen no visible key yet; the value
  subtracted before ``exp2`` is then replaced by 0 (``m_use``), so a fully
  masked row keeps ``l_i = 0`` and ``acc = 0`` and gives out = 0, lse = -inf, never NaN.
* Accumulation (``acc``, ``l_i``, scores) is fp32; ``P`` is cast to V's dtype
  for the second matmul, as in FA2.

Tensors are addressed as ``(batch, seqlen, nheads, headdim)`` with arbitrary
strides and a unit stride on ``headdim``; the SDPA layout is the same memory
seen through a transpose, so it needs no copy either.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, b_q,          # [BLOCK_M, BLOCK_D] fp32, [BLOCK_M] fp32, [BLOCK_M] fp32, [BLOCK_M, BLOCK_D]
    k_base, v_base, stride_kn, stride_vn,
    o_m, o_d, m_d, lo, hi, seqlen_k, causal_shift, qk_scale,
    MASK: tl.constexpr, IS_CAUSAL: tl.constexpr, PAD_D: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Fold the K/V blocks starting in [lo, hi) into (acc, l_i, m_i).

    MASK=False: blocks fully inside seqlen_k and fully visible: no mask math.
    MASK=True:  the causal-diagonal and ragged-tail blocks, masked per element.
    """
    o_nb = tl.arange(0, BLOCK_N)                                                      # [BLOCK_N]
    for start_n in range(lo, hi, BLOCK_N):
        # lo/hi are int64, so start_n * stride cannot overflow past 2^31 elements.
        p_kt = k_base + start_n * stride_kn + o_nb[None, :] * stride_kn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
        p_v = v_base + start_n * stride_vn + o_nb[:, None] * stride_vn + o_d[None, :]   # [BLOCK_N, BLOCK_D]
        o_n = start_n + o_nb                                                          # [BLOCK_N]
        if MASK:
            m_n = o_n < seqlen_k                                                      # [BLOCK_N]
            b_kt = tl.load(p_kt, mask=m_n[None, :] & m_d[:, None], other=0.0)         # [BLOCK_D, BLOCK_N]
            b_v = tl.load(p_v, mask=m_n[:, None] & m_d[None, :], other=0.0)           # [BLOCK_N, BLOCK_D]
        elif PAD_D:
            b_kt = tl.load(p_kt, mask=m_d[:, None], other=0.0)
            b_v = tl.load(p_v, mask=m_d[None, :], other=0.0)
        else:
            b_kt = tl.load(p_kt)
            b_v = tl.load(p_v)
        b_s = tl.dot(b_q, b_kt, input_precision=DOT_PRECISION) * qk_scale             # [BLOCK_M, BLOCK_N] base-2 scores
        if MASK:
            m_s = m_n[None, :]                                                        # [1, BLOCK_N]
            if IS_CAUSAL:
                # bottom-right alignment: query i sees key j iff j <= i + seqlen_k - seqlen_q
                m_s = m_s & (o_n[None, :] <= o_m[:, None] + causal_shift)             # [BLOCK_M, BLOCK_N]
            b_s = tl.where(m_s, b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))                                       # [BLOCK_M]
        # keep the subtracted max finite so rows with no visible key stay 0, not NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)                          # [BLOCK_M]
        b_p = tl.math.exp2(b_s - m_use[:, None])                                      # [BLOCK_M, BLOCK_N]
        alpha = tl.math.exp2(m_i - m_use)                                             # [BLOCK_M]
        l_i = l_i * alpha + tl.sum(b_p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc, input_precision=DOT_PRECISION)     # [BLOCK_M, BLOCK_D]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "causal_shift"])
def _attn_fwd(
    Q, K, V, O, LSE,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    nheads, seqlen_q, seqlen_k, causal_shift, kv_group, qk_scale,
    SQ_BUCKET, SK_BUCKET,  # autotune key only: bucketed lengths, so a new length reuses a tuned config
    IS_CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program per (Q block, batch*head): FA2's sequence parallelism."""
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        # the last Q blocks see the most keys: launch them first to shorten the tail
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    off_hk = off_h // kv_group                     # GQA: query head h reads kv head h // (H / H_k)
    start_m = pid_m * BLOCK_M

    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM     # head dim padded to a power of two inside the kernel only
    o_mb = tl.arange(0, BLOCK_M)                                                      # [BLOCK_M]
    o_m = start_m + o_mb                                                              # [BLOCK_M]
    o_d = tl.arange(0, BLOCK_D)                                                       # [BLOCK_D]
    m_d = o_d < HEAD_DIM                                                                # [BLOCK_D]
    m_m = o_m < seqlen_q                                                              # [BLOCK_M]

    q_base = Q + off_b * stride_qb + off_h * stride_qh + start_m.to(tl.int64) * stride_qm
    k_base = K + off_b * stride_kb + off_hk * stride_kh
    v_base = V + off_b * stride_vb + off_hk * stride_vh
    p_q = q_base + o_mb[:, None] * stride_qm + o_d[None, :]                           # [BLOCK_M, BLOCK_D]
    b_q = tl.load(p_q, mask=m_m[:, None] & m_d[None, :], other=0.0)                  # [BLOCK_M, BLOCK_D]

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)                              # [BLOCK_M, BLOCK_D]
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                                       # [BLOCK_M]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)                         # [BLOCK_M]

    n_whole = (seqlen_k // BLOCK_N) * BLOCK_N      # keys in blocks that lie inside seqlen_k
    if IS_CAUSAL:
        # keys visible to the block's first row: [0, start_m + shift]; to its last row: [0, start_m + BLOCK_M - 1 + shift]
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + causal_shift, 0), seqlen_k)
        full_hi = tl.minimum((tl.maximum(start_m + causal_shift + 1, 0) // BLOCK_N) * BLOCK_N, n_whole)
        full_hi = tl.minimum(full_hi, hi)
    else:
        hi = seqlen_k
        full_hi = n_whole
    hi = hi.to(tl.int64)
    full_hi = full_hi.to(tl.int64)
    zero = full_hi * 0
    # Off-diagonal, in-range blocks: no masks. Blocks above the causal diagonal are never loaded.
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, b_q, k_base, v_base, stride_kn, stride_vn,
        o_m, o_d, m_d, zero, full_hi, seqlen_k, causal_shift, qk_scale,
        MASK=False, IS_CAUSAL=IS_CAUSAL, PAD_D=PAD_D,
        BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
    )
    # Diagonal and ragged-tail blocks: masked.
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, b_q, k_base, v_base, stride_kn, stride_vn,
        o_m, o_d, m_d, full_hi, hi, seqlen_k, causal_shift, qk_scale,
        MASK=True, IS_CAUSAL=IS_CAUSAL, PAD_D=True,
        BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
    )

    # Epilogue: normalise; a row with no visible key has l_i = 0 and acc = 0 -> out = 0.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                                           # [BLOCK_M]
    b_o = acc / l_safe[:, None]                                                       # [BLOCK_M, BLOCK_D]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)  # [BLOCK_M] natural log
    p_o = O + off_b * stride_ob + off_h * stride_oh + start_m.to(tl.int64) * stride_om \
        + o_mb[:, None] * stride_om + o_d[None, :]                                    # [BLOCK_M, BLOCK_D]
    tl.store(p_o, b_o.to(O.dtype.element_ty), mask=m_m[:, None] & m_d[None, :])
    p_lse = LSE + pid_bh.to(tl.int64) * seqlen_q + o_m                                # [BLOCK_M]
    tl.store(p_lse, lse, mask=m_m)


# ----------------------------------------------------------------------------------------------
# Tuning: a small per-head-dim list, pruned by shared memory, keyed on bucketed lengths.
# ----------------------------------------------------------------------------------------------

def _cfg(bm, bn, w, s):
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=s)


FWD_CONFIGS = [
    _cfg(bm, bn, w, s)
    for (bm, bn, w, s) in [
        (128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 32, 4, 3),
        (64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 2),
    ]
]


def default_config(head_dim: int) -> dict:
    """The config used without autotuning (first call costs one compile, no benchmarking)."""
    if head_dim <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)


def autotune_enabled() -> bool:
    """TILEFLASH_AUTOTUNE=1 benchmarks FWD_CONFIGS once per (length bucket, head dim, causal, dtype)."""
    return os.environ.get("TILEFLASH_AUTOTUNE", "0") == "1"


# Shared memory we allow a config to plan for (H100/H200 offer 227 KB per block).
_SMEM_BUDGET = 200 * 1024


def smem_estimate(block_m, block_n, block_d, elem_bytes, stages):
    """Bytes of shared memory a forward config needs: the Q tile plus `stages` K and V tiles."""
    return elem_bytes * (block_m * block_d + stages * 2 * block_n * block_d)


def prune_fwd_configs(configs, named_args, **kwargs):
    """Drop configs that cannot fit (shared memory) or that waste work at this head dim."""
    block_d = kwargs.get("BLOCK_D", named_args.get("BLOCK_D"))
    elem = named_args["Q"].element_size()
    kept = []
    for c in configs:
        bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        if smem_estimate(bm, bn, block_d, elem, c.num_stages) > _SMEM_BUDGET:
            continue
        if block_d >= 256 and bm * bn > 128 * 64:
            continue  # register pressure: the fp32 acc and scores spill at D=256
        kept.append(c)
    return kept or [_cfg(32, 32, 4, 1)]


_attn_fwd_tuned = triton.autotune(
    configs=FWD_CONFIGS,
    key=["SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "IS_CAUSAL", "DOT_PRECISION"],
    prune_configs_by={"early_config_prune": prune_fwd_configs},
)(_attn_fwd)

# The interpreter (CPU CI) runs one fixed small config; BLOCK_M != BLOCK_N exercises a causal
# diagonal that spans several K blocks.
INTERPRET_FWD_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 16}


def _built_for_interpreter() -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_attn_fwd, InterpretedFunction)


# Triton decides interpreter-or-GPU when a kernel is decorated, i.e. at import; read it once.
_KERNELS_INTERPRETED = _built_for_interpreter()


def interpreting() -> bool:
    """True when the Triton kernels were built for the CPU interpreter (TRITON_INTERPRET=1 at import)."""
    return _KERNELS_INTERPRETED


def block_d_for(head_dim: int) -> int:
    return max(16, triton.next_power_of_2(head_dim))


def flash_attn_forward(q, k, v, softmax_scale: float, causal: bool, causal_shift: int | None = None,
                       config: dict | None = None, out: torch.Tensor | None = None,
                       lse: torch.Tensor | None = None):
    """Launch the forward kernel. Inputs are validated by ``tileflash.interface``.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim),
    unit stride on headdim. Returns ``out`` (contiguous, q's shape and dtype) and
    ``lse`` (batch, nheads, seqlen_q) float32, natural log.
    With ``causal``, query i sees key j iff ``j <= i + causal_shift``; the default shift
    ``seqlen_k - seqlen_q`` is flash-attn's bottom-right alignment, 0 is torch's top-left.
    ``config`` pins BLOCK_M/BLOCK_N (and optionally num_warps/num_stages) instead of autotuning.
    ``out``/``lse`` may be given preallocated (contiguous; tests pass NaN-filled buffers to
    prove that the kernel writes every element).
    """
    batch, seqlen_q, nheads, head_dim = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    if causal_shift is None:
        causal_shift = seqlen_k - seqlen_q
    if out is None:
        out = torch.empty((batch, seqlen_q, nheads, head_dim), dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty((batch, nheads, seqlen_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse  # nothing to compute: no launch
    if seqlen_k == 0:
        # every query sees no key: out = 0 and lse = -inf by definition, no launch
        return out.zero_(), lse.fill_(float("-inf"))
    args = (
        q, k, v, out, lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        nheads, seqlen_q, seqlen_k, causal_shift, nheads // nheads_k, softmax_scale * LOG2E,
        triton.next_power_of_2(seqlen_q), triton.next_power_of_2(seqlen_k),
    )
    meta = dict(
        IS_CAUSAL=bool(causal), HEAD_DIM=head_dim, BLOCK_D=block_d_for(head_dim),
        # fp32 inputs: true fp32 products (tf32 would lose ~3 decimal digits)
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
    )
    if config is None and interpreting():
        config = INTERPRET_FWD_CONFIG
    if config is None and not autotune_enabled():
        config = default_config(head_dim)
    if config is None:
        grid = lambda META: (triton.cdiv(seqlen_q, META["BLOCK_M"]), batch * nheads)  # noqa: E731
        _attn_fwd_tuned[grid](*args, **meta)
    else:
        grid = (triton.cdiv(seqlen_q, config["BLOCK_M"]), batch * nheads)
        _attn_fwd[grid](*args, **meta, **config)
    return out, lse
