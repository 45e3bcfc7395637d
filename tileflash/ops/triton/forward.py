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

import functools

import torch
import triton
import triton.language as tl

from tileflash.ops.triton.common import (LN2_C, block_ids, dropout_keep, head_scalars, kv_block_range, score_mods,
                                         seq_bounds, visible)
from tileflash.ops.utils import (LOG2E, block_grid, cdiv, feature_args, next_pow2, problem_dims, rng_strides,
                                 strides3)

@triton.jit
def _fwd_inner(
    acc, l_i, m_i, b_q,          # [BLOCK_M, BLOCK_D] fp32, [BLOCK_M] fp32, [BLOCK_M] fp32, [BLOCK_M, BLOCK_D]
    k_base, v_base, stride_kn, stride_vn,
    o_m, o_d, m_d, lo, hi, seqlen_k, shift, window_left, window_right,
    qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m, dropout_p,
    MASK: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, PAD_D: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr, USE_TMA: tl.constexpr = False,
    RAW_MAX: tl.constexpr = False,
):
    """Fold the K/V blocks starting in [lo, hi) into (acc, l_i, m_i).

    MASK=False: blocks fully inside seqlen_k and fully visible: no mask math.
    MASK=True:  the window/causal-edge and ragged-tail blocks, masked per element.
    USE_TMA: k_base/v_base are tensor descriptors of this (sequence, kv head) (seqlen_k, HEAD_DIM);
    the copy engine zero-fills rows past seqlen_k and columns past HEAD_DIM, so no load masks.
    RAW_MAX (scale > 0, no softcap/ALiBi): unmasked blocks take the row max of the raw products,
    so that x·scale − m is one FMA per element and no -inf guard is needed (every score is finite).
    """
    o_nb = tl.arange(0, BLOCK_N)                                                      # [BLOCK_N]
    for start_n in range(lo, hi, BLOCK_N):
        if USE_TMA:
            b_kt = tl.trans(k_base.load([tl.cast(start_n, tl.int32), 0]))                   # [BLOCK_D, BLOCK_N]
            b_v = v_base.load([tl.cast(start_n, tl.int32), 0])                              # [BLOCK_N, BLOCK_D]
            o_n = start_n + o_nb                                                      # [BLOCK_N]
            if MASK:
                m_n = o_n < seqlen_k                                                  # [BLOCK_N]
        else:
            # lo/hi are int64, so start_n * stride cannot overflow past 2^31 elements.
            p_kt = k_base + start_n * stride_kn + o_nb[None, :] * stride_kn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
            p_v = v_base + start_n * stride_vn + o_nb[:, None] * stride_vn + o_d[None, :]   # [BLOCK_N, BLOCK_D]
            o_n = start_n + o_nb                                                      # [BLOCK_N]
            if MASK:
                m_n = o_n < seqlen_k                                                  # [BLOCK_N]
                b_kt = tl.load(p_kt, mask=m_n[None, :] & m_d[:, None], other=0.0)     # [BLOCK_D, BLOCK_N]
                b_v = tl.load(p_v, mask=m_n[:, None] & m_d[None, :], other=0.0)       # [BLOCK_N, BLOCK_D]
            elif PAD_D:
                b_kt = tl.load(p_kt, mask=m_d[:, None], other=0.0)
                b_v = tl.load(p_v, mask=m_d[None, :], other=0.0)
            else:
                b_kt = tl.load(p_kt)
                b_v = tl.load(p_v)
        b_x = tl.dot(b_q, b_kt, input_precision=DOT_PRECISION)                       # [BLOCK_M, BLOCK_N] raw q·k
        if RAW_MAX and not MASK:
            # max(x)·scale = max(x·scale) for scale > 0; finite scores: no -inf guard
            m_new = tl.maximum(m_i, tl.max(b_x, 1) * qk_scale)                       # [BLOCK_M]
            b_p = tl.math.exp2(b_x * qk_scale - m_new[:, None])                      # [BLOCK_M, BLOCK_N] (FMA)
            alpha = tl.math.exp2(m_i - m_new)                                         # [BLOCK_M]
        else:
            rel = o_m[:, None] + shift - o_n[None, :]                                 # [BLOCK_M, BLOCK_N] i + shift - j
            b_s, b_t = score_mods(b_x, rel, qk_scale, softcap_scale, softcap2, slope2,
                                  HAS_SOFTCAP, HAS_ALIBI)                             # [BLOCK_M, BLOCK_N] base 2
            if MASK:
                m_s = m_n[None, :] & visible(rel, window_left, window_right, HAS_LEFT, HAS_RIGHT)
                b_s = tl.where(m_s, b_s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, 1))                                   # [BLOCK_M]
            # keep the subtracted max finite so rows with no visible key stay 0, not NaN
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)                      # [BLOCK_M]
            b_p = tl.math.exp2(b_s - m_use[:, None])                                  # [BLOCK_M, BLOCK_N]
            alpha = tl.math.exp2(m_i - m_use)                                         # [BLOCK_M]
        l_i = l_i * alpha + tl.sum(b_p, 1)  # the softmax denominator ignores dropout
        acc = acc * alpha[:, None]
        if HAS_DROPOUT:
            # Philox keyed on (seed, b·h, i, j): the backward regenerates the same mask
            keep = dropout_keep(seed, rng_base, o_m[:, None], o_n[None, :], rng_stride_m, dropout_p)
            b_p = tl.where(keep, b_p / (1.0 - dropout_p), 0.0)                       # [BLOCK_M, BLOCK_N]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc, input_precision=DOT_PRECISION)     # [BLOCK_M, BLOCK_D]
        m_i = m_new
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_k", "causal_shift", "window_left", "window_right",
                             "rng_stride_bh", "rng_stride_m"])
