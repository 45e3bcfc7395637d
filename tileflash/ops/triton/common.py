"""Triton helpers shared by the forward and backward kernels: sequence bounds, score modifiers,
visibility masks and the block ranges that skip invisible work.

All masks are written in terms of ``rel = i + shift - j`` (query row i, key column j, shift =
seqlen_k - seqlen_q for flash-attn's bottom-right alignment). flash-attn 2's window
``(left, right)`` makes key j visible to query i iff ``-right <= rel <= left``; -1 means no bound
on that side (``HAS_LEFT`` / ``HAS_RIGHT`` false), and causal is ``right = 0``.
"""

import triton
import triton.language as tl

from tileflash.ops.utils import LN2, LOG2E

# the host constants as compile-time constants of the kernels
LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)
LN2_C: tl.constexpr = tl.constexpr(LN2)


@triton.jit
def block_ids(seqlen, BLOCK: tl.constexpr, REVERSE: tl.constexpr, FLAT_GRID: tl.constexpr):
    """(block index, batch·head index) of this program in the grid of :func:`block_grid`: the
    blocks of ``seqlen`` rows by ``BLOCK`` are grid axis 0 and batch·heads axis 1, or (FLAT_GRID)
    both are one axis with the blocks fastest. REVERSE: the last block first (causal calls start
    their longest programs first)."""
    if FLAT_GRID:
        n_blocks = tl.cdiv(seqlen, BLOCK)
        pid_n = tl.program_id(0) % n_blocks
        if REVERSE:
            pid_n = n_blocks - 1 - pid_n
        pid_bh = tl.program_id(0) // n_blocks
    else:
        pid_n = tl.program_id(0)
        if REVERSE:
            pid_n = tl.num_programs(0) - 1 - pid_n
        pid_bh = tl.program_id(1)
    return pid_n, pid_bh


@triton.jit
def seq_bounds(CU_Q, CU_K, off_b, seqlen_q, seqlen_k, causal_shift, IS_VARLEN: tl.constexpr):
    """(q_start, k_start, seqlen_q, seqlen_k, shift) of batch entry ``off_b``.

    Varlen: sequence b occupies rows [cu[b], cu[b+1]) of the packed tensors and is aligned
    bottom-right on its own lengths. Dense: rows start at 0 and ``causal_shift`` is used as is.
    """
    if IS_VARLEN:
        q_start = tl.load(CU_Q + off_b)
        k_start = tl.load(CU_K + off_b)
        seqlen_q = tl.load(CU_Q + off_b + 1) - q_start
        seqlen_k = tl.load(CU_K + off_b + 1) - k_start
        shift = seqlen_k - seqlen_q
        q_start = q_start.to(tl.int64)
        k_start = k_start.to(tl.int64)
    else:
        q_start = off_b * 0
        k_start = off_b * 0
        shift = causal_shift
    return q_start, k_start, seqlen_q, seqlen_k, shift


@triton.jit
def tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1), via exp2; saturates cleanly to ±1 for large |x|
    return 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def score_mods(b_x, rel, qk_scale, softcap_scale, softcap2, slope2,
               HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr):
    """Raw dot products -> base-2 scores, and tanh(u) for the softcap backward (else 0).

    softcap: s = softcap·tanh(x·scale/softcap); ALiBi: s -= slope·|rel|. Both in natural units,
    then ×log2(e) (folded into softcap2 = softcap·log2 e and slope2 = slope·log2 e).
    """
    if HAS_SOFTCAP:
        b_t = tanh(b_x * softcap_scale)
        b_s = b_t * softcap2
    else:
        b_t = b_x * 0.0
        b_s = b_x * qk_scale
    if HAS_ALIBI:
        b_s = b_s - slope2 * tl.abs(rel).to(tl.float32)
    return b_s, b_t


