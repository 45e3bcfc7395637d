"""Hopper (sm90) forward in Gluon: asynchronous wgmma, so the softmax overlaps the tensor cores.

Why a second forward kernel. In ``tileflash.ops.triton.forward`` (plain Triton) every ``tl.dot`` on
Hopper ends in ``wgmma.wait_group 0``: the compiler keeps a wgmma in flight only when its result
feeds nothing but its own next accumulation, which is never true of attention's two matmuls. So
each step runs Q·Kᵀ, then the softmax on the MUFU/ALU units, then P·V, one after the other, and
triton 3.6's warp specialization compiles to nothing on sm90 for this kernel (docs/perf-notes.md,
"Triton kernels"). Gluon, triton's lower-level dialect, exposes the asynchronous wgmma and its wait, and this
file uses them for FA3's intra-warpgroup schedule:

    issue S_j = Q·K_jᵀ            (async)
    issue O += P_{j-1}·V_{j-1}    (async)
    wait until only the newest group is in flight  -> S_j is ready, P_{j-1}·V_{j-1} still runs
    softmax(S_j) -> P_j, alpha_j  (overlaps the tensor cores' P_{j-1}·V_{j-1})
    wait for everything; O *= alpha_j; refill the freed K/V stage with TMA

The default for D = 128 and 256 (and long causal D = 64) is a warp-specialized version of the same loop
(``_attn_fwd_sm90_ws``, FA3's inter-warpgroup ping-pong): a one-warp producer partition streams Q
and the K/V ring with TMA, and two four-warp consumer partitions own the two 64-row halves of the
Q block and take turns issuing their matmuls (an mbarrier pair passes the turn), so that one
consumer's softmax runs while the other's matmuls occupy the tensor cores. At D = 64 from N = 2k
(causal: 8k) three consumers share each K/V block (192-row Q blocks, turns round robin), as FA3
does at that head dim: per score, D = 64 needs as many MUFU cycles as tensor-core cycles, so more
rows per K/V load and a third warpgroup's softmax to overlap pay off there. Short calls run the
same kernel persistent (``PERSISTENT``: one program per SM over the tiles, the next tile's loads
under the current tile's tail): non-causal ones with at most 1024 keys, and causal ones up to
4k (D = 128) or 2k-8k (D = 64) rows and keys, whose programs then take pairs of Q blocks of equal
total work. D = 256 uses 64-key blocks, so that its 2-slot K/V ring fits; see ``config_for``.

The host side is a launch plan per call layout (:func:`plan_for`, :class:`_Plan`): routing checks,
2-D views, validated descriptors and, after the first launch, the compiled kernel's launcher are
reused by every later call with the same shapes, strides and dtypes.

Scope: the hot path only (dense, fp16/bf16, head dim 64, 128 or 256 — other head dims between
64 and 256 run at the next of those on zero-padded copies, :func:`padded_head_dim` — no
window/softcap/ALiBi/dropout, positive scale, causal or not, Sq % BLOCK_M == 0 (with three consumers Sq % 64 == 0: the last
Q block may run past Sq), Sk % BLOCK_N == 0, Sq <= Sk when causal).
:func:`supported` decides; everything else runs the Triton kernel, which stays the reference
implementation (it runs in the CPU interpreter; this one cannot). The numerics follow
``tileflash.ops.triton.forward``: base-2 scores with the scale folded in, fp32 accumulation, P cast to
V's dtype for the second matmul, natural-log LSE stored.

Tensors are seen as 2-D ``(rows, row_stride)`` views for the TMA descriptors: the (batch, head)
tile of Q starts at row ``b·rb + h·rh + m`` and column ``h·ch`` (see :func:`_view_params`), which
covers the (B, S, H, D) and the SDPA (B, H, S, D) memory layouts without a copy.
"""

from __future__ import annotations

import functools

import torch
import triton

from tileflash.ops.launch import Launch, addresses, launch_or_fall_back, sm_count
from tileflash.ops.utils import GRID_YZ_MAX, LOG2E
from tileflash.ops.gluon.common import (TensorDescriptor, _tma_add, _tma_load, _tma_store, fence_async_shared,  # noqa: F401
                                        gl, gluon, mbarrier, tma, warpgroup_mma, warpgroup_mma_init,
                                        warpgroup_mma_wait)

@gluon.jit
def _softmax_step(s, m_i, l_i, start_n, offs_m, offs_n, shift, qk_scale, MASK: gl.constexpr):
    """Online-softmax update for one [BLOCK_M, BLOCK_N] block of raw scores s (q·k, fp32).

    Returns (p, alpha, m_new, l_new): p = exp2(s·scale − m_new) (0 where masked), alpha =
    exp2(m_i − m_new) rescales what was accumulated before. scale > 0, so max(s)·scale =
    max(s·scale) and s·scale − m is one FMA. Every row sees key 0 (Sq <= Sk when causal), so
    m_new is finite from the first block on."""
    if MASK:  # causal diagonal, bottom-right aligned: key j visible to row i iff j <= i + shift
        vis = gl.expand_dims(start_n + offs_n, 0) <= gl.expand_dims(offs_m + shift, 1)  # [BLOCK_M, BLOCK_N]
        s = gl.where(vis, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)                                 # [BLOCK_M]
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))                              # [BLOCK_M, BLOCK_N]
    alpha = gl.exp2(m_i - m_new)                                                      # [BLOCK_M]
    l_new = l_i * alpha + gl.sum(p, 1)                                                # [BLOCK_M]
    return p, alpha, m_new, l_new