def _attn_fwd(
    Q, K, V, O, LSE, ALIBI, CU_Q, CU_K, SEED,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh, stride_ab, stride_ah,
    nheads, seqlen_q, seqlen_k, causal_shift, window_left, window_right, kv_group,
    qk_scale, softcap_scale, softcap2, dropout_p, rng_stride_bh, rng_stride_m,
    SQ_BUCKET, SK_BUCKET,  # autotune key only: bucketed lengths, so a new length reuses a tuned config
    HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, IS_VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr = False, RAW_MAX: tl.constexpr = False,
    FLAT_GRID: tl.constexpr = False,
):
    """One program per (Q block, batch*head): FA2's sequence parallelism. The grid is (Q blocks,
    batch*heads), or one flat axis of both where batch*heads exceeds 65535 (FLAT_GRID,
    ``common.block_grid``).

    USE_TMA (sm90+; the default on Hopper): Q, K, V and O move through tensor descriptors (the TMA copy engine)
    built per program over this (sequence, head): out-of-range rows and padded columns are
    zero-filled on load and dropped on store by the hardware.

    Dense: tensors are (batch, seqlen, nheads, headdim), LSE (batch, nheads, seqlen_q).
    Varlen (IS_VARLEN): tensors are (total, nheads, headdim) with batch stride 0, sequence b
    is rows [cu[b], cu[b+1]); LSE is (nheads, total_q). seqlen_q/k are then the maxima.
    """
    # with a causal/right bound the last Q blocks see the most keys: launch them first
    pid_m, pid_bh = block_ids(seqlen_q, BLOCK_M, HAS_RIGHT, FLAT_GRID)
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    off_hk = off_h // kv_group                     # GQA: query head h reads kv head h // (H / H_k)
    start_m = pid_m * BLOCK_M
    q_start, k_start, seqlen_q, seqlen_k, shift = seq_bounds(
        CU_Q, CU_K, off_b, seqlen_q, seqlen_k, causal_shift, IS_VARLEN)
    if start_m >= seqlen_q:
        return  # varlen: this sequence is shorter than the longest one

    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM     # head dim padded to a power of two inside the kernel only
    o_mb = tl.arange(0, BLOCK_M)                                                      # [BLOCK_M]
    o_m = start_m + o_mb                                                              # [BLOCK_M]
    o_d = tl.arange(0, BLOCK_D)                                                       # [BLOCK_D]
    m_d = o_d < HEAD_DIM                                                              # [BLOCK_D]
    m_m = o_m < seqlen_q                                                              # [BLOCK_M]
    slope2, seed = head_scalars(ALIBI, SEED, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI, HAS_DROPOUT)
    rng_base = pid_bh.to(tl.int64) * rng_stride_bh

    row0 = q_start + start_m
    q_base = Q + off_b * stride_qb + off_h * stride_qh + row0 * stride_qm
    k_base = K + off_b * stride_kb + off_hk * stride_kh + k_start * stride_kn
    v_base = V + off_b * stride_vb + off_hk * stride_vh + k_start * stride_vn
    if USE_TMA:
        # descriptors over this sequence's rows of head h (Q, O) / kv head hk (K, V)
        q_rows = Q + off_b * stride_qb + off_h * stride_qh + q_start * stride_qm
        q_desc = tl.make_tensor_descriptor(q_rows, shape=[seqlen_q, HEAD_DIM], strides=[stride_qm, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        k_src = tl.make_tensor_descriptor(k_base, shape=[seqlen_k, HEAD_DIM], strides=[stride_kn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_base, shape=[seqlen_k, HEAD_DIM], strides=[stride_vn, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        b_q = q_desc.load([start_m, 0])                                               # [BLOCK_M, BLOCK_D]
    else:
        k_src = k_base
        v_src = v_base
        p_q = q_base + o_mb[:, None] * stride_qm + o_d[None, :]                       # [BLOCK_M, BLOCK_D]
        b_q = tl.load(p_q, mask=m_m[:, None] & m_d[None, :], other=0.0)              # [BLOCK_M, BLOCK_D]

    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)                              # [BLOCK_M, BLOCK_D]
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)                                       # [BLOCK_M]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)                         # [BLOCK_M]

    # Keys outside [lo, hi) are invisible to every row of this block and are never loaded.
    lo, a, b, hi = kv_block_range(start_m, seqlen_k, shift, window_left, window_right,
                                  HAS_LEFT, HAS_RIGHT, BLOCK_M, BLOCK_N)
    if HAS_LEFT:  # left window edge: masked (without a left bound lo = a = 0: not even compiled)
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, b_q, k_src, v_src, stride_kn, stride_vn, o_m, o_d, m_d, lo, a, seqlen_k, shift,
            window_left, window_right, qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m,
            dropout_p, MASK=True, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP,
            HAS_ALIBI=HAS_ALIBI, HAS_DROPOUT=HAS_DROPOUT, PAD_D=True, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
            USE_TMA=USE_TMA,
        )
    acc, l_i, m_i = _fwd_inner(  # fully visible, in-range blocks: no masks
        acc, l_i, m_i, b_q, k_src, v_src, stride_kn, stride_vn, o_m, o_d, m_d, a, b, seqlen_k, shift,
        window_left, window_right, qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m,
        dropout_p, MASK=False, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP,
        HAS_ALIBI=HAS_ALIBI, HAS_DROPOUT=HAS_DROPOUT, PAD_D=PAD_D, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
        USE_TMA=USE_TMA, RAW_MAX=RAW_MAX,
    )
    acc, l_i, m_i = _fwd_inner(  # causal/right edge and ragged tail: masked
        acc, l_i, m_i, b_q, k_src, v_src, stride_kn, stride_vn, o_m, o_d, m_d, b, hi, seqlen_k, shift,
        window_left, window_right, qk_scale, softcap_scale, softcap2, slope2, seed, rng_base, rng_stride_m,
        dropout_p, MASK=True, HAS_LEFT=HAS_LEFT, HAS_RIGHT=HAS_RIGHT, HAS_SOFTCAP=HAS_SOFTCAP,
        HAS_ALIBI=HAS_ALIBI, HAS_DROPOUT=HAS_DROPOUT, PAD_D=True, BLOCK_N=BLOCK_N, DOT_PRECISION=DOT_PRECISION,
        USE_TMA=USE_TMA,
    )

    # Epilogue: normalise; a row with no visible key has l_i = 0 and acc = 0 -> out = 0.
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)                                           # [BLOCK_M]
    b_o = acc / l_safe[:, None]                                                       # [BLOCK_M, BLOCK_D]
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * LN2_C)  # [BLOCK_M] natural log
    if USE_TMA:
        o_rows = O + off_b * stride_ob + off_h * stride_oh + q_start * stride_om
        o_desc = tl.make_tensor_descriptor(o_rows, shape=[seqlen_q, HEAD_DIM], strides=[stride_om, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        o_desc.store([start_m, 0], b_o.to(O.dtype.element_ty))
    else:
        p_o = O + off_b * stride_ob + off_h * stride_oh + row0 * stride_om \
            + o_mb[:, None] * stride_om + o_d[None, :]                                # [BLOCK_M, BLOCK_D]
        tl.store(p_o, b_o.to(O.dtype.element_ty), mask=m_m[:, None] & m_d[None, :])
    p_lse = LSE + off_b * stride_lb + off_h * stride_lh + q_start + o_m               # [BLOCK_M]
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


def default_config(head_dim: int, causal: bool = False, tma: bool = False) -> dict:
    """The config used without autotuning (first call costs one compile, no benchmarking).

    tma: the tensor-descriptor path, whose configs come from ``tools/fwd_sweep.py`` on an H200
    (fp16, N = 4k and 16k; docs/perf-notes.md): it frees registers, so 128-wide K/V tiles pay off
    where the pointer path spills. causal: also any right window bound (the masked diagonal)."""
    if tma and head_dim <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3) if causal else \
            dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=3)
    if tma and head_dim <= 128:
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3) if causal else \
            dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    if head_dim <= 64:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3)
    if head_dim <= 128:
        return dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)


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
    key=["SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "HAS_LEFT", "HAS_RIGHT", "HAS_SOFTCAP", "HAS_ALIBI", "HAS_DROPOUT",
         "IS_VARLEN", "DOT_PRECISION", "USE_TMA", "RAW_MAX"],
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
    return max(16, next_pow2(head_dim))