@triton.jit
def visible(rel, window_left, window_right, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr):
    """Window/causal visibility of (query, key) pairs from rel = i + shift - j."""
    vis = rel == rel
    if HAS_RIGHT:
        vis = vis & (rel >= -window_right)
    if HAS_LEFT:
        vis = vis & (rel <= window_left)
    return vis


@triton.jit
def kv_block_range(start_m, seqlen_k, shift, window_left, window_right,
                   HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key range [lo, hi) a Q block [start_m, start_m + BLOCK_M) can see, split at a <= b into
    masked [lo, a), unmasked [a, b) and masked [b, hi). lo, a, b are multiples of BLOCK_N; keys
    outside [lo, hi) are never loaded. Returned as int64 (they scale strides)."""
    n_whole = (seqlen_k // BLOCK_N) * BLOCK_N
    if HAS_RIGHT:
        hi = tl.minimum(tl.maximum(start_m + BLOCK_M + shift + window_right, 0), seqlen_k)
        full_hi = (tl.maximum(start_m + shift + window_right + 1, 0) // BLOCK_N) * BLOCK_N
    else:
        hi = seqlen_k + 0 * start_m
        full_hi = n_whole + 0 * start_m
    if HAS_LEFT:
        lo = (tl.minimum(tl.maximum(start_m + shift - window_left, 0), seqlen_k) // BLOCK_N) * BLOCK_N
        full_lo = ((tl.maximum(start_m + BLOCK_M - 1 + shift - window_left, 0) + BLOCK_N - 1) // BLOCK_N) * BLOCK_N
    else:
        lo = 0 * start_m
        full_lo = lo
    a = tl.minimum(tl.maximum(full_lo, lo), hi)
    b = tl.minimum(tl.maximum(tl.minimum(full_hi, n_whole), a), hi)
    return lo.to(tl.int64), a.to(tl.int64), b.to(tl.int64), hi.to(tl.int64)


@triton.jit
def q_block_range(start_n, seqlen_q, shift, window_left, window_right,
                  HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query rows [lo, hi) that see some key of the K block [start_n, start_n + BLOCK_N), split
    at a <= b into masked [lo, a), unmasked [a, b), masked [b, hi); multiples of BLOCK_M.
    Rows past seqlen_q need no mask in the backward (their lse is +inf, so P = 0)."""
    q_end = ((seqlen_q + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    if HAS_RIGHT:
        # rows i >= j - shift - right see key j
        lo = (tl.minimum(tl.maximum(start_n - shift - window_right, 0), q_end) // BLOCK_M) * BLOCK_M
        full_lo = ((tl.maximum(start_n + BLOCK_N - 1 - shift - window_right, 0) + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    else:
        lo = 0 * start_n
        full_lo = lo
    if HAS_LEFT:
        # rows i <= j - shift + left see key j
        hi = tl.minimum(tl.maximum(start_n + BLOCK_N + window_left - shift, 0), seqlen_q)
        full_hi = (tl.maximum(start_n + window_left - shift + 1, 0) // BLOCK_M) * BLOCK_M
    else:
        hi = q_end + 0 * start_n
        full_hi = hi
    a = tl.minimum(tl.maximum(full_lo, lo), hi)
    b = tl.minimum(tl.maximum(full_hi, a), hi)
    return lo, a, b, hi


@triton.jit
def dropout_keep(seed, rng_base, rows, cols, rng_stride_m, dropout_p):
    """Dropout's keep mask for (rows, cols) (any broadcastable orientation): Philox on the 64-bit
    counter rng_base + i·stride + j, so forward and backward regenerate the same bits."""
    offs = rng_base + rows.to(tl.int64) * rng_stride_m + cols
    return tl.rand(seed, offs) >= dropout_p


@triton.jit
def head_scalars(ALIBI, SEED, off_b, off_h, stride_ab, stride_ah, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr):
    """Per-(batch, head) scalars: the ALiBi slope ×log2(e) (0 without ALiBi) and the dropout seed."""
    slope2 = 0.0
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI + off_b * stride_ab + off_h * stride_ah) * LOG2E_C
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    return slope2, seed