@gluon.jit
def _q_block_coords(nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,
                    BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """Which (batch, head, Q block) this program owns (grid: Q blocks x batch·heads; causal:
    the last Q blocks, which see the most keys, first) and where its Q and K/V tiles start in
    the 2-D views: (off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift)."""
    pid_m = gl.program_id(0)
    if CAUSAL:
        pid_m = gl.num_programs(0) - 1 - pid_m
    return _tile_coords(pid_m, gl.program_id(1), nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch,
                        kv_rb, kv_rh, kv_ch, BLOCK_M)

@gluon.jit
def _tile_coords(pid_m, pid_bh, nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,
                 BLOCK_M: gl.constexpr):
    """_q_block_coords for Q block pid_m of batch·head pid_bh."""
    off_b = pid_bh // nheads
    off_h = pid_bh % nheads
    off_hk = off_h // kv_group
    start_m = pid_m * BLOCK_M
    q_row = off_b * q_rb + off_h * q_rh + start_m
    q_col = off_h * q_ch
    kv_row = off_b * kv_rb + off_hk * kv_rh
    kv_col = off_hk * kv_ch
    shift = seqlen_k - seqlen_q
    return off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift

@gluon.jit
def _persistent_count(geometry, BLOCK_M: gl.constexpr, CAUSAL: gl.constexpr):
    """How many tiles (Q block, batch·head) this persistent program works through: the tiles
    (non-causal) or the pairs of tiles (causal, see _persistent_tile) program_id,
    + num_programs, ..., two tiles per pair."""
    (nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, batch_heads) = geometry
    n_m = (seqlen_q + BLOCK_M - 1) // BLOCK_M
    P = gl.num_programs(0)
    if CAUSAL:
        n = 2 * ((n_m // 2 * batch_heads - gl.program_id(0) + P - 1) // P)
    else:
        n = (n_m * batch_heads - gl.program_id(0) + P - 1) // P
    return n

@gluon.jit
def _persistent_tile(k, geometry, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Where this persistent program's k-th tile lies: _q_block_coords' tuple, then (n_full,
    n_blocks). Non-causal: tile program_id + k·num_programs, Q blocks of one batch·head
    consecutive (concurrent programs share that head's K/V in L2). Causal (an even number
    n_m of Q blocks; the host checks): the program's (k // 2)-th pair, pair
    program_id + (k // 2)·num_programs; pair j of a batch·head is its Q blocks n_m - 1 - j
    (first) and j, which together see the same number of key blocks whatever j (n_m + 1 with
    BLOCK_M = BLOCK_N and Sq = Sk, which config_for's pairs have; a shift that is a multiple
    of BLOCK_N adds the same to every pair), so a static round robin stays balanced."""
    (nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, batch_heads) = geometry
    n_m = (seqlen_q + BLOCK_M - 1) // BLOCK_M
    if CAUSAL:
        pair = gl.program_id(0) + (k // 2) * gl.num_programs(0)
        half_m = n_m // 2
        pid_bh = pair // half_m
        j = pair % half_m
        pid_m = gl.where(k % 2 == 0, n_m - 1 - j, j)
    else:
        tile = gl.program_id(0) + k * gl.num_programs(0)
        pid_bh = tile // n_m
        pid_m = tile % n_m
    off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift = _tile_coords(
        pid_m, pid_bh, nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, BLOCK_M)
    n_full, n_blocks = _key_blocks(start_m, shift, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)
    return off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift, n_full, n_blocks

@gluon.jit
def _kv_ring_bars(STAGES: gl.constexpr, NUM_C: gl.constexpr = 2):
    """The mbarriers of a K/V ring of STAGES slots streamed by a producer warp to NUM_C consumer
    warpgroups: (k_full, v_full, k_empty, v_empty), full on the TMA's bytes, empty after every
    consumer's release."""
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=NUM_C)   # one release per consumer
        mbarrier.init(v_empty.index(i), count=NUM_C)
    return k_full, v_full, k_empty, v_empty

@gluon.jit
def _key_blocks(start_m, shift, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(n_full, n_blocks): the K/V blocks a Q block at start_m works through (keys [0, hi) are
    visible to some row; every row sees key 0, so n_blocks >= 1), of which the first n_full
    need no causal mask."""
    if CAUSAL:
        hi = gl.minimum(start_m + BLOCK_M + shift, seqlen_k)
        n_full = (start_m + shift + 1) // BLOCK_N
    else:
        hi = seqlen_k
        n_full = seqlen_k // BLOCK_N
    n_blocks = (hi + BLOCK_N - 1) // BLOCK_N
    return n_full, n_blocks

@gluon.jit
def _load_block(desc, bar, smem, row, col, pred):
    """TMA copy of the [rows, HEAD_DIM] block at (row, col) into smem, signalled on bar (if pred)."""
    mbarrier.expect(bar, desc.block_type.nbytes, pred=pred)
    _tma_load(desc, [row, col], bar, smem, pred=pred)

@gluon.jit
def _attn_fwd_sm90(
    q_desc, k_desc, v_desc, o_desc, LSE,
    q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,      # 2-D view offsets: row b·rb + h·rh, column h·ch
    stride_lb, stride_lh,
    nheads, kv_group, seqlen_q, seqlen_k, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, LOOKAHEAD: gl.constexpr, num_warps: gl.constexpr,
):
    """One program per (Q block, batch·head), as the Triton kernel; see the module docstring."""
    off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift = _q_block_coords(
        nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, BLOCK_M, CAUSAL)

    # Register layouts of the two wgmma results: S [BLOCK_M, BLOCK_N] and O [BLOCK_M, HEAD_DIM];
    # P is fed to the second wgmma from registers.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_desc.dtype

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)           # Q, then O
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bar.index(i), count=1)
        mbarrier.init(v_bar.index(i), count=1)

    n_full, n_blocks = _key_blocks(start_m, shift, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _tma_load(q_desc, [q_row, q_col], q_bar, q_smem)
    for i in gl.static_range(STAGES):  # fill the K/V ring
        pred = i < n_blocks
        mbarrier.expect(k_bar.index(i), k_desc.block_type.nbytes, pred=pred)
        _tma_load(k_desc, [kv_row + i * BLOCK_N, kv_col], k_bar.index(i), k_smem.index(i),
                                        pred=pred)
        mbarrier.expect(v_bar.index(i), v_desc.block_type.nbytes, pred=pred)
        _tma_load(v_desc, [kv_row + i * BLOCK_N, kv_col], v_bar.index(i), v_smem.index(i),
                                        pred=pred)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)                                 # [BLOCK_M]
    offs_n = gl.arange(0, BLOCK_N, layout=col_s)                                           # [BLOCK_N]
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)                              # [BLOCK_M, HEAD_DIM]
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_s)                             # [BLOCK_M]
    l_i = gl.zeros([BLOCK_M], gl.float32, row_s)                                           # [BLOCK_M]

    # block 0, peeled: nothing to overlap with yet
    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_bar.index(0), 0)
    s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))                                   # [BLOCK_M, BLOCK_N]
    pred = STAGES < n_blocks  # K_0 is consumed: its slot takes K_STAGES
    mbarrier.expect(k_bar.index(0), k_desc.block_type.nbytes, pred=pred)
    _tma_load(k_desc, [kv_row + STAGES * BLOCK_N, kv_col], k_bar.index(0), k_smem.index(0),
                                    pred=pred)
    if LOOKAHEAD:
        # S_j is in registers at the top of iteration j. Q·K_{j+1}ᵀ is issued before its softmax,
        # and P_{j-1}·V_{j-1} is still running: the tensor cores have two matmuls queued while
        # the softmax runs. Needs S_j, S_{j+1}, P and O live at once (BLOCK_N 64 at D=128).
        acc_tok = warpgroup_mma_init(acc)
        b_p = gl.convert_layout(s_zero.to(dtype), p_layout)   # P of "block -1": never multiplied
        for j in range(0, n_blocks - 1):
            nstage = (j + 1) % STAGES
            mbarrier.wait(k_bar.index(nstage), ((j + 1) // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(nstage).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            if j < n_full:
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, offs_m, offs_n, shift, qk_scale, False)
            else:
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, offs_m, offs_n, shift, qk_scale, CAUSAL)
            # P_{j-1}·V_{j-1} retires (Q·K_{j+1}ᵀ may still run); its V slot takes V_{j-1+STAGES}
            acc, b_p = warpgroup_mma_wait(num_outstanding=1, deps=(acc_tok, b_p))
            _load_block(v_desc, v_bar.index((j + STAGES - 1) % STAGES), v_smem.index((j + STAGES - 1) % STAGES),
                        kv_row + (j - 1 + STAGES) * BLOCK_N, kv_col, (j >= 1) & (j - 1 + STAGES < n_blocks))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            b_p = gl.convert_layout(p.to(dtype), p_layout)
            stage = j % STAGES
            mbarrier.wait(v_bar.index(stage), (j // STAGES) & 1)
            acc_tok = warpgroup_mma(b_p, v_smem.index(stage), acc, is_async=True)
            # S_{j+1} retires (P_j·V_j runs on); its K slot takes K_{j+1+STAGES}
            s, b_p = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, b_p))
            _load_block(k_desc, k_bar.index(nstage), k_smem.index(nstage), kv_row + (j + 1 + STAGES) * BLOCK_N,
                        kv_col, j + 1 + STAGES < n_blocks)
        j_last = n_blocks - 1
        if j_last < n_full:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j_last * BLOCK_N, offs_m, offs_n, shift, qk_scale, False)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j_last * BLOCK_N, offs_m, offs_n, shift, qk_scale,
                                               CAUSAL)
        acc, b_p = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, b_p))
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        b_p = gl.convert_layout(p.to(dtype), p_layout)
    else:
        if n_full > 0:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, offs_m, offs_n, shift, qk_scale, False)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, offs_m, offs_n, shift, qk_scale, CAUSAL)
        b_p = gl.convert_layout(p.to(dtype), p_layout)                                     # [BLOCK_M, BLOCK_N]

        for j in range(1, n_blocks):
            stage = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_bar.index(stage), (j // STAGES) & 1)
            s_tok = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False,
                                  is_async=True)
            mbarrier.wait(v_bar.index(prev), ((j - 1) // STAGES) & 1)
            acc_tok = warpgroup_mma(b_p, v_smem.index(prev), acc, is_async=True)
            # groups retire in order: with one left in flight, S_j is done and P_{j-1}·V_{j-1} runs on
            s, b_p = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, b_p))
            # K_j is consumed: its slot takes K_{j+STAGES} (STAGES iterations ahead of its use)
            _load_block(k_desc, k_bar.index(stage), k_smem.index(stage), kv_row + (j + STAGES) * BLOCK_N, kv_col,
                        j + STAGES < n_blocks)
            if j < n_full:
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, offs_m, offs_n, shift, qk_scale, False)
            else:
                p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, offs_m, offs_n, shift, qk_scale,
                                                   CAUSAL)
            acc, b_p = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, b_p))
            # V_{j-1} is consumed: its slot takes V_{j-1+STAGES}
            _load_block(v_desc, v_bar.index(prev), v_smem.index(prev), kv_row + (j - 1 + STAGES) * BLOCK_N, kv_col,
                        j - 1 + STAGES < n_blocks)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            b_p = gl.convert_layout(p.to(dtype), p_layout)

    last = (n_blocks - 1) % STAGES
    mbarrier.wait(v_bar.index(last), ((n_blocks - 1) // STAGES) & 1)
    acc = warpgroup_mma(b_p, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))                              # [BLOCK_M, HEAD_DIM]

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bar.index(i))
        mbarrier.invalidate(v_bar.index(i))

    # Epilogue: O = acc / l (l > 0: every row saw key 0), LSE in natural log.
    o = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)                             # [BLOCK_M, HEAD_DIM]
    q_smem.store(o.to(dtype))
    fence_async_shared()
    _tma_store(o_desc, [q_row, q_col], q_smem)
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453                                        # [BLOCK_M]
    gl.store(LSE + off_b * stride_lb + off_h * stride_lh + offs_m, lse)
    tma.store_wait(pendings=0)


# ------------------------------------------------------------------------------------------
# Warp-specialized variant (FA3's inter-warpgroup ping-pong): a 1-warp producer streams Q and
# the K/V ring with TMA; two 4-warp consumers own the two 64-row halves of a 128-row Q block
# and take turns at the tensor cores, so one runs its softmax while the other's matmuls run.
# ------------------------------------------------------------------------------------------
@gluon.jit
def _ws_load_kv(k_desc, v_desc, k_smem, v_smem, k_full, v_full, k_empty, v_empty, kv_row, kv_col, j, g,
                BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """K_j and V_j of the current tile into ring slot g % STAGES (g: the program's running block
    count), once every consumer has released that slot's previous block."""
    slot = g % STAGES
    released = ((g // STAGES) & 1) ^ 1   # parity of the release of block g - STAGES
    mbarrier.wait(k_empty.index(slot), released, pred=g >= STAGES)
    _load_block(k_desc, k_full.index(slot), k_smem.index(slot), kv_row + j * BLOCK_N, kv_col, True)
    mbarrier.wait(v_empty.index(slot), released, pred=g >= STAGES)
    _load_block(v_desc, v_full.index(slot), v_smem.index(slot), kv_row + j * BLOCK_N, kv_col, True)

@gluon.jit
def _ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full, k_empty,
                 v_empty, where, HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 CAUSAL: gl.constexpr, NUM_C: gl.constexpr, PERSISTENT: gl.constexpr):
    """The producer warp. One tile (``where`` = its q_row, q_col, kv_row, kv_col, n_blocks):
    the NUM_C Q slices of HALF_M rows, then K_j and V_j into slot j % STAGES as soon as every
    consumer has released that slot's previous block. PERSISTENT (``where`` = the problem's
    geometry): for each of the program's tiles, K_0/V_0 (which may land while the consumers
    still finish the previous tile), then the Q slices once each consumer's last S matmul of
    the previous tile has retired (q_empty), then the other blocks; the ring position g runs
    on across tiles."""
    if PERSISTENT:
        BLOCK_M: gl.constexpr = HALF_M * NUM_C
        g = 0
        it = 0
        for k in range(0, _persistent_count(where, BLOCK_M, CAUSAL)):
            off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift, n_full, n_blocks = _persistent_tile(
                k, where, BLOCK_M, BLOCK_N, CAUSAL)
            _ws_load_kv(k_desc, v_desc, k_smem, v_smem, k_full, v_full, k_empty, v_empty, kv_row, kv_col, 0, g,
                        BLOCK_N, STAGES)
            for c in gl.static_range(NUM_C):
                mbarrier.wait(q_empty.index(c), (it - 1) & 1, pred=it > 0)
                _load_block(q_desc, q_bar.index(c), q_smem.index(c), q_row + c * HALF_M, q_col, True)
            for j in range(1, n_blocks):
                _ws_load_kv(k_desc, v_desc, k_smem, v_smem, k_full, v_full, k_empty, v_empty, kv_row, kv_col,
                            j, g + j, BLOCK_N, STAGES)
            g += n_blocks
            it += 1
    else:
        (q_row, q_col, kv_row, kv_col, n_blocks) = where
        for c in gl.static_range(NUM_C):
            _load_block(q_desc, q_bar.index(c), q_smem.index(c), q_row + c * HALF_M, q_col, True)
        for j in range(n_blocks):
            _ws_load_kv(k_desc, v_desc, k_smem, v_smem, k_full, v_full, k_empty, v_empty, kv_row, kv_col, j, j,
                        BLOCK_N, STAGES)

@gluon.jit
def _ws_turn(pp_bar, turn, C: gl.constexpr, PINGPONG: gl.constexpr):
    """Wait for this consumer's turn at the tensor cores, round robin over the NUM_C consumers:
    consumer 0's turn t follows consumer NUM_C-1's turn t-1, consumer C's turn t follows
    consumer C-1's turn t (each arrival on pp_bar[C] is one turn; a consumer is never more
    than one arrival behind, so parity waits are safe). PINGPONG=False: no turns, the
    consumers run free."""
    if not PINGPONG:
        pass
    elif C == 0:
        mbarrier.wait(pp_bar.index(0), (turn - 1) & 1, pred=turn > 0)
    else:
        mbarrier.wait(pp_bar.index(C), turn & 1)

@gluon.jit
def _ws_pass(pp_bar, C: gl.constexpr, PINGPONG: gl.constexpr, NUM_C: gl.constexpr = 2):
    """End this consumer's turn: the next consumer (C+1 mod NUM_C) may issue its matmuls."""
    if PINGPONG:
        mbarrier.arrive(pp_bar.index((C + 1) % NUM_C), count=1)

@gluon.jit
def _ws_consumer(shared, C: gl.constexpr, HALF_M: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, NUM_C: gl.constexpr,
                 PERSISTENT: gl.constexpr):
    """Consumer warpgroup C. ``shared`` holds what every consumer gets alike (buffers, barriers,
    and the tile's coordinates, or for PERSISTENT the problem's geometry; see
    _attn_fwd_sm90_ws), so that the partition list names only what differs. PERSISTENT: the
    program's tiles in the producer's order, with the ring position g and the turn count
    running on across tiles (every consumer takes n_blocks + 1 turns per tile, so the round
    robin never breaks)."""
    if PERSISTENT:
        (q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full, k_empty, v_empty, pp_bar, o_desc, LSE,
         geometry, stride_lb, stride_lh, qk_scale) = shared
        seqlen_q = geometry[2]
        BLOCK_M: gl.constexpr = HALF_M * NUM_C
        g = 0
        turn = 0
        it = 0
        for k in range(0, _persistent_count(geometry, BLOCK_M, CAUSAL)):
            off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift, n_full, n_blocks = _persistent_tile(
                k, geometry, BLOCK_M, BLOCK_N, CAUSAL)
            _ws_consume_tile(q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full, k_empty, v_empty, pp_bar,
                             o_desc, LSE, q_row, q_col, off_b * stride_lb + off_h * stride_lh, start_m, n_blocks,
                             n_full, shift, qk_scale, seqlen_q, g, turn, it & 1,
                             C, HALF_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, NUM_C, True)
            g += n_blocks
            turn += n_blocks + 1
            it += 1
        tma.store_wait(pendings=0)  # the last tile's O leaves shared memory before the program ends
    else:
        (q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty, pp_bar, o_desc, LSE,
         q_row, q_col, lse_base, start_m, n_blocks, n_full, shift, qk_scale, seqlen_q) = shared
        _ws_consume_tile(q_smem, q_smem, k_smem, v_smem, q_bar, q_bar, k_full, v_full, k_empty, v_empty, pp_bar, o_desc,
                         LSE, q_row, q_col, lse_base, start_m, n_blocks, n_full, shift, qk_scale, seqlen_q, 0, 0,
                         0, C, HALF_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, NUM_C, False)

@gluon.jit
def _ws_consume_tile(q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full, k_empty, v_empty, pp_bar, o_desc,
                     LSE, q_row, q_col, lse_base, start_m, n_blocks, n_full, shift, qk_scale, seqlen_q,
                     g0, t0, q_phase,
                     C: gl.constexpr, HALF_M: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                     STAGES: gl.constexpr, CAUSAL: gl.constexpr, PINGPONG: gl.constexpr, NUM_C: gl.constexpr,
                     PERSISTENT: gl.constexpr):
    """Rows [start_m + C·HALF_M, +HALF_M) of one tile: the schedule of _attn_fwd_sm90 on one
    warpgroup, with each issue of matmuls taken as a turn (see _ws_turn). The tile's K/V
    block j sits in ring slot (g0 + j) % STAGES and its turns are t0 .. t0 + n_blocks (both 0
    for a one-tile program); its Q slice is the q_phase-th load into q_smem[C]. With
    NUM_C = 3 the Q block (3·HALF_M rows) may run past seqlen_q (a multiple of HALF_M): a
    slice wholly past it computes on whatever rows its TMA load brought (the next (b, h) or
    zeros), keeps its turns and releases, and stores nothing. PERSISTENT: the Q slice is
    released (q_empty) as soon as its last S matmul retires, so that the next tile's Q loads
    during this tile's last softmax, P·V and epilogue; O leaves through a buffer of its own
    (o_smem), whose previous TMA store is waited for just before it is rewritten."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = k_smem.dtype
    q_c = q_smem.index(C)                                                                  # [HALF_M, HEAD_DIM]

    offs_m = start_m + C * HALF_M + gl.arange(0, HALF_M, layout=row_s)                     # [HALF_M]
    offs_n = gl.arange(0, BLOCK_N, layout=col_s)                                           # [BLOCK_N]
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    acc = gl.zeros([HALF_M, HEAD_DIM], gl.float32, o_layout)                               # [HALF_M, HEAD_DIM]
    m_i = gl.full([HALF_M], float("-inf"), gl.float32, row_s)
    l_i = gl.zeros([HALF_M], gl.float32, row_s)

    mbarrier.wait(q_bar.index(C), q_phase)
    _ws_turn(pp_bar, t0, C, PINGPONG)
    first = g0 % STAGES
    mbarrier.wait(k_full.index(first), (g0 // STAGES) & 1)
    s = warpgroup_mma(q_c, k_smem.index(first).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _ws_pass(pp_bar, C, PINGPONG, NUM_C)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))                                   # [HALF_M, BLOCK_N]
    mbarrier.arrive(k_empty.index(first), count=1)
    if PERSISTENT:
        if n_blocks == 1:
            mbarrier.arrive(q_empty.index(C), count=1)  # Q's last use: the next tile's Q may load
    if n_full > 0:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, offs_m, offs_n, shift, qk_scale, False)
    else:
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, 0, offs_m, offs_n, shift, qk_scale, CAUSAL)
    b_p = gl.convert_layout(p.to(dtype), p_layout)                                         # [HALF_M, BLOCK_N]

    for j in range(1, n_blocks):
        g = g0 + j
        stage = g % STAGES
        prev = (g - 1) % STAGES
        _ws_turn(pp_bar, t0 + j, C, PINGPONG)
        mbarrier.wait(k_full.index(stage), (g // STAGES) & 1)
        s_tok = warpgroup_mma(q_c, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_full.index(prev), ((g - 1) // STAGES) & 1)
        acc_tok = warpgroup_mma(b_p, v_smem.index(prev), acc, is_async=True)
        _ws_pass(pp_bar, C, PINGPONG, NUM_C)
        s, b_p = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, b_p))
        mbarrier.arrive(k_empty.index(stage), count=1)
        if PERSISTENT:
            if j == n_blocks - 1:
                mbarrier.arrive(q_empty.index(C), count=1)  # Q's last use: the next tile's Q may load
        if j < n_full:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, offs_m, offs_n, shift, qk_scale, False)
        else:
            p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, j * BLOCK_N, offs_m, offs_n, shift, qk_scale, CAUSAL)
        acc, b_p = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, b_p))
        mbarrier.arrive(v_empty.index(prev), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
        b_p = gl.convert_layout(p.to(dtype), p_layout)

    g_last = g0 + n_blocks - 1
    last = g_last % STAGES
    _ws_turn(pp_bar, t0 + n_blocks, C, PINGPONG)
    mbarrier.wait(v_full.index(last), (g_last // STAGES) & 1)
    acc = warpgroup_mma(b_p, v_smem.index(last), acc, is_async=True)
    _ws_pass(pp_bar, C, PINGPONG, NUM_C)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))                              # [HALF_M, HEAD_DIM]
    mbarrier.arrive(v_empty.index(last), count=1)

    o = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)                             # [HALF_M, HEAD_DIM]
    in_range = True
    if NUM_C != 2:  # 2 consumers: BLOCK_M divides seqlen_q (supported()), every slice stores
        in_range = start_m + C * HALF_M < seqlen_q
    if in_range:
        o_c = o_smem.index(C)  # q_c for a one-tile program; a buffer of its own when PERSISTENT
        if PERSISTENT:
            tma.store_wait(pendings=0)  # the previous tile's O has left o_c
        o_c.store(o.to(dtype))
        fence_async_shared()
        _tma_store(o_desc, [q_row + C * HALF_M, q_col], o_c)
        lse = (m_i + gl.log2(l_i)) * 0.6931471805599453                                    # [HALF_M]
        gl.store(LSE + lse_base + offs_m, lse)
        if not PERSISTENT:
            tma.store_wait(pendings=0)

@gluon.jit
def _attn_fwd_sm90_ws(
    q_desc, k_desc, v_desc, o_desc, LSE,
    q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,
    stride_lb, stride_lh,
    nheads, kv_group, seqlen_q, seqlen_k, batch_heads, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, PINGPONG: gl.constexpr = True,
    NUM_C: gl.constexpr = 2, PERSISTENT: gl.constexpr = False,
):
    """One program per (Q block of BLOCK_M rows, batch·head): NUM_C consumer warpgroups (2 or 3)
    own the Q block's SUB_M = BLOCK_M / NUM_C row slices (the q_desc/o_desc blocks) and take
    turns at the tensor cores, round robin; a 1-warp producer streams Q and the K/V ring.
    NUM_C = 3 is FA3's D = 64 shape (192-row Q blocks): each K/V byte serves 1.5x the rows.
    PERSISTENT: a 1-D grid of at most one program per SM, each working through its share of
    the tiles (Q block, batch·head) as _persistent_tile deals them (non-causal: round robin;
    causal: pairs of Q blocks of one head, round robin over the pairs), so that a tile's K/V
    loads overlap the previous tile's epilogue and no program is launched per tile."""
    SUB_M: gl.constexpr = BLOCK_M // NUM_C
    if not PERSISTENT:
        off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift = _q_block_coords(
            nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, BLOCK_M, CAUSAL)
        lse_base = off_b * stride_lb + off_h * stride_lh
        # every slice runs the same number of turns: the block's key range, masked per row
        n_full, n_blocks = _key_blocks(start_m, shift, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [NUM_C, SUB_M, HEAD_DIM], q_desc.layout)     # Q slices, then O
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [NUM_C, 1], mbarrier.MBarrierLayout())
    pp_bar = gl.allocate_shared_memory(gl.int64, [NUM_C, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_C):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(pp_bar.index(i), count=1)
    k_full, v_full, k_empty, v_empty = _kv_ring_bars(STAGES, NUM_C)

    if PERSISTENT:
        q_empty = gl.allocate_shared_memory(gl.int64, [NUM_C, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(NUM_C):
            mbarrier.init(q_empty.index(i), count=1)
        # O gets buffers of its own, so that a slice's Q is released after its last S matmul
        o_smem = gl.allocate_shared_memory(dtype, [NUM_C, SUB_M, HEAD_DIM], o_desc.layout)
        where = (nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, batch_heads)
        shared = (q_smem, o_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full, k_empty, v_empty, pp_bar, o_desc,
                  LSE, where, stride_lb, stride_lh, qk_scale)
    else:
        q_empty = q_bar  # unused: one tile per program
        where = (q_row, q_col, kv_row, kv_col, n_blocks)
        # runtime values only: a tuple does not keep constexprs constant
        shared = (q_smem, k_smem, v_smem, q_bar, k_full, v_full, k_empty, v_empty, pp_bar, o_desc, LSE,
                  q_row, q_col, lse_base, start_m, n_blocks, n_full, shift, qk_scale, seqlen_q)
    if NUM_C == 2:
        gl.warp_specialize([
            (_ws_consumer, (shared, 0, SUB_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, NUM_C, PERSISTENT)),
            (_ws_consumer, (shared, 1, SUB_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, NUM_C, PERSISTENT)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full,
                            k_empty, v_empty, where, SUB_M, BLOCK_N, STAGES, CAUSAL, NUM_C, PERSISTENT)),
        ], [4, 1], [CONSUMER_REGS, 24])
    else:
        gl.warp_specialize([
            (_ws_consumer, (shared, 0, SUB_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, NUM_C, PERSISTENT)),
            (_ws_consumer, (shared, 1, SUB_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, NUM_C, PERSISTENT)),
            (_ws_consumer, (shared, 2, SUB_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, PINGPONG, NUM_C, PERSISTENT)),
            (_ws_producer, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_empty, k_full, v_full,
                            k_empty, v_empty, where, SUB_M, BLOCK_N, STAGES, CAUSAL, NUM_C, PERSISTENT)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, 24])


def config_for(head_dim: int, causal: bool, seqlen_q: int, seqlen_k: int | None = None) -> dict:
    """Kernel and tiles for a call, from ``tools/gluon_check.py`` sweeps on the H200 (fp16 unless
    stated, B·N = 16k tokens; TFLOP/s; docs/perf-notes.md, "Hopper forward (Gluon)"):

    * D = 128: the warp-specialized ping-pong kernel (``WS``), 128-row Q blocks in two 64-row
      halves, 128-key blocks, a 2-slot K/V ring. Non-causal 528 / 578 / 600 / 618 at N = 1k / 2k /
      4k / 16k, causal 380 / 481 / 526 / 637, against 465 / 501 / 503 / 516 and 377 / 395 / 429 /
      486 for the one-warpgroup-pair kernel below.
    * D = 64, N >= 2k non-causal or N >= 8k causal: the same warp-specialized kernel with three
      consumer warpgroups (``CONSUMERS=3``, FA3's D = 64 shape): 192-row Q blocks in 64-row
      slices, 128-key blocks, a 2-slot ring, turns round robin. Non-causal 470 / 507 TFLOP/s at N = 4k / 16k against 416 / 429 for the 8-warp kernel
      below (cuDNN 448 / 453); causal 467 at 16k against 429 for the ping-pong kernel (cuDNN 435),
      but 384 against 385 at 4k. At N = 1k the partial last Q block (1024 = 5⅓ · 192) costs more
      than the sharing gains (389 against 402), so short calls keep the kernels below.
    * D = 64, causal, 4k <= N < 8k: the two-consumer ping-pong kernel with a 3-slot ring (377 / 429
      against 364 / 396); persistent where the pair rule below applies.
    * D = 64 otherwise: the single-partition kernel, 8 warps on 128-row blocks, 64-key blocks, a
      4-slot ring (non-causal 399 / 411 / 425 / 425, where the ping-pong kernel gave 350 / 384 /
      406 / 419; at Sk <= 1024 replaced by the persistent kernel below); causal with Sq <= 1024:
      64-row blocks on 4 warps (312-319 against 253), with a 2-slot ring (N = 1k: 331 TFLOP/s
      against 309 with 3 slots and 263 with 4; 64/128 with 2 slots 328; cuDNN 334).

    * D = 128, non-causal, Sk <= 1024: the same kernel in its persistent mode (``PERSISTENT``: one
      program per SM over the tiles; each Q slice is reloaded for the next tile as soon as its last
      S matmul retires). 577 TFLOP/s at N = 1k against
      539 for one program per tile (cuDNN 581); level at 2k / 4k (586 / 596 against 584 / 597),
      3% slower at 16k (610 against 629). Causal calls lost with it at every N measured (348
      against 382 at 1k, 426 against 603 at 16k) while its tiles went to programs round robin:
      causal tiles differ in length, so the programs finished unevenly (see the pairs below). At
      D = 64 with three consumers (non-causal, N >= 2k) it measured within ±3% of the defaults,
      so it is not used there.

    * Causal, D = 128 with Sq, Sk <= 4k and D = 64 with 2k <= Sq and Sk < 8k (Sk a multiple of
      128), when the 128-row Q blocks are even in number: the persistent mode, with each program
      taking pairs of Q blocks (n_m - 1 - j, j) of one head, which together see the same number
      of key blocks whatever j (n_m + 1 when Sq = Sk; with Sk > Sq the shift adds the same to
      both), so that a static round robin stays balanced (``_persistent_tile``). Sk is bounded
      too: tiles as long as a 16k call's lost with it (below). fp16 / bf16, TFLOP/s against one
      program per tile: D = 128 418 / 431
      against 381 / 387 at 1k, 504 / 524 against 470 / 477 at 2k, 531 / 586 against 522 / 555 at
      4k; at 8k 588 / 590 against 564 / 602 and at 16k 604 / 615 against 610 / 634, so longer
      calls keep one program per tile. D = 64 (fp16, 3-slot ring): 370 against 345 at 2k, 409
      against 382 at 4k; 427 against 449 (three consumers) at 8k; 302 against 315 at 1k.
    * D = 64, non-causal, Sk <= 1024 (a multiple of 128): the persistent two-consumer kernel
      (2-slot ring). fp16 / bf16, N = 1k: 426 / 432 TFLOP/s against
      406 / 407 for the 8-warp kernel (cuDNN 421 / 429); 411 / 413 with three consumers.

    The LOOKAHEAD schedule (Q·K_{j+1}ᵀ issued before the softmax of block j) measured 2-20% slower
    at every tile it was tried with, so it is off (docs/perf-notes.md, "Lessons"). ``seqlen_k`` (when
    given) keeps a key length that is not a multiple of the three-consumer kernel's 128-key
    blocks on the kernels that take it."""
    # causal, persistent: programs take pairs of Q blocks, so the 128-row blocks must be even in number
    paired = causal and seqlen_q % 256 == 0
    keys = seqlen_k or seqlen_q
    if head_dim > 128:
        # D = 256: the warp-specialized kernel with 64-key blocks, so that a 2-slot K/V ring fits
        # beside the Q block (197 KB of shared memory; the persistent mode needs 263 KB). H200
        # (fp16, N = 4k / 16k): 693 / 673 TFLOP/s non-causal, 537 / 640 causal, against
        # 388 / 356 and 316 / 374 for the Triton kernel in the same run. Not swept.
        return dict(BLOCK_M=128, BLOCK_N=64, STAGES=2, num_warps=4, WS=True)
    if head_dim > 64:
        cfg = dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, num_warps=4, WS=True)
        if not causal and keys <= 1024:
            cfg["PERSISTENT"] = True  # short tiles: the next tile's loads hide under this one's tail
        if paired and keys <= 4096:
            cfg["PERSISTENT"] = True  # pairs of Q blocks of equal work: no launch or prologue per tile
        return cfg
    # three consumers need 128-key blocks: a Sk that is a multiple of 64 only keeps the kernels below
    if seqlen_q >= (8192 if causal else 2048) and (seqlen_k is None or seqlen_k % 128 == 0):
        return dict(BLOCK_M=192, BLOCK_N=128, STAGES=2, num_warps=4, WS=True, CONSUMERS=3, CONSUMER_REGS=160)
    if not causal and keys <= 1024 and keys % 128 == 0:
        return dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, num_warps=4, WS=True, PERSISTENT=True)
    if paired and seqlen_q >= 2048 and keys < 8192 and keys % 128 == 0:
        return dict(BLOCK_M=128, BLOCK_N=128, STAGES=3, num_warps=4, WS=True, PERSISTENT=True)
    if causal and seqlen_q >= 4096:
        return dict(BLOCK_M=128, BLOCK_N=128, STAGES=3, num_warps=4, WS=True)
    if causal and seqlen_q <= 1024:
        # 2 slots: 331 TFLOP/s at N = 1k against 309 with 3 (H200, fp16, 2026-12-03)
        return dict(BLOCK_M=64, BLOCK_N=64, STAGES=2, num_warps=4)
    return dict(BLOCK_M=128, BLOCK_N=64, STAGES=4, num_warps=8)


def q_block_rows(cfg: dict) -> int:
    """Rows of one Q/O TMA block: a consumer's slice for the warp-specialized kernel (BLOCK_M split
    over ``CONSUMERS`` warpgroups, 2 by default), else the whole Q block."""
    return cfg["BLOCK_M"] // cfg.get("CONSUMERS", 2) if cfg.get("WS", False) else cfg["BLOCK_M"]


def _view_params(t: torch.Tensor, seqlen: int, nheads: int):
    """(rows, row_stride, rb, rh, ch) of the 2-D view (rows, row_stride) in which the (b, h) tile
    starts at row b·rb + h·rh and column h·ch; None if t's strides do not allow one."""
    sb, ss, sh, sd = t.stride()
    d = t.shape[-1]
    if sd != 1 or ss < d or sb % ss:
        return None
    if sh % ss == 0:                 # heads are whole row groups: (B, H, S, D) memory
        rh, ch = sh // ss, 0
    elif (nheads - 1) * sh + d <= ss:  # heads side by side in a row: (B, S, H, D) memory
        rh, ch = 0, sh
    else:
        return None
    rows = ((t.shape[0] - 1) * sb + (nheads - 1) * sh + (seqlen - 1) * ss) // ss + 1
    if rows >= 2 ** 31:  # TMA coordinates and the kernel's row offsets are int32
        return None
    return rows, ss, sb // ss, rh, ch


# (head_dim, causal, dtype, config) keys whose kernel failed to compile: they run the Triton kernel
_BROKEN: set = set()


def padded_head_dim(d: int) -> int | None:
    """The head dim at which the Hopper Gluon kernels run a call of head dim ``d``, or None if they
    do not take it. 64, 128 and 256 run as they are. 64 < d < 128 (e.g. 96) runs at 128, and
    128 < d < 256 (e.g. 160, 192) at 256, on copies of the inputs zero-padded to that width
    (``triton.forward.pad_head_dim``, run by ``tileflash.ops.route``): the backward on dO, q, k and
    v, storing only the first d columns of dQ, dK and dV (its kernels' ``D_OUT`` constexpr) straight
    into the caller's buffers; the forward on q, k and v, into a padded output whose first d columns
    are copied into the caller's. The zero
    columns change nothing: they add 0 to every sum over the head dim (S = Q·Kᵀ, dP = dO·Vᵀ), and
    the columns of O = P·V, dV = Pᵀ·dO, dK = dSᵀ·Q and dQ = dS·K past d are 0 and not kept. The
    Triton kernels pad such a head dim to a power-of-two tile too (``forward.block_d_for``), so the
    padding adds no arithmetic over them; the copies add O(N·D) traffic to O(N²·D) work, and
    memory while the call runs."""
    if d in (64, 128, 256):
        return d
    if 64 < d < 128:
        return 128
    return 256 if 128 < d < 256 else None


def supported(q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, varlen, config) -> bool:
    """Whether this call can take the Gluon kernel (see the module docstring for the scope).
    A ``config`` (pinned Triton tiles) keeps the Triton kernel."""
    return plan_for(q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, varlen, config) is not None


class _Plan(Launch):
    """The forward's launch (:class:`Launch`) for one call layout and its tile config, built by
    :func:`plan_for`: a repeated call pays for a dictionary lookup instead of the routing checks,
    the 2-D views and the descriptors' validation (host time; docs/perf-notes.md, "Host path"). Its descriptors are
    Q, K, V and O, its one raw pointer the LSE: :func:`replay` keeps the compiled launcher only for
    16-byte aligned LSE pointers, as triton specializes on that."""

    __slots__ = ("cfg", "key")

    def __init__(self, q, k, v, out, lse, causal, cfg):
        batch, seqlen_q, nheads, d = q.shape
        seqlen_k, nheads_k = k.shape[1], k.shape[2]
        bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
        ws = cfg.get("WS", False)
        q_rows = q_block_rows(cfg)
        q_desc, (q_rb, q_rh, q_ch) = _desc(q, seqlen_q, nheads, q_rows)
        o_desc, _ = _desc(out, seqlen_q, nheads, q_rows)
        k_desc, (kv_rb, kv_rh, kv_ch) = _desc(k, seqlen_k, nheads_k, bn)
        v_desc, _ = _desc(v, seqlen_k, nheads_k, bn)
        self.cfg, self.key = cfg, _key(d, causal, q.dtype, cfg)
        # 3 consumers: the last block may run past Sq
        grid = (triton.cdiv(seqlen_q, bm), batch * nheads, 1)
        # the kernels' runtime arguments after (q_desc, k_desc, v_desc, o_desc, LSE), up to the scale
        ints = (q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, lse.stride(0), lse.stride(1),
                nheads, nheads // nheads_k, seqlen_q, seqlen_k)
        if ws:
            ints += (batch * nheads,)
            if cfg.get("PERSISTENT", False):  # one program per SM (at most), each looping over tiles
                tiles = grid[0] * grid[1]
                if causal:  # programs take pairs of tiles of equal total length (_persistent_tile)
                    if grid[0] % 2:
                        raise ValueError(f"a persistent causal launch needs an even number of Q blocks, got "
                                         f"{grid[0]} (seqlen_q={seqlen_q}, BLOCK_M={bm})")
                    tiles //= 2
                grid = (min(tiles, sm_count(q.device)), 1, 1)
            kernel = _attn_fwd_sm90_ws
            # registers per consumer thread: 232 for 2 consumers (12 warps); 160 for 3 (16 warps with the
            # producer's warpgroup: 168 + 2·160 + 24 = 512 per lane, the whole register file; no spills)
            constexprs = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
                              CONSUMER_REGS=cfg.get("CONSUMER_REGS", 232), num_warps=4,
                              PINGPONG=cfg.get("PINGPONG", True), NUM_C=cfg.get("CONSUMERS", 2),
                              PERSISTENT=cfg.get("PERSISTENT", False))
        else:
            kernel = _attn_fwd_sm90
            constexprs = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
                              LOOKAHEAD=cfg.get("LOOKAHEAD", False), num_warps=cfg["num_warps"])
        if grid[1] > GRID_YZ_MAX:
            raise ValueError(f"the Gluon forward's grid takes at most {GRID_YZ_MAX} batch*heads outside its persistent "
                             f"mode, got {grid[1]}; tileflash.ops.route sends such calls to the Triton kernel")
        super().__init__(kernel, grid, (q_desc, k_desc, v_desc, o_desc), 1, ints, 1, constexprs)


# layout key -> _Plan, or None where the Gluon kernel cannot take that layout
_PLANS: dict = {}
_PLANS_MAX = 1024  # emptied when full (a workload with ever-new shapes re-plans, as before the cache)


def plan_for(q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, varlen, config):
    """The launch plan of this call (:class:`_Plan`) if the Gluon kernel can take it, else None.

    What depends only on the layout is decided once per (shapes, strides, dtypes, device, causal)
    and cached; the scale, the feature flags, the causal alignment and the pointers' 16-byte
    alignment are checked on every call."""
    if config is not None or varlen or not softmax_scale > 0:  # (NaN scales fail too)
        return None
    if flags["HAS_LEFT"] or flags["HAS_SOFTCAP"] or flags["HAS_ALIBI"] or flags["HAS_DROPOUT"]:
        return None
    if flags["HAS_RIGHT"] and not causal:
        return None  # a right window bound other than causal's
    if causal and causal_shift != k.shape[1] - q.shape[1]:
        return None
    if q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16 or out.data_ptr() % 16:
        return None
    key = (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), out.shape, out.stride(), lse.shape,
           lse.stride(), q.dtype, k.dtype, v.dtype, out.dtype, lse.dtype, q.device, bool(causal))
    try:
        return _PLANS[key]
    except KeyError:
        pass
    cfg = _layout_config(q, k, v, out, lse, causal)
    if cfg is not None and not cfg.get("PERSISTENT", False) and q.shape[0] * q.shape[2] > GRID_YZ_MAX:
        cfg = None  # batch*heads past grid axis 1's limit: the Triton kernel (flat grid) takes it
    plan = None if cfg is None else _Plan(q, k, v, out, lse, bool(causal), cfg)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def _layout_config(q, k, v, out, lse, causal):
    """config_for's tiles if the Gluon kernel can take tensors of this layout, else None."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return None
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    d = q.shape[-1]
    if d not in (64, 128, 256):
        return None
    # the public API validates these; direct callers of route.forward(out=, lse=) may not
    if k.shape[-1] != d or v.shape[-1] != d or q.shape[2] % k.shape[2] or k.shape != v.shape:
        return None
    if out.shape != q.shape or out.dtype != q.dtype or lse.dtype != torch.float32:
        return None
    if lse.shape != (q.shape[0], q.shape[2], q.shape[1]) or lse.stride(-1) != 1:
        return None
    sq, sk = q.shape[1], k.shape[1]
    if causal and sq > sk:
        return None
    cfg = config_for(d, causal, sq, sk)
    if _key(d, causal, q.dtype, cfg) in _BROKEN:
        return None
    if sq % q_block_rows(cfg) or sk % cfg["BLOCK_N"]:
        return None
    if cfg.get("CONSUMERS", 2) == 2 and sq % cfg["BLOCK_M"]:
        return None
    for t in (q, k, v, out):
        if any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return None
    views = [_view_params(t, t.shape[1], t.shape[2]) for t in (q, k, v, out)]
    if any(vw is None for vw in views):
        return None
    # one set of offsets serves Q and O, one K and V
    if views[0][2:] != views[3][2:] or views[1][2:] != views[2][2:]:
        return None
    return cfg


@functools.lru_cache(maxsize=None)
def _smem_layout(block_rows, d, dtype):
    """The TMA/wgmma shared-memory layout of a [block_rows, d] tile (built once per shape: hot path)."""
    return gl.NVMMASharedLayout.get_default_for([block_rows, d], {torch.float16: gl.float16,
                                                                  torch.bfloat16: gl.bfloat16}[dtype])


def _desc(t, seqlen, nheads, block_rows):
    rows, ss, rb, rh, ch = _view_params(t, seqlen, nheads)
    d = t.shape[-1]
    layout = _smem_layout(block_rows, d, t.dtype)
    return TensorDescriptor(t, [rows, ss], [ss, 1], [block_rows, d], layout), (rb, rh, ch)


def forward(q, k, v, out, lse, softmax_scale: float, causal: bool, cfg: dict | None = None,
            plan: _Plan | None = None):
    """Launch the Gluon kernel; the caller checked :func:`supported` (or passes the ``plan`` that
    :func:`plan_for` returned). q (B, Sq, H, D), k/v (B, Sk, Hk, D), out like q, lse (B, H, Sq)
    fp32 with strides (H·Sq, Sq). ``cfg`` overrides :func:`config_for` (``tools/gluon_check.py``
    sweeps it; lengths must stay multiples of its tiles; such a plan is not cached). Returns None,
    after a warning, when the kernel does not compile with the installed triton (Gluon's API
    changes between releases): the caller then runs the Triton kernel, and later calls skip this
    configuration."""
    if plan is None:
        cfg = cfg or config_for(q.shape[-1], causal, q.shape[1], k.shape[1])
        plan = _Plan(q, k, v, out, lse, bool(causal), cfg)
    ran = launch_or_fall_back(_BROKEN, plan.key, "the Hopper Gluon forward",
                              "using the Triton kernel for this configuration. Options(backend='triton') turns the "
                              "Gluon kernels off.", lambda: replay(plan, q, k, v, out, lse, softmax_scale))
    if not ran:
        _PLANS.clear()  # plans made before the failure would route to the broken configuration
    return (out, lse) if ran else None


def _key(d, causal, dtype, cfg):
    return (d, bool(causal), dtype, tuple(sorted(cfg.items())))


def replay(plan: _Plan, q, k, v, out, lse, softmax_scale):
    """One launch of the plan's kernel on these tensors (:meth:`Launch.__call__`): the compiled
    launcher is reused only while the LSE pointer is 16-byte aligned, as at its first launch (and
    takes it as an integer: :func:`~tileflash.ops.launch.addresses`).
    Without the compile-failure fallback of :func:`forward`: for a plan that has launched before
    (``plan.runner`` set), as ``tileflash.ops.route.replay_forward`` calls it."""
    plan((q, k, v, out), (lse,), (softmax_scale * LOG2E,), addresses(lse))