@functools.lru_cache(maxsize=None)
def _cc_major(device_index) -> int:
    """The compute capability's major version (9: Hopper), read once per device (hot path)."""
    return torch.cuda.get_device_capability(device_index)[0]


def tma_requested(config=None, device=None, use_tma=None) -> bool:
    """Whether the forward asks for tensor descriptors (TMA); :func:`tma_supported` then decides
    per call (16-byte aligned layouts, sm90+, a triton with ``tl.make_tensor_descriptor``),
    falling back to pointers otherwise.

    ``config["USE_TMA"]`` if given; else ``use_tma`` (``Options.use_tma``) if not None; else on
    for compiled kernels on Hopper (sm90, where it measured faster: docs/perf-notes.md), and off
    elsewhere: in the CPU interpreter, so CI keeps covering the pointer path (the TMA tests opt
    in), and on other GPUs, where it was never measured."""
    if config is not None and "USE_TMA" in config:
        return bool(config["USE_TMA"])
    if use_tma is not None:
        return bool(use_tma)
    if interpreting() or device is None or device.type != "cuda":
        return False
    return _cc_major(device.index if device.index is not None else torch.cuda.current_device()) == 9


def tma_supported(*tensors) -> bool:
    """TMA needs sm90+, 16-byte aligned base addresses and 16-byte multiples for every stride but
    the last (1). The interpreter emulates descriptors on any device but checks the same layout
    rules, so only the GPU-generation check is skipped there."""
    if not hasattr(tl, "make_tensor_descriptor"):
        return False  # triton < 3.4
    if not interpreting() and (not all(t.is_cuda for t in tensors)
                               or _cc_major(tensors[0].device.index) < 9):
        return False
    for t in tensors:
        e = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any((s * e) % 16 for s in t.stride()[:-1]):
            return False
    return True


def _torch_scratch(size, alignment, stream):
    return torch.empty(size, dtype=torch.int8, device=torch.cuda.current_device())


def _ensure_tma_allocator():
    """Descriptors built inside a kernel need global scratch (128 B per descriptor per program),
    which triton asks of the allocator set with triton.set_allocator. That setting is per thread
    (a ContextVar), so it is checked on every call: a forward recomputed on autograd's worker
    thread, or a server's request thread, gets one too. An allocator already set is kept."""
    try:
        from triton.runtime import _allocation

        unset = isinstance(_allocation._allocator.get(), _allocation.NullAllocator)
    except (ImportError, AttributeError):  # another triton layout: set it every time
        unset = True
    if unset:
        triton.set_allocator(_torch_scratch)


@triton.jit
def _copy_head_cols(
    SRC, DST,
    stride_sb, stride_ss, stride_sh,
    stride_db, stride_ds, stride_dh,
    nheads, seqlen,
    SRC_COLS: tl.constexpr, DST_COLS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_S: tl.constexpr,
    FLAT_GRID: tl.constexpr = False,
):
    """DST[b, s, h, :DST_COLS] = SRC[b, s, h, :DST_COLS], zeros past SRC_COLS: the zero-padded
    copies of a padded head dim's Gluon forward and backward, and the forward's output copied
    back (:func:`copy_cols`). Grid: (S blocks, batch*heads),
    ``common.block_grid``."""
    pid_s, pid_bh = block_ids(seqlen, BLOCK_S, False, FLAT_GRID)
    off_b = (pid_bh // nheads).to(tl.int64)
    off_h = (pid_bh % nheads).to(tl.int64)
    o_s = (pid_s * BLOCK_S + tl.arange(0, BLOCK_S)).to(tl.int64)                     # [BLOCK_S]
    o_c = tl.arange(0, BLOCK_C)                                                       # [BLOCK_C]
    m_s = (o_s < seqlen)[:, None]                                                     # [BLOCK_S, 1]
    p_src = SRC + off_b * stride_sb + off_h * stride_sh + o_s[:, None] * stride_ss + o_c[None, :]
    p_dst = DST + off_b * stride_db + off_h * stride_dh + o_s[:, None] * stride_ds + o_c[None, :]
    x = tl.load(p_src, mask=m_s & (o_c < SRC_COLS)[None, :], other=0.0)               # [BLOCK_S, BLOCK_C]
    tl.store(p_dst, x, mask=m_s & (o_c < DST_COLS)[None, :])


def copy_cols(src, dst):
    """dst (B, S, H, Dd) = the first Dd columns of src (B, S, H, Ds), zeros where Dd > Ds, in one
    launch (torch's copies into column slices ran at 1.4 TB/s on the H200, this kernel at 3.5).
    dst's columns must be contiguous."""
    if src.stride(-1) != 1:
        src = src.contiguous()
    batch, seqlen, nheads, cols = dst.shape
    block_s = 64 if not interpreting() else 16
    grid, flat = block_grid(cdiv(seqlen, block_s), batch * nheads)
    _copy_head_cols[grid](src, dst, src.stride(0), src.stride(1), src.stride(2), dst.stride(0), dst.stride(1),
                          dst.stride(2), nheads, seqlen, SRC_COLS=src.shape[-1], DST_COLS=cols,
                          BLOCK_C=next_pow2(max(cols, src.shape[-1])), BLOCK_S=block_s, FLAT_GRID=flat)


def pad_head_dim(t, width: int):
    """A (B, S, H, width) contiguous copy of t (B, S, H, D), D <= width, whose columns past D are 0
    (``tileflash.ops.route``)."""
    padded = torch.empty(t.shape[:-1] + (width,), dtype=t.dtype, device=t.device)
    copy_cols(t, padded)
    return padded


def flash_attn_forward(q, k, v, softmax_scale: float, causal: bool, causal_shift: int | None = None, *,
                       window=(-1, -1), softcap: float = 0.0, alibi_slopes=None, dropout_p: float = 0.0,
                       seed=None, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
                       config: dict | None = None, out: torch.Tensor | None = None,
                       lse: torch.Tensor | None = None, use_tma: bool | None = None, autotune: bool = False):
    """Launch the forward kernel. Inputs are validated by ``tileflash.interface``.

    Dense: q (batch, seqlen_q, nheads, headdim); k, v (batch, seqlen_k, nheads_k, headdim);
    returns out (contiguous, q's shape and dtype) and lse (batch, nheads, seqlen_q) fp32, natural
    log. Varlen (``cu_seqlens_q/k`` given, int32 (batch + 1,)): q (total_q, nheads, headdim),
    k/v (total_k, nheads_k, headdim); lse is (nheads, total_q).
    Query i sees key j iff ``-right <= i + shift - j <= left`` for ``window = (left, right)``
    (-1: unbounded; causal forces right = 0); dense shift = ``causal_shift`` (default
    seqlen_k - seqlen_q, flash-attn's bottom-right; 0 is torch's top-left), varlen: per sequence.
    ``config`` pins BLOCK_M/BLOCK_N (and optionally num_warps/num_stages) instead of autotuning;
    Q/K/V/O move through tensor descriptors (TMA) where :func:`tma_supported` allows it (sm90+,
    16-byte aligned layouts), by default on Hopper (sm90); ``config["USE_TMA"]`` or ``use_tma``
    overrides (:func:`tma_requested`). ``autotune``: benchmark FWD_CONFIGS once per (length bucket,
    head dim, flags, dtype) instead of :func:`default_config`.
    ``out``/``lse`` may be given preallocated (tests pass NaN-filled buffers to prove that the
    kernel writes every element).
    This launcher runs the Triton kernel only; ``tileflash.ops.route`` decides when the Gluon
    kernels run instead.
    """
    varlen, batch, seqlen_q, seqlen_k, lse_shape, lse_strides = problem_dims(q, k, cu_seqlens_q, max_seqlen_q,
                                                                             max_seqlen_k)
    nheads, head_dim, nheads_k = q.shape[-2], q.shape[-1], k.shape[-2]
    if causal_shift is None:
        causal_shift = seqlen_k - seqlen_q
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if lse is None:
        lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if out.numel() == 0 or batch == 0 or seqlen_q == 0:
        return out, lse  # nothing to compute: no launch
    if seqlen_k == 0:
        # every query sees no key: out = 0 and lse = -inf by definition, no launch
        return out.zero_(), lse.fill_(float("-inf"))
    flags, sc, alibi_strides = feature_args(softmax_scale, causal, window, softcap, alibi_slopes, batch, dropout_p,
                                            seqlen_q + abs(causal_shift), seqlen_k + abs(causal_shift))
    args = (
        q, k, v, out, lse, alibi_slopes, cu_seqlens_q, cu_seqlens_k, seed if dropout_p > 0 else None,
        *strides3(q, varlen), *strides3(k, varlen), *strides3(v, varlen), *strides3(out, varlen),
        *lse_strides, *alibi_strides,
        nheads, seqlen_q, seqlen_k, causal_shift, sc["window_left"], sc["window_right"], nheads // nheads_k,
        softmax_scale * LOG2E, sc["softcap_scale"], sc["softcap2"], float(dropout_p), *rng_strides(seqlen_q, seqlen_k),
        next_pow2(seqlen_q), next_pow2(seqlen_k),
    )
    meta = dict(
        **flags, IS_VARLEN=varlen, HEAD_DIM=head_dim, BLOCK_D=block_d_for(head_dim),
        # fp32 inputs: true fp32 products (tf32 would lose ~3 decimal digits)
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        RAW_MAX=softmax_scale > 0 and not flags["HAS_SOFTCAP"] and not flags["HAS_ALIBI"],
    )
    # TMA path (falls back to pointers where descriptors are not possible)
    use_tma = tma_requested(config, q.device, use_tma) and tma_supported(q, k, v, out)
    if use_tma and q.is_cuda:
        _ensure_tma_allocator()
    meta["USE_TMA"] = use_tma
    if config is not None:
        config = {key: val for key, val in config.items() if key != "USE_TMA"} or None
    if config is None and interpreting():
        config = INTERPRET_FWD_CONFIG
    if config is None and not autotune:
        config = default_config(head_dim, causal=flags["HAS_RIGHT"], tma=use_tma)
    # batch*heads on grid axis 1, or one flat axis past its limit (65535)
    meta["FLAT_GRID"] = block_grid(1, batch * nheads)[1]
    if config is None:
        grid = lambda META: block_grid(cdiv(seqlen_q, META["BLOCK_M"]), batch * nheads)[0]  # noqa: E731
        _attn_fwd_tuned[grid](*args, **meta)
    else:
        _attn_fwd[block_grid(cdiv(seqlen_q, config["BLOCK_M"]), batch * nheads)[0]](*args, **meta, **config)
    return out, lse
