"""Hopper (sm90) backward in Gluon: a warp-specialized dK/dV kernel (default), an 8-warp dK/dV
kernel, and the 8-warp kernel fused with ordered dQ sums.

Why a second backward. In ``tileflash.ops.triton.backward`` (plain Triton), as in the Triton
forward (see ``gluon.forward``), every ``tl.dot`` on Hopper waits for its result, so the elementwise work
never overlaps the tensor cores. These kernels use asynchronous wgmma: one program per (K/V
block, batch·kv head) keeps K, V and the fp32 dK, dV accumulators on chip and streams the Q and
dO blocks of every query head of its GQA group through a TMA ring. Per Q block (transposed form,
rows = keys), on each warpgroup's 64 keys:

    issue Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ        (async)
    wait Sᵀ;  Pᵀ = exp2(Sᵀ·scale − lse)                          (dPᵀ still runs)
    wait dPᵀ; issue dV += Pᵀ·dO                                  (async)
    dSᵀ = Pᵀ∘(dPᵀ − delta)                                      (dV's matmul runs)
    issue dK += dSᵀ·Q                                            (async)
    CARRY_DK: wait dK in the next block's first wait; else wait dV and dK now
    WITH_DQ only: dSᵀ to shared memory, dQ_part = dS·K, add dQ_part into an fp32 dQ buffer
    LSE_EARLY (WS only): the LSE/delta rows loaded before the Q/dO wait (1), a block ahead (2), or
    read from shared memory where the producer staged them (3: the default of config_for and of
    the unordered fused config)

Two kernels run this loop. ``_attn_bwd_sm90_ws`` (``WS=True``, the default): a 1-warp producer
partition streams K/V and the Q/dO ring with TMA, two 4-warp consumer partitions own the two
64-key halves and release a ring slot through an mbarrier once their last matmul on it retired;
in the fused mode a fourth partition (one warp, ``_bwd_ws_dq_writer``) adds the dQ parts the
consumers stage. ``_attn_bwd_sm90`` (``WS=False``): 8 warps in one partition, whose two warpgroups meet at a CTA
barrier before each refill; it also has the fused mode. Both do the same arithmetic per element
in the same order, so their dK and dV are the same bits (GPU-tested).

``CARRY_DK``: when dK stays in flight across the loop's back edge, ptxas serializes every wgmma
(performance advisory C7515: a wait after each HGMMA in the SASS), so the overlap above does not
happen. Waiting for dK within the block removes that; it measured 6–10% faster at D = 128 and is
the default there, while at D = 64 with 128-row Q blocks it spills and is slower, so D = 64
non-causal keeps the carry; D = 64 causal uses 64-row Q blocks without it (docs/perf-notes.md,
"Lessons").

A third kernel, ``_attn_bwd_dq_sm90_ws`` (:func:`backward_dq`), computes dQ with the forward's
warp-specialized structure (Q-stationary, K/V streamed). It is the default dQ path with the
Gluon dK/dV kernel (debug switch ``gluon_dq=0``: the Triton dQ kernel instead), and by default it
runs first and computes delta = rowsum(dO∘O) itself (``FUSE_DELTA``, :func:`dq_computes_delta`),
which the dK/dV kernel then reads: no delta kernel (the backward 4.5–5.6% faster at
N = 1k, H200, fp16, 2026-12-03). On the H200 it
runs at 1061–1165 TFLOP/s-equivalent alone at D = 128, N = 4k–16k, where the Triton dQ kernel
ran at ~1020 (derived from the whole backward).

D = 256 (``SPLIT_D``). One warpgroup cannot hold 64 keys of dK and dV
across 256 columns (256 fp32 registers per thread), so at D = 256 both kernels run with the two
consumer warpgroups on the same 64 keys (dK/dV) or 64 rows (dQ), each owning one column half of
the accumulators. The block's two score matmuls are split between them instead: consumer 0
computes S and P, consumer 1 dP and, from P (passed through shared memory in fp32), dS, which it
passes back in the input dtype (``_bwd_ws_split_consumer``, ``_dq_ws_split_consumer``). Each
consumer issues half the multiply-adds. On the H200 (fp16, N = 4k
non-causal, 2026-12-03) the dK/dV kernel took 2114 µs against the Triton dK/dV kernel's 3785, and the dQ
kernel 1468 against the Triton dQ kernel's 1950.

Launch order. The default dK/dV grid runs a head's K/V blocks together
(``PER_HEAD``), so that they share the head's Q and dO in L2, and so does the fused mode with
unordered dQ sums (FA4's order; its fp32 dQ stays in L2 too); the fused mode's ordered sums keep
the 2-D grid with heads fastest (they take their turn from the K block's index in either grid,
so ``PER_HEAD`` is allowed there, opt-in). An opt-in
overlap (off by default: its A/B was within noise, and its ordering is not established): the
dK/dV kernel lets dependents launch from its start (``PDL_TRIGGER``) and the dQ kernel is
launched with programmatic dependent launch (``PDL`` in its config), without a
``griddepcontrol.wait``.

Two modes (``WITH_DQ``, a constexpr):

* ``False``, the default (:func:`config_for`): dK and dV only. ``tileflash.ops.triton.backward``
  then runs the Gluon dQ kernel above (or its Triton dQ kernel where that one does not apply), which
  recomputes S and dP per (Q block, K block): 7 matmuls per
  pair in all, no atomics, bitwise deterministic. At D=128 the first (8-warp) Gluon dK/dV kernel
  measured 17–27% faster than the Triton dK/dV kernel, and the warp-specialized default is 9–13%
  faster than that one (H200, fp16).
* ``True``, the fused FA2/FA3 schedule (5 matmuls per pair): the fp32 dQ buffer is shared by
  every K block, so its updates are atomic adds. By default they are **ordered** (FA3's
  deterministic mode): the program of K block n adds to Q block m only after the programs of K
  blocks 0..n-1 have added theirs (a per-(b, h, Q block) counter in global memory, released
  after each add), so the fp32 sums happen in the same order on every run.
  ``deterministic=False`` drops the ordering. Two kernels have it:

  - the warp-specialized one (``WS=True``, :func:`fused_config_for`; routed to by
    ``deterministic=False`` where it measured faster, unordered, ``tileflash.ops.route._fused_backward``,
    and with its ordered sums only by the debug switch ``gluon_fused=1``), with FA3's layout of the dQ step: both consumers write their
    keys of dSᵀ to one shared buffer, each computes one column half of the Q block's dQ part over
    all the block's keys and stages it in shared memory, and a writer warp adds the halves with
    TMA bulk reductions and keeps the order, so no consumer waits on it. On the H200 (fp16,
    2026-12-02) the whole backward measured 0.72–1.02× the split default ordered at D = 128
    (1.02× only at non-causal 16k; an earlier layout with a dQ part per consumer: 0.58–0.76×), so
    ``deterministic=True`` keeps the split kernels;
  - the 8-warp one (``WS=False``): per-thread vector atomics; slower still, reachable
    through ``backward(..., cfg=dict(..., WITH_DQ=True, WS=False))`` only.

  Both are correct and bitwise reproducible when ordered (GPU-tested).

Scope, decided by :func:`supported`: dense fp16/bf16 on sm90, head dim 64, 128 or 256 (or
between 64 and 128, run at 128 on zero-padded copies: :func:`padded_head_dim`), no
window/softcap/ALiBi/dropout, causal only bottom-right with Sq <= Sk, Sq a multiple of 128 and Sk
of the dK/dV kernel's key block (128; 64 at D = 256),
16-byte aligned memory in the (B, S, H, D) or (B, H, S, D) layouts. Everything else runs the
Triton backward, which stays the reference (and the CPU-interpreter path). Numerics follow
``tileflash.ops.triton.backward``: base-2 scores with the scale folded in, the natural-log LSE
converted on load, fp32 accumulation, P and dS cast to the input dtype for their matmuls.
"""

from __future__ import annotations


import torch

from tileflash.ops.gluon import forward as _f90
from tileflash.ops.launch import Launch, addresses, launch_or_fall_back
from tileflash.ops.triton.backward import compute_delta as _compute_delta
from tileflash.ops.triton.backward import scale_cast as _scale_cast
from tileflash.options import DEBUG
from tileflash.ops.utils import GRID_YZ_MAX, LOG2E

from tileflash.ops.gluon.common import (_cta_barrier, fence_async_shared, gl, gluon, mbarrier, warpgroup_mma,
                                        warpgroup_mma_init, warpgroup_mma_wait)

@gluon.jit
def _dq_add(ptrs, vals, VEC: gl.constexpr):
    """DQ[ptrs] += vals (fp32, relaxed atomics). VEC = 2: one red.global.add.v2.f32 per pair of
    a thread's consecutive registers, which the wgmma result layout holds as adjacent columns
    (sm90's vector reductions: half the instructions of one add per element)."""
    if VEC == 2:
        gl.inline_asm_elementwise("red.relaxed.gpu.global.add.v2.f32 [$2], {$4, $5};\n\tmov.b32 $0, 0;\n\tmov.b32 $1, 0;",
                                  "=r,=r,l,l,f,f", [ptrs.to(gl.int64, bitcast=True), vals], dtype=gl.int32, is_pure=False, pack=2)
    else:
        gl.atomic_add(ptrs, vals, sem="relaxed")

@gluon.jit
def _refill(q_desc, do_desc, q_bar, q_smem, do_smem, stage, i, total, per_head, lo, off_b, off_hk, kv_group,
            q_rb, q_rh, q_ch, BLOCK_M: gl.constexpr):
    """TMA the Q and dO blocks of iteration i (head off_hk·G + i // per_head) into ring slot
    `stage`, if i < total."""
    h = off_hk * kv_group + i // per_head
    row = off_b * q_rb + h * q_rh + lo + (i % per_head) * BLOCK_M
    pred = i < total
    nbytes: gl.constexpr = 2 * q_desc.block_type.nbytes
    mbarrier.expect(q_bar.index(stage), nbytes, pred=pred)
    _f90._tma_load(q_desc, [row, h * q_ch], q_bar.index(stage), q_smem.index(stage), pred=pred)
    _f90._tma_load(do_desc, [row, h * q_ch], q_bar.index(stage), do_smem.index(stage), pred=pred)

@gluon.jit
def _dq_ordered_add(ptrs, dq_part, sem_ptr, order, DETERMINISTIC: gl.constexpr, VEC: gl.constexpr):
    """Add dq_part at ptrs; DETERMINISTIC: only after `order` earlier K blocks have added theirs
    to this Q block (counter at sem_ptr), and count this one after."""
    if DETERMINISTIC:
        while gl.atomic_add(sem_ptr, 0, sem="acquire") < order:
            pass
        _cta_barrier()
    _dq_add(ptrs, dq_part, VEC)
    if DETERMINISTIC:
        _cta_barrier()      # every thread's adds are issued before the release
        gl.atomic_add(sem_ptr, 1, sem="release")

@gluon.jit
def _dq_turn(sem_ptr, order):
    """Wait until `order` adds to this Q block have completed (the counter at sem_ptr)."""
    while gl.atomic_add(sem_ptr, 0, sem="acquire") < order:
        pass
    _cta_barrier()

@gluon.jit
def _dq_turn_done(sem_ptr):
    """Count this partition's adds to the Q block once its TMA reductions have completed (written
    to global memory, not only read from shared memory): the issuing thread waits for them, and
    the barrier orders that wait before the release."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\n\tmov.b32 $0, 0;", "=r,r", [sem_ptr.to(gl.int64, bitcast=True).to(gl.int32)],
                              dtype=gl.int32, is_pure=False, pack=1)
    _cta_barrier()
    gl.atomic_add(sem_ptr, 1, sem="release")

@gluon.jit
def _let_dependents_launch():
    """griddepcontrol.launch_dependents: the next kernel in the stream, if launched with
    programmatic dependent launch (PDL), may be scheduled once every program of this one has
    run this (or exited). The dQ kernel after the dK/dV kernel reads nothing the dK/dV kernel
    writes and runs no griddepcontrol.wait: it takes the SMs the dK/dV kernel's last programs
    free. Opt-in (PDL_TRIGGER / PDL): that a kernel after the dQ kernel also waits for the
    dK/dV kernel is assumed from CUDA's stream order, not established."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents;\n\tmov.b32 $0, 0;", "=r,r", [gl.program_id(0)],
                              dtype=gl.int32, is_pure=False, pack=1)

@gluon.jit
def _kv_block_coords(nheads_k, seqlen_q, seqlen_k, kv_rb, kv_rh, kv_ch, BLOCK_N: gl.constexpr,
                     PER_HEAD: gl.constexpr = False):
    """Which (batch, kv head, K/V block) a dK/dV program owns and where its K/V tile starts in
    the 2-D views: (off_b, off_hk, start_n, shift, kv_row, kv_col).
    Grid (batch·kv heads, K/V blocks): heads fastest, so block n of every head is launched before
    block n + 1 (the order the ordered dQ adds of the fused mode wait in).
    PER_HEAD: a 1-D grid of batch·kv heads · K/V blocks, K/V blocks fastest, so the programs of
    one head run together and share its Q/dO in L2 (block 0, the longest when causal, first).
    (The fused mode's dQ writer takes its ordered adds' turn from start_n // BLOCK_N there.)"""
    if PER_HEAD:
        n_blocks = seqlen_k // BLOCK_N
        pid_bhk = gl.program_id(0) // n_blocks
        pid_n = gl.program_id(0) % n_blocks
    else:
        pid_bhk = gl.program_id(0)
        pid_n = gl.program_id(1)
    off_b = pid_bhk // nheads_k
    off_hk = pid_bhk % nheads_k
    start_n = pid_n * BLOCK_N
    shift = seqlen_k - seqlen_q
    kv_row = off_b * kv_rb + off_hk * kv_rh + start_n
    return off_b, off_hk, start_n, shift, kv_row, off_hk * kv_ch

@gluon.jit
def _q_range(start_n, shift, seqlen_q, kv_group, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
             CAUSAL: gl.constexpr):
    """The Q blocks a K/V block at start_n works through: (n_m, lo, mask_end, per_head, total).
    Q blocks [lo, seqlen_q) see some key of the block, those starting before mask_end need the
    causal mask; per_head blocks per query head, total over the GQA group's heads."""
    n_m = seqlen_q // BLOCK_M
    if CAUSAL:
        lo = gl.maximum(start_n - shift, 0) // BLOCK_M * BLOCK_M
        mask_end = gl.minimum(gl.maximum(start_n + BLOCK_N - shift, 0), seqlen_q)
    else:
        lo = 0
        mask_end = 0
    per_head = n_m - lo // BLOCK_M
    total = per_head * kv_group          # iterations: every Q block of every head of the group
    return n_m, lo, mask_end, per_head, total

@gluon.jit
def _lse_rows(LSE, row_lse, offs_m):
    """The base-2 LSE of rows offs_m ([BLOCK_M])."""
    return gl.load(LSE + row_lse + offs_m) * 1.4426950408889634                       # [BLOCK_M] base 2

@gluon.jit
def _lse_delta(LSE, DELTA, row_lse, offs_m):
    """The base-2 LSE and delta of rows offs_m ([BLOCK_M] each)."""
    lse = _lse_rows(LSE, row_lse, offs_m)                                             # [BLOCK_M] base 2
    delta = gl.load(DELTA + row_lse + offs_m)                                         # [BLOCK_M]
    return lse, delta

@gluon.jit
def _stage_lse_delta(LSE, DELTA, lse_s, delta_s, bar, i, per_head, lo, off_b, off_hk, kv_group, stride_lb,
                     stride_lh, BLOCK_M: gl.constexpr):
    """(LSE_EARLY=3, in the 1-warp producer) the base-2 LSE and the delta rows of iteration i's Q
    block into lse_s and delta_s ([BLOCK_M] fp32 each), then the second arrival on that ring
    slot's full barrier (the first is the TMA's expect), so a consumer past that barrier reads
    both from shared memory instead of global memory. The loads follow the slot's TMA issue, so
    their latency overlaps the Q/dO copies."""
    layout: gl.constexpr = gl.BlockedLayout([BLOCK_M // 32], [32], [1], [0])
    h = off_hk * kv_group + i // per_head
    lse, delta = _lse_delta(LSE, DELTA, off_b * stride_lb + h * stride_lh,
                            lo + (i % per_head) * BLOCK_M + gl.arange(0, BLOCK_M, layout=layout))  # [BLOCK_M]
    lse_s.store(lse)
    delta_s.store(delta)
    _cta_barrier()   # the warp's stores precede the arrival
    mbarrier.arrive(bar, count=1)

@gluon.jit
def _probs_t(st, lse, qk_scale, start_k, offs_n, start_m, offs_m, mask_end, shift, CAUSAL: gl.constexpr):
    """Pᵀ = exp2(Sᵀ·scale − lse) for keys start_k + offs_n (rows) and queries offs_m (columns),
    0 where the bottom-right causal mask hides a key (only Q blocks before mask_end need it)."""
    pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))                              # [keys, BLOCK_M]
    if CAUSAL:
        if start_m < mask_end:  # bottom-right: key j visible to row i iff j <= i + shift
            vis = gl.expand_dims(start_k + offs_n, 1) <= gl.expand_dims(offs_m + shift, 0)
            pt = gl.where(vis, pt, 0.0)
    return pt

@gluon.jit
def _store_dkdv(DK, DV, dk, dv, start_k, off_b, off_hk, sm_scale,
                stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
                ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, LAYOUT: gl.constexpr, D_OUT: gl.constexpr = 0):
    """dK = scale · Σ dSᵀ·Q and dV as accumulated, for keys [start_k, +ROWS): plain stores.
    D_OUT (0: HEAD_DIM): the gradients' own head dim, when the kernel runs on copies padded to
    HEAD_DIM columns (padded_head_dim): only the first D_OUT columns are stored."""
    offs_kn = gl.arange(0, ROWS, layout=gl.SliceLayout(1, LAYOUT))
    offs_kd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, LAYOUT))
    rows = gl.expand_dims(start_k + offs_kn, 1).to(gl.int64)
    cols = gl.expand_dims(offs_kd, 0)
    dtype: gl.constexpr = DK.dtype.element_ty
    if D_OUT == 0:
        gl.store(DK + off_b.to(gl.int64) * stride_dkb + off_hk * stride_dkh + rows * stride_dkn + cols,
                 (dk * sm_scale).to(dtype))
        gl.store(DV + off_b.to(gl.int64) * stride_dvb + off_hk * stride_dvh + rows * stride_dvn + cols,
                 dv.to(dtype))
    else:
        mask = (rows >= 0) & (cols < D_OUT)                                           # [ROWS, HEAD_DIM]
        gl.store(DK + off_b.to(gl.int64) * stride_dkb + off_hk * stride_dkh + rows * stride_dkn + cols,
                 (dk * sm_scale).to(dtype), mask=mask)
        gl.store(DV + off_b.to(gl.int64) * stride_dvb + off_hk * stride_dvh + rows * stride_dvn + cols,
                 dv.to(dtype), mask=mask)

@gluon.jit
def _attn_bwd_sm90(
    q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DQ, SEM, DK, DV,
    q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,       # 2-D view offsets (gluon.forward._view_params)
    stride_lb, stride_lh, dq_stride,
    stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
    nheads, nheads_k, kv_group, seqlen_q, seqlen_k, qk_scale, sm_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, DETERMINISTIC: gl.constexpr, VEC: gl.constexpr, WITH_DQ: gl.constexpr,
    CARRY_DK: gl.constexpr, num_warps: gl.constexpr, D_OUT: gl.constexpr = 0,
):
    """One program per (batch·kv head, K/V block): grid axis 0 is batch·kv head, so the
    programs of K block n of every head are launched before those of block n + 1 (the
    deterministic mode waits on lower blocks only: no deadlock, little waiting)."""
    off_b, off_hk, start_n, shift, kv_row, kv_col = _kv_block_coords(nheads_k, seqlen_q, seqlen_k, kv_rb, kv_rh,
                                                                     kv_ch, BLOCK_N)

    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    dkv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                                        instr_shape=[16, HEAD_DIM // (num_warps // 4), 16])
    dtype: gl.constexpr = q_desc.dtype

    k_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], ds_layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(q_bar.index(i), count=1)

    n_m, lo, mask_end, per_head, total = _q_range(start_n, shift, seqlen_q, kv_group, BLOCK_M, BLOCK_N, CAUSAL)

    kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes
    mbarrier.expect(kv_bar, kv_bytes)
    _f90._tma_load(k_desc, [kv_row, kv_col], kv_bar, k_smem)
    _f90._tma_load(v_desc, [kv_row, kv_col], kv_bar, v_smem)
    for i in gl.static_range(STAGES):  # fill the Q/dO ring
        _refill(q_desc, do_desc, q_bar, q_smem, do_smem, i, i, total, per_head, lo, off_b, off_hk, kv_group,
                q_rb, q_rh, q_ch, BLOCK_M)

    offs_mb = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))              # [BLOCK_M]
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))               # [BLOCK_N]
    dq_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))                 # [BLOCK_M]
    dq_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))                # [HEAD_DIM]
    if CARRY_DK:  # dK is carried between iterations as an in-flight wgmma accumulator
        dk = warpgroup_mma_init(gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, dkv_layout))   # [BLOCK_N, HEAD_DIM]
    else:
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, dkv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, dkv_layout)                        # [BLOCK_N, HEAD_DIM]
    mbarrier.wait(kv_bar, 0)

    zero_st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    zero_dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, dq_layout)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dkv_layout, k_width=2)
    for it in range(total):
        stage = it % STAGES
        h = off_hk * kv_group + it // per_head
        start_m = lo + (it % per_head) * BLOCK_M
        bh = off_b * nheads + h
        row_lse = off_b * stride_lb + h * stride_lh
        q_s = q_smem.index(stage)                                                     # [BLOCK_M, HEAD_DIM]
        do_s = do_smem.index(stage)                                                   # [BLOCK_M, HEAD_DIM]
        mbarrier.wait(q_bar.index(stage), (it // STAGES) & 1)
        st_tok = warpgroup_mma(k_smem, q_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v_smem, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        offs_m = start_m + offs_mb                                                    # [BLOCK_M]
        lse, delta = _lse_delta(LSE, DELTA, row_lse, offs_m)                          # [BLOCK_M] each
        # groups retire in order: dK of the previous block (if carried), then Sᵀ; dPᵀ runs on
        if CARRY_DK:
            st, dk = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok, dk))        # [BLOCK_N, BLOCK_M]
        else:
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok,))
        # both warpgroups are past this point: every matmul of the previous block has retired,
        # so its ring slot (last read by dK) and dS (last read by dQ) are free
        _cta_barrier()
        _refill(q_desc, do_desc, q_bar, q_smem, do_smem, (it + STAGES - 1) % STAGES, it - 1 + STAGES,
                gl.where(it >= 1, total, 0), per_head, lo, off_b, off_hk, kv_group, q_rb, q_rh, q_ch, BLOCK_M)
        pt = _probs_t(st, lse, qk_scale, start_n, offs_n, start_m, offs_m, mask_end, shift, CAUSAL)  # [BLOCK_N, BLOCK_M]
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt_tok,))                  # [BLOCK_N, BLOCK_M]
        b_pt = gl.convert_layout(pt.to(dtype), op_layout)                             # [BLOCK_N, BLOCK_M]
        dv = warpgroup_mma(b_pt, do_s, dv, is_async=True)                             # [BLOCK_N, HEAD_DIM]
        dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)                       # [BLOCK_N, BLOCK_M]
        if WITH_DQ:
            ds_smem.store(dst)
            fence_async_shared()
            _cta_barrier()   # both warpgroups' rows of dSᵀ are in shared memory
            dq_tok = warpgroup_mma(ds_smem.permute((1, 0)), k_smem, zero_dq, use_acc=False, is_async=True)
            dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)  # [BLOCK_N, HEAD_DIM]
            # dV and dQ retire, dK runs on during the adds
            dq_part, dv = warpgroup_mma_wait(num_outstanding=1, deps=(dq_tok, dv))   # [BLOCK_M, HEAD_DIM]
            ptrs = DQ + bh.to(gl.int64) * seqlen_q * dq_stride + gl.expand_dims(start_m + dq_m, 1) * dq_stride \
                + gl.expand_dims(dq_d, 0)                                             # [BLOCK_M, HEAD_DIM]
            _dq_ordered_add(ptrs, dq_part, SEM + bh * n_m + start_m // BLOCK_M, gl.program_id(1), DETERMINISTIC, VEC)
            if not CARRY_DK:
                dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
        else:  # dQ is left to another kernel
            dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)
            if CARRY_DK:  # dK runs on into the next block
                dv = warpgroup_mma_wait(num_outstanding=1, deps=(dv,))
            else:
                dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
    if CARRY_DK:
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))

    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_bar.index(i))

    _store_dkdv(DK, DV, dk, dv, start_n, off_b, off_hk, sm_scale, stride_dkb, stride_dkn, stride_dkh,
                stride_dvb, stride_dvn, stride_dvh, BLOCK_N, HEAD_DIM, dkv_layout, D_OUT)


# ------------------------------------------------------------------------------------------
# Warp-specialized dK/dV kernel: a 1-warp producer streams the Q/dO ring with TMA, and two
# 4-warp consumers own the two 64-key halves of the K/V block. Each consumer releases a ring
# slot through an mbarrier when its last matmul on it retires, instead of a CTA-wide barrier
# per Q block, so the two warpgroups drift apart and one's softmax overlaps the other's matmuls
# (the barrier was the largest stall of _attn_bwd_sm90 under Nsight Compute).
# The fused mode (WITH_DQ) adds a 1-warp writer partition for the dQ reductions.
# ------------------------------------------------------------------------------------------
@gluon.jit
def _bwd_ws_producer(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_full,
                     q_empty, kv_row, kv_col, total, per_head, lo, off_b, off_hk, kv_group, q_rb, q_rh, q_ch,
                     HALF_N: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, KV_PARTS: gl.constexpr = 2,
                     ld_smem=None, LSE=None, DELTA=None, stride_lb=0, stride_lh=0, LSE_EARLY: gl.constexpr = 0):
    """K and V (KV_PARTS pieces of HALF_N keys each: the two halves, or with SPLIT_D the whole
    block) once, then the Q/dO blocks of iteration i into slot i % STAGES once both consumers
    have released that slot's previous block; LSE_EARLY=3: also that block's LSE and delta rows
    into ld_smem's slot (_stage_lse_delta)."""
    mbarrier.expect(kv_bar, 2 * KV_PARTS * k_desc.block_type.nbytes)
    for c in gl.static_range(KV_PARTS):
        _f90._tma_load(k_desc, [kv_row + c * HALF_N, kv_col], kv_bar, k_smem.index(c))
        _f90._tma_load(v_desc, [kv_row + c * HALF_N, kv_col], kv_bar, v_smem.index(c))
    for i in range(total):
        slot = i % STAGES
        released = ((i // STAGES) & 1) ^ 1   # parity of the release of block i - STAGES
        mbarrier.wait(q_empty.index(slot), released, pred=i >= STAGES)
        _refill(q_desc, do_desc, q_full, q_smem, do_smem, slot, i, total, per_head, lo, off_b, off_hk,
                kv_group, q_rb, q_rh, q_ch, BLOCK_M)
        if LSE_EARLY == 3:
            _stage_lse_delta(LSE, DELTA, ld_smem[0].index(slot), ld_smem[1].index(slot), q_full.index(slot), i,
                             per_head, lo, off_b, off_hk, kv_group, stride_lb, stride_lh, BLOCK_M)

@gluon.jit
def _stage_dq(dq_part, dq_smem, dq_full, dq_empty, slot, it, DQ_BUFS: gl.constexpr):
    """A consumer's dQ part of block it (a column half; with DQ_ALT the whole part, with DQ_MSPLIT a
    row half) into staging slot ``slot`` for the writer partition, once the writer's reduction of
    block it - DQ_BUFS read it."""
    mbarrier.wait(dq_empty.index(slot), ((it // DQ_BUFS) & 1) ^ 1, pred=it >= DQ_BUFS)
    dq_smem.index(slot).store(dq_part)
    fence_async_shared()
    _cta_barrier()
    mbarrier.arrive(dq_full.index(slot), count=1)

@gluon.jit
def _bwd_ws_consumer(shared, writer_bars, C: gl.constexpr, HALF_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                     BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, CARRY_DK: gl.constexpr,
                     PINGPONG: gl.constexpr, WITH_DQ: gl.constexpr, DQ_BUFS: gl.constexpr, DQ_FIRST: gl.constexpr,
                     DQ_OWN_FIRST: gl.constexpr, LSE_EARLY: gl.constexpr = 0, D_OUT: gl.constexpr = 0,
                     ld_smem=None, DQ_ALT: gl.constexpr = False, DQ_LATE: gl.constexpr = False,
                     DQ_MSPLIT: gl.constexpr = False):
    """Keys [start_n + C·HALF_N, +HALF_N): the dK/dV schedule of _attn_bwd_sm90 (WITH_DQ=False)
    on one warpgroup, releasing each ring slot when its dK matmul retires. ``shared`` holds
    what both consumers get alike (buffers, barriers, pointers, coordinates and strides; see
    _attn_bwd_sm90_ws), as the forward's _ws_consumer does. CARRY_DK as there:
    True leaves dK in flight into the next block, which makes ptxas serialize every wgmma
    (C7515); False waits for dK at the end of each block. PINGPONG: each of the block's two
    matmul issues (Sᵀ and dPᵀ; dV and dK) is a turn taken alternately with the other consumer
    (the forward's _ws_turn / _ws_pass, two turns per block), so one consumer's elementwise
    work runs while the other's matmuls do; False: the consumers run free.

    WITH_DQ (PINGPONG and CARRY_DK off): the fused schedule, with FA3's layout of the dQ step.
    Each consumer writes its HALF_N keys of dSᵀ into the block's shared dSᵀ (double-buffered)
    and arrives on ds_full; once both halves are there it computes one column half of the Q
    block's dQ part over all BLOCK_N keys, dQ[:, C·D/2 : +D/2] = dS·K[:, C·D/2 : +D/2] (two
    wgmmas, one per key half: DQ_OWN_FIRST issues its own half before waiting for the other
    consumer's), and stages the fp32 [BLOCK_M, D/2] result in a slot of dq_smem (DQ_BUFS blocks
    deep) for the writer partition (_bwd_ws_dq_writer), which adds it to global memory.
    DQ_FIRST: dQ is issued before dK, so dK runs on while dQ is staged; else after it.
    LSE_EARLY (where a Q block's LSE and delta rows are loaded from global memory): 0 after the
    block's Sᵀ/dPᵀ issue; 1 before its Q/dO wait; 2 one block ahead, once the previous block's
    dSᵀ is computed (its registers are then free), so the load runs under dV's and dK's matmuls
    (with WITH_DQ it comes after the block's matmuls have retired, so nothing overlaps it there;
    the fused config keeps 0); 3 from shared memory (ld_smem: the LSE and delta rings,
    [STAGES, BLOCK_M] each), where the producer put them (FA3's way: no global-load latency in the
    consumers and no rows held across blocks), the LSE after the Q/dO wait and delta just before
    dSᵀ.

    DQ_ALT (WITH_DQ): the consumers take turns at dQ instead of splitting its columns: consumer
    it % 2 computes the whole [BLOCK_M, HEAD_DIM] dQ part of block it over all BLOCK_N keys (two
    wgmmas of N = HEAD_DIM rather than four of N = HEAD_DIM / 2: at D = 64 a column half is an N = 32
    wgmma, which reads 1.5x the shared-memory operand bytes per multiply-add of an N = 64 one) and
    stages it in one slot for the writer; the other consumer does not wait for the dSᵀ exchange in
    that block. dSᵀ buffer it % 2 is then read by its owner only; the consumers still alternate
    in lockstep (each owner waits for the other's half), which is what frees the buffers.
    Measured level with the column halves at D = 64 (H100, 2026-12-05): opt-in, not routed.

    DQ_LATE (WITH_DQ, not DQ_ALT): block it's dQ part is staged for the writer after block it + 1's
    Sᵀ and dPᵀ are issued (the last block's after the loop), so that the shared-memory store, its
    proxy fence and the warpgroup barrier run under those matmuls instead of with nothing in flight
    (Nsight Compute, D = 64: the consumers' fences after shared-memory stores hold 17% of their
    stall samples, FA4's 9%). Measured level at D = 64 (H100, 2026-12-05); at D = 128 ptxas
    serializes the wgmmas with it. Opt-in, not routed.

    DQ_MSPLIT (WITH_DQ, 128-row Q blocks; not DQ_ALT, DQ_LATE or DQ_OWN_FIRST): the consumers split
    dQ's rows instead of its columns (FA4's D = 64 layout): consumer C computes rows
    [C·BLOCK_M/2, +BLOCK_M/2) of the block's dQ part over all BLOCK_N keys and all HEAD_DIM columns,
    dS·K with dS read from both dSᵀ halves' column slices (two wgmmas of N = HEAD_DIM, one per key
    half), and stages that [BLOCK_M/2, HEAD_DIM] part in its slot for the writer. At D = 64 with
    128-row blocks this replaces sixteen m64n32 wgmmas per consumer and block by eight m64n64 ones
    (sm_90 SASS, triton 3.6, unordered with LSE_EARLY=3: 536 instructions per 128-row block against
    567 for the column halves and 2 x 324 for two 64-row blocks; 16 bytes of spills against 32;
    ordered, LSE_EARLY=0: 116 / 140 bytes of spill stores / loads against 128 / 144). The synchronisation is the
    column halves' (each consumer waits for both dSᵀ halves, stages one part per block). Compiled
    only: not run on a GPU yet (2026-12-05), opt-in, not routed."""
    (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, q_full, q_empty, pp_bar, LSE, DELTA, DK, DV,
     off_b, off_hk, start_n, lo, mask_end, per_head, total, kv_group, shift, qk_scale, sm_scale,
     stride_lb, stride_lh, stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
     seqlen_q, nheads, n_m) = shared
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    dkv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dkv_layout, k_width=2)
    dtype: gl.constexpr = k_smem.dtype
    k_c = k_smem.index(C)                                                             # [HALF_N, HEAD_DIM]
    v_c = v_smem.index(C)                                                             # [HALF_N, HEAD_DIM]
    start_c = start_n + C * HALF_N
    offs_mb = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))              # [BLOCK_M]
    offs_n = gl.arange(0, HALF_N, layout=gl.SliceLayout(1, st_layout))                # [HALF_N]
    if CARRY_DK:
        dk = warpgroup_mma_init(gl.zeros([HALF_N, HEAD_DIM], gl.float32, dkv_layout))  # [HALF_N, HEAD_DIM]
    else:
        dk = gl.zeros([HALF_N, HEAD_DIM], gl.float32, dkv_layout)
    dv = gl.zeros([HALF_N, HEAD_DIM], gl.float32, dkv_layout)                         # [HALF_N, HEAD_DIM]
    zero_st = gl.zeros([HALF_N, BLOCK_M], gl.float32, st_layout)
    if WITH_DQ:
        gl.static_assert(not CARRY_DK, "WITH_DQ waits for dK within each block (CARRY_DK=False)")
        ds_full, dq_full, dq_empty = writer_bars
        DQ_D: gl.constexpr = HEAD_DIM if (DQ_ALT or DQ_MSPLIT) else HEAD_DIM // 2    # this consumer's dQ columns
        DQ_M: gl.constexpr = BLOCK_M // 2 if DQ_MSPLIT else BLOCK_M                  # ... and rows
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                            instr_shape=[16, DQ_D, 16])
        OTHER: gl.constexpr = 1 - C
    if LSE_EARLY == 2:  # the first block's rows (total >= 1, since lo < seqlen_q)
        lse_n, delta_n = _lse_delta(LSE, DELTA, off_b * stride_lb + off_hk * kv_group * stride_lh, lo + offs_mb)
    if DQ_LATE:
        gl.static_assert(WITH_DQ and not DQ_ALT, "DQ_LATE delays the column halves' staging (WITH_DQ, not DQ_ALT)")
        dq_prev = gl.zeros([BLOCK_M, DQ_D], gl.float32, dq_layout)                     # block it - 1's part
    mbarrier.wait(kv_bar, 0)
    for it in range(total):
        stage = it % STAGES
        h = off_hk * kv_group + it // per_head
        start_m = lo + (it % per_head) * BLOCK_M
        row_lse = off_b * stride_lb + h * stride_lh
        offs_m = start_m + offs_mb                                                    # [BLOCK_M]
        q_s = q_smem.index(stage)                                                     # [BLOCK_M, HEAD_DIM]
        do_s = do_smem.index(stage)                                                   # [BLOCK_M, HEAD_DIM]
        if LSE_EARLY == 1:
            lse, delta = _lse_delta(LSE, DELTA, row_lse, offs_m)                      # [BLOCK_M] each
        elif LSE_EARLY == 2:
            lse = lse_n
            delta = delta_n
        mbarrier.wait(q_full.index(stage), (it // STAGES) & 1)
        if LSE_EARLY == 3:
            lse = ld_smem[0].index(stage).load(gl.SliceLayout(0, st_layout))         # [BLOCK_M] base 2
        _f90._ws_turn(pp_bar, 2 * it, C, PINGPONG)
        st_tok = warpgroup_mma(k_c, q_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        dpt_tok = warpgroup_mma(v_c, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
        _f90._ws_pass(pp_bar, C, PINGPONG)
        if DQ_LATE:  # block it - 1's dQ part, under this block's first matmuls
            if it > 0:
                _stage_dq(dq_prev, dq_smem, dq_full, dq_empty, ((it - 1) % DQ_BUFS) * 2 + C, it - 1, DQ_BUFS)
        if LSE_EARLY == 0:
            lse, delta = _lse_delta(LSE, DELTA, row_lse, offs_m)                      # [BLOCK_M] each
        if CARRY_DK:
            # dK of the previous block, then Sᵀ, retire (in order); dPᵀ runs on
            st, dk = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok, dk))        # [HALF_N, BLOCK_M]
            # every matmul of block it - 1 has retired: its slot is free as far as this consumer goes
            mbarrier.arrive(q_empty.index((it + STAGES - 1) % STAGES), count=1, pred=it >= 1)
        else:
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st_tok,))               # [HALF_N, BLOCK_M]
        pt = _probs_t(st, lse, qk_scale, start_c, offs_n, start_m, offs_m, mask_end, shift, CAUSAL)  # [HALF_N, BLOCK_M]
        dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt_tok,))                  # [HALF_N, BLOCK_M]
        b_pt = gl.convert_layout(pt.to(dtype), op_layout)                             # [HALF_N, BLOCK_M]
        if LSE_EARLY == 3:
            delta = ld_smem[1].index(stage).load(gl.SliceLayout(0, st_layout))        # [BLOCK_M]
        if PINGPONG:  # dSᵀ first, then both matmuls in one turn
            dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)                   # [HALF_N, BLOCK_M]
            _f90._ws_turn(pp_bar, 2 * it + 1, C, PINGPONG)
            dv = warpgroup_mma(b_pt, do_s, dv, is_async=True)                         # [HALF_N, HEAD_DIM]
            dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)
            _f90._ws_pass(pp_bar, C, PINGPONG)
        elif WITH_DQ:
            dv = warpgroup_mma(b_pt, do_s, dv, is_async=True)                         # [HALF_N, HEAD_DIM]
            dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)                   # [HALF_N, BLOCK_M]
            # this consumer's keys of dSᵀ into the block's double-buffered dSᵀ. The buffer of block
            # it - 2 is free: the other consumer read it before it wrote block it - 1's dSᵀ, which
            # this consumer waited for (DQ_ALT: block it - 2's owner read it before it wrote its half of
            # block it - 1, which the other consumer, that block's owner, waited for)
            ds_buf = it % 2   # (DQ_ALT: also the consumer that computes this block's dQ)
            ds_smem.index(2 * ds_buf + C).store(dst)
            fence_async_shared()
            _cta_barrier()   # every row of this warpgroup is written before the arrival
            mbarrier.arrive(ds_full.index(ds_buf), count=1)
            b_dst = gl.convert_layout(dst, op_layout)                                 # [HALF_N, BLOCK_M]
            if DQ_ALT:
                # (no wgmma stays in flight into the branch: an accumulator cannot cross it)
                dv = warpgroup_mma_wait(num_outstanding=0, deps=(dv,))
                if ds_buf == C:
                    # this block's whole dQ part over all BLOCK_N keys: dS·K, one wgmma per key half, issued
                    # before dK so that dK runs on while the part is staged
                    mbarrier.wait(ds_full.index(ds_buf), (it // 2) & 1)                  # both halves are in
                    dq_tok = gl.zeros([BLOCK_M, DQ_D], gl.float32, dq_layout)             # [BLOCK_M, HEAD_DIM]
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf).permute((1, 0)), k_smem.index(0), dq_tok,
                                           use_acc=False, is_async=True)
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf + 1).permute((1, 0)), k_smem.index(1), dq_tok,
                                           is_async=True)
                    dk = warpgroup_mma(b_dst, q_s, dk, is_async=True)                    # [HALF_N, HEAD_DIM]
                    dq_part = warpgroup_mma_wait(num_outstanding=1, deps=(dq_tok,))       # [BLOCK_M, HEAD_DIM]
                    _stage_dq(dq_part, dq_smem, dq_full, dq_empty, it % DQ_BUFS, it, DQ_BUFS)
                    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
                else:
                    dk = warpgroup_mma(b_dst, q_s, dk, is_async=True)                    # [HALF_N, HEAD_DIM]
                    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
                mbarrier.arrive(q_empty.index(stage), count=1)                            # Q/dO slot done
            else:
                if not DQ_FIRST:
                    dk = warpgroup_mma(b_dst, q_s, dk, is_async=True)                    # [HALF_N, HEAD_DIM]
                # dQ[:, C·DQ_D : +DQ_D] of this Q block over all BLOCK_N keys: dS·K, one wgmma per key half
                # (DQ_MSPLIT: dQ[C·DQ_M : +DQ_M, :], the rows of this consumer's half of the block)
                dq_tok = gl.zeros([DQ_M, DQ_D], gl.float32, dq_layout)                    # [DQ_M, DQ_D]
                if DQ_MSPLIT:
                    mbarrier.wait(ds_full.index(ds_buf), (it // 2) & 1)                  # both halves are in
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf).slice(C * DQ_M, DQ_M, dim=1).permute((1, 0)),
                                           k_smem.index(0), dq_tok, use_acc=False, is_async=True)
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf + 1).slice(C * DQ_M, DQ_M, dim=1).permute((1, 0)),
                                           k_smem.index(1), dq_tok, is_async=True)
                elif DQ_OWN_FIRST:
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf + C).permute((1, 0)),
                                           k_smem.index(C).slice(C * DQ_D, DQ_D, dim=1), dq_tok, use_acc=False,
                                           is_async=True)
                    mbarrier.wait(ds_full.index(ds_buf), (it // 2) & 1)                  # the other half is in
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf + OTHER).permute((1, 0)),
                                           k_smem.index(OTHER).slice(C * DQ_D, DQ_D, dim=1), dq_tok, is_async=True)
                else:
                    mbarrier.wait(ds_full.index(ds_buf), (it // 2) & 1)                  # both halves are in
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf).permute((1, 0)),
                                           k_smem.index(0).slice(C * DQ_D, DQ_D, dim=1), dq_tok, use_acc=False,
                                           is_async=True)
                    dq_tok = warpgroup_mma(ds_smem.index(2 * ds_buf + 1).permute((1, 0)),
                                           k_smem.index(1).slice(C * DQ_D, DQ_D, dim=1), dq_tok, is_async=True)
                if DQ_FIRST:  # dK runs on while dQ is staged
                    dk = warpgroup_mma(b_dst, q_s, dk, is_async=True)                    # [HALF_N, HEAD_DIM]
                    dq_part, dv = warpgroup_mma_wait(num_outstanding=1, deps=(dq_tok, dv))   # [DQ_M, DQ_D]
                else:
                    dq_part, dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, dv, dk))
                    mbarrier.arrive(q_empty.index(stage), count=1)                        # Q/dO slot done
                # to the writer partition's staging slot, once its reduction of block it - DQ_BUFS read it
                if DQ_LATE:
                    dq_prev = dq_part   # staged in the next iteration (or after the loop)
                else:
                    _stage_dq(dq_part, dq_smem, dq_full, dq_empty, (it % DQ_BUFS) * 2 + C, it, DQ_BUFS)
                if DQ_FIRST:
                    dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
                    mbarrier.arrive(q_empty.index(stage), count=1)                        # Q/dO slot done
        else:  # dV runs while dSᵀ is computed
            dv = warpgroup_mma(b_pt, do_s, dv, is_async=True)                         # [HALF_N, HEAD_DIM]
            dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)                   # [HALF_N, BLOCK_M]
            dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s, dk, is_async=True)  # [HALF_N, HEAD_DIM]
        if LSE_EARLY == 2:  # the next block's rows (clamped to this one's on the last block)
            nxt = gl.minimum(it + 1, total - 1)
            lse_n, delta_n = _lse_delta(LSE, DELTA, off_b * stride_lb + (off_hk * kv_group + nxt // per_head) * stride_lh,
                                        lo + (nxt % per_head) * BLOCK_M + offs_mb)
        if CARRY_DK:  # (never with WITH_DQ, whose branch above waited already)
            dv = warpgroup_mma_wait(num_outstanding=1, deps=(dv,))                    # dK runs on
        elif not WITH_DQ:
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
            mbarrier.arrive(q_empty.index(stage), count=1)                            # block it is done
    if DQ_LATE:
        _stage_dq(dq_prev, dq_smem, dq_full, dq_empty, ((total - 1) % DQ_BUFS) * 2 + C, total - 1, DQ_BUFS)
    if CARRY_DK:
        dk = warpgroup_mma_wait(num_outstanding=0, deps=(dk,))
    _store_dkdv(DK, DV, dk, dv, start_c, off_b, off_hk, sm_scale, stride_dkb, stride_dkn, stride_dkh,
                stride_dvb, stride_dvn, stride_dvh, HALF_N, HEAD_DIM, dkv_layout, D_OUT)

@gluon.jit
def _exchange_put(smem, vals, full_bar):
    """A SPLIT_D consumer hands vals (P in fp32, or dS) to the other consumer: stored, fenced for
    the wgmma that may read it, and signalled on full_bar once every row of this warpgroup is
    written."""
    smem.store(vals)
    fence_async_shared()
    _cta_barrier()
    mbarrier.arrive(full_bar, count=1)

@gluon.jit
def _exchange_take(smem, full_bar, phase, free_bar, layout: gl.constexpr):
    """What the other SPLIT_D consumer put in smem (P), in ``layout``, once full_bar's phase has
    completed; free_bar counts this consumer's read once every row of this warpgroup has it."""
    mbarrier.wait(full_bar, phase)
    vals = smem.load(layout)
    _cta_barrier()
    mbarrier.arrive(free_bar, count=1)
    return vals

@gluon.jit
def _load_o_rows(o_rows, off_b, off_h, row0, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, D_OUT: gl.constexpr):
    """O[b, row0 : row0 + ROWS, h, :HEAD_DIM] ([ROWS, HEAD_DIM], 16-byte vectors along the head
    dim), zeros past D_OUT (a padded call's O has only its own columns; 0: every column).
    ``o_rows`` = (O, stride_ob, stride_om, stride_oh)."""
    O, stride_ob, stride_om, stride_oh = o_rows
    VEC: gl.constexpr = 8
    COLS: gl.constexpr = HEAD_DIM // VEC                                               # threads along D
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // COLS, COLS], [4, 1], [1, 0])
    offs_r = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))              # [ROWS]
    offs_d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))                 # [HEAD_DIM]
    ptrs = O + off_b.to(gl.int64) * stride_ob + off_h * stride_oh \
        + gl.expand_dims(offs_r, 1).to(gl.int64) * stride_om + gl.expand_dims(offs_d, 0)
    if D_OUT == 0:
        return gl.load(ptrs)
    mask = gl.expand_dims(offs_r >= 0, 1) & gl.expand_dims(offs_d < D_OUT, 0)
    return gl.load(ptrs, mask=mask, other=0.0)

@gluon.jit
def _delta_rows(o, do_smem, row_layout: gl.constexpr):
    """delta = rowsum(dO∘O) in fp32, as ``backward._bwd_preprocess`` computes it (both factors
    widened to fp32 first), of O's rows in registers (_load_o_rows) and the same dO rows in
    shared memory; returned in row_layout."""
    do = do_smem.load(o.type.layout)                                                  # [ROWS, HEAD_DIM]
    delta = gl.sum(o.to(gl.float32) * do.to(gl.float32), axis=1)                      # [ROWS]
    return gl.convert_layout(delta, row_layout)

@gluon.jit
def _store_dq(DQ, dq, sm_scale, off_b, off_h, stride_dqb, stride_dqm, stride_dqh, offs_qm, offs_qd,
              D_OUT: gl.constexpr):
    """DQ[b, offs_qm, h, offs_qd] = scale · dq, in DQ's dtype; D_OUT (0: every column) as in
    _store_dkdv: only the columns below it."""
    ptrs = DQ + off_b.to(gl.int64) * stride_dqb + off_h * stride_dqh \
        + gl.expand_dims(offs_qm, 1).to(gl.int64) * stride_dqm + gl.expand_dims(offs_qd, 0)
    if D_OUT == 0:
        gl.store(ptrs, (dq * sm_scale).to(DQ.dtype.element_ty))
    else:
        mask = gl.expand_dims(offs_qm >= 0, 1) & gl.expand_dims(offs_qd < D_OUT, 0)
        gl.store(ptrs, (dq * sm_scale).to(DQ.dtype.element_ty), mask=mask)

@gluon.jit
def _split_exchange(ROWS: gl.constexpr, COLS: gl.constexpr, dtype: gl.constexpr):
    """The SPLIT_D consumers' exchange (_bwd_ws_split_consumer, _dq_ws_split_consumer): one
    [ROWS, COLS] buffer for P (fp32) and one for dS (the input dtype), and their mbarriers:
    (p_smem, ds_smem, p_full, ds_full, pds_free); pds_free counts two arrivals, P read by
    consumer 1 and dS read by consumer 0."""
    p_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, COLS], gl.float32)
    p_smem = gl.allocate_shared_memory(gl.float32, [ROWS, COLS], p_layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, COLS], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [ROWS, COLS], ds_layout)
    p_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(p_full, count=1)
    mbarrier.init(ds_full, count=1)
    mbarrier.init(pds_free, count=2)
    return p_smem, ds_smem, p_full, ds_full, pds_free

@gluon.jit
def _bwd_ws_split_consumer(shared, split, C: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                           BLOCK_M: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                           D_OUT: gl.constexpr = 0):
    """SPLIT_D (D = 256, where one warpgroup cannot hold 64 keys of dK and dV across the whole
    head dim: 256 fp32 registers per thread): both consumers work on the same BLOCK_N keys, and
    consumer C owns columns [C·D/2, +D/2) of their dK and dV (128 registers, as at D = 128).
    The block's two score matmuls are split between them, each over the whole head dim:

        consumer 0: Sᵀ = K·Qᵀ (async), Pᵀ = exp2(Sᵀ·scale − lse); Pᵀ (fp32) to shared memory
        consumer 1: dPᵀ = V·dOᵀ (async); Pᵀ from shared memory; dSᵀ = Pᵀ∘(dPᵀ − delta);
                    dSᵀ (input dtype) to shared memory
        both:       dV[:, C half] += Pᵀ·dO[:, C half]    (Pᵀ from registers)
                    dK[:, C half] += dSᵀ·Q[:, C half]    (consumer 1: dSᵀ from registers; 0: shared)

    So each consumer issues half of the block's multiply-adds, and every element of Pᵀ and dSᵀ
    is the same fp32 value, rounded the same way, as in the other kernels (the exchange is in
    fp32 for Pᵀ). One buffer each for Pᵀ and dSᵀ: ``p_full`` (Pᵀ written), ``ds_full`` (dSᵀ
    written), and ``pds_free`` (count 2) once consumer 1 has read Pᵀ and consumer 0's dK matmul
    has read dSᵀ, so consumer 0 may write the next block's Pᵀ; consumer 1 writes the next dSᵀ
    only after that block's ``p_full``, which consumer 0 signals after waiting for ``pds_free``.
    Each phase flips once per block. D_OUT as in _store_dkdv (a head dim 128 < D < 256 run on
    copies padded to 256): of its column half, each consumer stores those below D_OUT."""
    (k_smem, v_smem, q_smem, do_smem, ds_unused, dq_unused, kv_bar, q_full, q_empty, pp_unused, LSE, DELTA, DK, DV,
     off_b, off_hk, start_n, lo, mask_end, per_head, total, kv_group, shift, qk_scale, sm_scale,
     stride_lb, stride_lh, stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
     seqlen_q, nheads, n_m) = shared
    p_smem, ds_smem, p_full, ds_full, pds_free = split
    HALF_D: gl.constexpr = HEAD_DIM // 2                                              # this consumer's columns
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    dkv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, HALF_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dkv_layout, k_width=2)
    dtype: gl.constexpr = k_smem.dtype
    k_all = k_smem.index(0)                                                           # [BLOCK_N, HEAD_DIM]
    v_all = v_smem.index(0)                                                           # [BLOCK_N, HEAD_DIM]
    offs_mb = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))              # [BLOCK_M]
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))               # [BLOCK_N]
    dk = gl.zeros([BLOCK_N, HALF_D], gl.float32, dkv_layout)                          # [BLOCK_N, HALF_D]
    dv = gl.zeros([BLOCK_N, HALF_D], gl.float32, dkv_layout)                          # [BLOCK_N, HALF_D]
    zero_st = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    mbarrier.wait(kv_bar, 0)
    for it in range(total):
        stage = it % STAGES
        phase = it & 1
        h = off_hk * kv_group + it // per_head
        start_m = lo + (it % per_head) * BLOCK_M
        offs_m = start_m + offs_mb                                                    # [BLOCK_M]
        q_s = q_smem.index(stage)                                                     # [BLOCK_M, HEAD_DIM]
        do_s = do_smem.index(stage)                                                   # [BLOCK_M, HEAD_DIM]
        lse, delta = _lse_delta(LSE, DELTA, off_b * stride_lb + h * stride_lh, offs_m)  # [BLOCK_M] each
        mbarrier.wait(q_full.index(stage), (it // STAGES) & 1)
        if C == 0:
            st_tok = warpgroup_mma(k_all, q_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
            st = warpgroup_mma_wait(num_outstanding=0, deps=(st_tok,))               # [BLOCK_N, BLOCK_M]
            pt = _probs_t(st, lse, qk_scale, start_n, offs_n, start_m, offs_m, mask_end, shift, CAUSAL)
            mbarrier.wait(pds_free, phase ^ 1, pred=it >= 1)   # block it - 1's Pᵀ and dSᵀ are read
            _exchange_put(p_smem, pt, p_full)
            dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_s.slice(0, HALF_D, dim=1), dv,
                               is_async=True)                                         # [BLOCK_N, HALF_D]
            mbarrier.wait(ds_full, phase)
            dk = warpgroup_mma(ds_smem, q_s.slice(0, HALF_D, dim=1), dk, is_async=True)  # [BLOCK_N, HALF_D]
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
            mbarrier.arrive(pds_free, count=1)                                        # dSᵀ is read
        else:
            dpt_tok = warpgroup_mma(v_all, do_s.permute((1, 0)), zero_st, use_acc=False, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt_tok,))              # [BLOCK_N, BLOCK_M]
            pt = _exchange_take(p_smem, p_full, phase, pds_free, st_layout)          # [BLOCK_N, BLOCK_M]
            dst = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)                   # [BLOCK_N, BLOCK_M]
            _exchange_put(ds_smem, dst, ds_full)
            dv = warpgroup_mma(gl.convert_layout(pt.to(dtype), op_layout), do_s.slice(HALF_D, HALF_D, dim=1), dv,
                               is_async=True)                                         # [BLOCK_N, HALF_D]
            dk = warpgroup_mma(gl.convert_layout(dst, op_layout), q_s.slice(HALF_D, HALF_D, dim=1), dk,
                               is_async=True)                                         # [BLOCK_N, HALF_D]
            dv, dk = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk))
        mbarrier.arrive(q_empty.index(stage), count=1)                                # block it is done
    OWN_COLS: gl.constexpr = 0 if D_OUT == 0 else D_OUT - C * HALF_D                # 0: the whole half
    _store_dkdv(DK + C * HALF_D, DV + C * HALF_D, dk, dv, start_n, off_b, off_hk, sm_scale, stride_dkb, stride_dkn,
                stride_dkh, stride_dvb, stride_dvn, stride_dvh, BLOCK_N, HALF_D, dkv_layout, OWN_COLS)

@gluon.jit
def _bwd_ws_dq_writer(dq_desc, dq_smem, dq_full, dq_empty, SEM, off_b, off_hk, kv_group, lo, per_head, total,
                      seqlen_q, nheads, n_m, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                      DQ_BUFS: gl.constexpr, DETERMINISTIC: gl.constexpr, DQ_MODE: gl.constexpr,
                      DQ_ALT: gl.constexpr = False, DQ_MSPLIT: gl.constexpr = False, start_n=0,
                      BLOCK_N: gl.constexpr = 128, PER_HEAD: gl.constexpr = False):
    """The fused mode's dQ writer (one warp). Per Q block the two consumers stage the two column
    halves of dS·K over the whole K block (_bwd_ws_consumer); this warp adds both with TMA bulk
    reductions into the fp32 (B·Sq, H·D) view behind dq_desc and frees the slots once the
    reductions have read them. DETERMINISTIC: first waits until the K blocks before this one have
    added theirs to the Q block (a counter per (b, h, Q block) at SEM), and counts this one once
    its reductions have completed, so the fp32 sums are the same bits on every run; the consumers
    never wait on the order, only on a free staging slot (FA3's deterministic mode). DQ_MODE 1 (a
    plain TMA store) and 2 (no global write) are wrong on purpose, to time the reductions' cost.
    DQ_ALT: one consumer stages the whole [BLOCK_M, HEAD_DIM] part of a block, in slot it % DQ_BUFS.
    DQ_MSPLIT: the two parts are row halves, [BLOCK_M / 2, HEAD_DIM] each. The turn of the ordered
    adds is the K block's index: program_id(1) in the 2-D grid, start_n // BLOCK_N in the 1-D
    PER_HEAD grid (which launches a head's K blocks in order, block 0 first)."""
    PARTS: gl.constexpr = 1 if DQ_ALT else 2                                        # staged parts per block
    DQ_D: gl.constexpr = HEAD_DIM if DQ_MSPLIT else HEAD_DIM // PARTS                 # a part's columns
    DQ_M: gl.constexpr = BLOCK_M // 2 if DQ_MSPLIT else 0                             # a part's row offset
    for it in range(total):
        base = (it % DQ_BUFS) * PARTS
        phase = (it // DQ_BUFS) & 1
        h = off_hk * kv_group + it // per_head
        start_m = lo + (it % per_head) * BLOCK_M
        for c in gl.static_range(PARTS):
            mbarrier.wait(dq_full.index(base + c), phase)
        if DETERMINISTIC:
            sem = SEM + (off_b * nheads + h) * n_m + start_m // BLOCK_M                # (b, h, Q block)
            # K blocks 0 .. n - 1 (this one's index in either grid) have added theirs
            _dq_turn(sem, start_n // BLOCK_N if PER_HEAD else gl.program_id(1))
        for c in gl.static_range(PARTS):
            if DQ_MSPLIT:
                coord = [off_b * seqlen_q + start_m + c * DQ_M, h * HEAD_DIM]
            else:
                coord = [off_b * seqlen_q + start_m, h * HEAD_DIM + c * DQ_D]
            if DQ_MODE == 0:
                _f90._tma_add(dq_desc, coord, dq_smem.index(base + c))
            elif DQ_MODE == 1:  # timing only (wrong dQ): a plain TMA store, no reduction
                _f90._tma_store(dq_desc, coord, dq_smem.index(base + c))
        if DETERMINISTIC:
            _dq_turn_done(sem)          # completed (in global memory), then counted
        else:
            _f90.tma.store_wait(0)      # read: the slots can be refilled
        for c in gl.static_range(PARTS):
            mbarrier.arrive(dq_empty.index(base + c), count=1)

@gluon.jit
def _attn_bwd_sm90_ws(
    q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DK, DV, dq_desc, SEM,
    q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,
    stride_lb, stride_lh,
    stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
    nheads_k, kv_group, seqlen_q, seqlen_k, qk_scale, sm_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, CARRY_DK: gl.constexpr = True,
    PINGPONG: gl.constexpr = False, WITH_DQ: gl.constexpr = False, DETERMINISTIC: gl.constexpr = True,
    DQ_MODE: gl.constexpr = 0, PER_HEAD: gl.constexpr = False, PDL_TRIGGER: gl.constexpr = False,
    DQ_BUFS: gl.constexpr = 2, DQ_FIRST: gl.constexpr = False, DQ_OWN_FIRST: gl.constexpr = False,
    LSE_EARLY: gl.constexpr = 0, D_OUT: gl.constexpr = 0, SPLIT_D: gl.constexpr = False,
    DQ_ALT: gl.constexpr = False, DQ_LATE: gl.constexpr = False, DQ_MSPLIT: gl.constexpr = False,
):
    """One program per (batch·kv head, K/V block) as _attn_bwd_sm90; k_desc/v_desc blocks are
    the BLOCK_N // 2-key halves (SPLIT_D: the whole BLOCK_N keys, which both consumers share,
    each owning half of dK's and dV's columns: _bwd_ws_split_consumer). WITH_DQ: also dQ, summed into the fp32 buffer behind dq_desc
    by a fourth, 1-warp partition (_bwd_ws_dq_writer; DQ_BUFS, DQ_FIRST, DQ_OWN_FIRST and
    DQ_MODE, DQ_ALT, DQ_LATE, DQ_MSPLIT: see _bwd_ws_consumer and the writer); otherwise dq_desc and SEM are
    unused.
    LSE_EARLY: where the consumers load the LSE/delta rows (_bwd_ws_consumer). PER_HEAD: the launch order of
    _kv_block_coords with a head's K/V blocks together (with WITH_DQ, the writer's ordered adds
    take their turn from the K block's index, start_n // BLOCK_N). PDL_TRIGGER: let the next kernel (the dQ kernel, if
    launched with PDL) be scheduled from the start (_let_dependents_launch)."""
    if PDL_TRIGGER:
        _let_dependents_launch()
    HALF_N: gl.constexpr = BLOCK_N // 2
    off_b, off_hk, start_n, shift, kv_row, kv_col = _kv_block_coords(nheads_k, seqlen_q, seqlen_k, kv_rb, kv_rh,
                                                                     kv_ch, BLOCK_N, PER_HEAD)
    n_m, lo, mask_end, per_head, total = _q_range(start_n, shift, seqlen_q, kv_group, BLOCK_M, BLOCK_N, CAUSAL)

    dtype: gl.constexpr = q_desc.dtype
    KV_PARTS: gl.constexpr = 1 if SPLIT_D else 2
    KV_ROWS: gl.constexpr = BLOCK_N if SPLIT_D else HALF_N                            # keys per K/V piece
    k_smem = gl.allocate_shared_memory(dtype, [KV_PARTS, KV_ROWS, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [KV_PARTS, KV_ROWS, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    pp_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())  # PINGPONG turns
    mbarrier.init(kv_bar, count=1)
    gl.static_assert(LSE_EARLY != 3 or not SPLIT_D, "LSE_EARLY=3 is for the 64-key consumers")
    for i in gl.static_range(STAGES):
        # LSE_EARLY=3: the TMA's expect and the producer's arrival once the LSE/delta rows are staged
        mbarrier.init(q_full.index(i), count=2 if LSE_EARLY == 3 else 1)
        mbarrier.init(q_empty.index(i), count=2)   # one release per consumer
    if LSE_EARLY == 3:  # per ring slot, the Q block's base-2 LSE and its delta, fp32
        row_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        ld_smem = (gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], row_layout),
                   gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], row_layout))
    else:
        ld_smem = (k_smem, k_smem)   # unused
    for i in gl.static_range(2):
        mbarrier.init(pp_bar.index(i), count=1)
    gl.static_assert(not (WITH_DQ and PINGPONG), "WITH_DQ runs without PINGPONG turns")
    gl.static_assert(not (SPLIT_D and (WITH_DQ or PINGPONG or CARRY_DK)),
                     "SPLIT_D runs dK/dV only, without PINGPONG turns or CARRY_DK")
    gl.static_assert(not SPLIT_D or D_OUT == 0 or D_OUT > HEAD_DIM // 2, "SPLIT_D: D_OUT past the first half")
    if SPLIT_D:
        split = _split_exchange(BLOCK_N, BLOCK_M, dtype)   # Pᵀ and dSᵀ of the current Q block
    if WITH_DQ:
        # dSᵀ of both consumers, double-buffered ([2 blocks · 2 key halves, HALF_N, BLOCK_M]); the
        # staged dQ column halves ([DQ_BUFS blocks · 2 halves, BLOCK_M, HEAD_DIM // 2] fp32; DQ_ALT:
        # whole parts, [DQ_BUFS blocks, BLOCK_M, HEAD_DIM]; DQ_MSPLIT: row halves,
        # [DQ_BUFS blocks · 2 halves, BLOCK_M // 2, HEAD_DIM])
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([HALF_N, BLOCK_M], dtype)
        ds_smem = gl.allocate_shared_memory(dtype, [4, HALF_N, BLOCK_M], ds_layout)
        DQ_SLOTS: gl.constexpr = DQ_BUFS * (1 if DQ_ALT else 2)
        DQ_COLS: gl.constexpr = HEAD_DIM // (1 if (DQ_ALT or DQ_MSPLIT) else 2)
        DQ_ROWS: gl.constexpr = BLOCK_M // (2 if DQ_MSPLIT else 1)
        gl.static_assert(dq_desc.block_type.shape[1] == DQ_COLS and dq_desc.block_type.shape[0] == DQ_ROWS,
                         "dq_desc's blocks are half a head wide (DQ_ALT: whole; DQ_MSPLIT: whole, half the rows)")
        gl.static_assert(not (DQ_MSPLIT and (DQ_ALT or DQ_LATE or DQ_OWN_FIRST)),
                         "DQ_MSPLIT splits dQ's rows: not with DQ_ALT, DQ_LATE or DQ_OWN_FIRST")
        gl.static_assert(not DQ_MSPLIT or BLOCK_M % 128 == 0,
                         "DQ_MSPLIT: each consumer's half of the Q block's rows is a 64-row wgmma (BLOCK_M 128)")
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_SLOTS, DQ_ROWS, DQ_COLS], dq_desc.layout)
        ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        dq_full = gl.allocate_shared_memory(gl.int64, [DQ_SLOTS, 1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [DQ_SLOTS, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ds_full.index(i), count=2)   # one arrival per consumer
        for i in gl.static_range(DQ_SLOTS):
            mbarrier.init(dq_full.index(i), count=1)
            mbarrier.init(dq_empty.index(i), count=1)
        writer_bars = (ds_full, dq_full, dq_empty)
    else:
        ds_smem = k_smem   # unused
        dq_smem = k_smem
        writer_bars = (kv_bar, kv_bar, kv_bar)

    # runtime values only: a tuple does not keep constexprs constant
    shared = (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, q_full, q_empty, pp_bar, LSE, DELTA, DK,
              DV, off_b, off_hk, start_n, lo, mask_end, per_head, total, kv_group, shift, qk_scale, sm_scale,
              stride_lb, stride_lh, stride_dkb, stride_dkn, stride_dkh, stride_dvb, stride_dvn, stride_dvh,
              seqlen_q, nheads_k * kv_group, n_m)
    # literal lists: Gluon does not take a (function, args) partition held in a variable
    if SPLIT_D:
        gl.warp_specialize([
            (_bwd_ws_split_consumer, (shared, split, 0, BLOCK_N, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, D_OUT)),
            (_bwd_ws_split_consumer, (shared, split, 1, BLOCK_N, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, D_OUT)),
            (_bwd_ws_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_full,
                                q_empty, kv_row, kv_col, total, per_head, lo, off_b, off_hk, kv_group, q_rb, q_rh,
                                q_ch, KV_ROWS, BLOCK_M, STAGES, KV_PARTS)),
        ], [4, 1], [CONSUMER_REGS, 24])
    elif WITH_DQ:
        gl.warp_specialize([
            (_bwd_ws_consumer, (shared, writer_bars, 0, HALF_N, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, CARRY_DK, PINGPONG,
                                WITH_DQ, DQ_BUFS, DQ_FIRST, DQ_OWN_FIRST, LSE_EARLY, D_OUT, ld_smem, DQ_ALT,
                                DQ_LATE, DQ_MSPLIT)),
            (_bwd_ws_consumer, (shared, writer_bars, 1, HALF_N, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, CARRY_DK, PINGPONG,
                                WITH_DQ, DQ_BUFS, DQ_FIRST, DQ_OWN_FIRST, LSE_EARLY, D_OUT, ld_smem, DQ_ALT,
                                DQ_LATE, DQ_MSPLIT)),
            (_bwd_ws_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_full,
                                q_empty, kv_row, kv_col, total, per_head, lo, off_b, off_hk, kv_group, q_rb, q_rh,
                                q_ch, HALF_N, BLOCK_M, STAGES, 2, ld_smem, LSE, DELTA, stride_lb, stride_lh,
                                LSE_EARLY)),
            (_bwd_ws_dq_writer, (dq_desc, dq_smem, writer_bars[1], writer_bars[2], SEM, off_b, off_hk, kv_group,
                                 lo, per_head, total, seqlen_q, nheads_k * kv_group, n_m, HEAD_DIM, BLOCK_M,
                                 DQ_BUFS, DETERMINISTIC, DQ_MODE, DQ_ALT, DQ_MSPLIT, start_n, BLOCK_N, PER_HEAD)),
        ], [4, 1, 1], [CONSUMER_REGS, 24, 24])
    else:
        gl.warp_specialize([
            (_bwd_ws_consumer, (shared, writer_bars, 0, HALF_N, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, CARRY_DK, PINGPONG,
                                WITH_DQ, DQ_BUFS, DQ_FIRST, DQ_OWN_FIRST, LSE_EARLY, D_OUT, ld_smem)),
            (_bwd_ws_consumer, (shared, writer_bars, 1, HALF_N, HEAD_DIM, BLOCK_M, STAGES, CAUSAL, CARRY_DK, PINGPONG,
                                WITH_DQ, DQ_BUFS, DQ_FIRST, DQ_OWN_FIRST, LSE_EARLY, D_OUT, ld_smem)),
            (_bwd_ws_producer, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, q_full,
                                q_empty, kv_row, kv_col, total, per_head, lo, off_b, off_hk, kv_group, q_rb, q_rh,
                                q_ch, HALF_N, BLOCK_M, STAGES, 2, ld_smem, LSE, DELTA, stride_lb, stride_lh,
                                LSE_EARLY)),
        ], [4, 1], [CONSUMER_REGS, 24])


# ------------------------------------------------------------------------------------------
# dQ kernel (backward_dq(); the default dQ path after the dK/dV kernel). The
# forward's warp-specialized structure with the backward's dQ math: one program per (128-row
# Q block, batch·head), the forward's producer streams Q (and, here, dO) halves once and the
# K/V ring, two consumer warpgroups own 64 rows each. Per K/V block: S = Q·Kᵀ and dP = dO·Vᵀ
# (async), P = exp2(S·scale − lse), dS = P∘(dP − delta), dQ += dS·K, waited within the block
# (no accumulator carried across the loop, so ptxas keeps the wgmmas asynchronous).
# ------------------------------------------------------------------------------------------
@gluon.jit
def _dq_ws_producer(q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, q_bar, do_bar,
                    k_full, v_full, k_empty, v_empty, q_row, q_col, kv_row, kv_col, n_blocks,
                    HALF_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, Q_PARTS: gl.constexpr = 2):
    """The Q_PARTS dO pieces of HALF_M rows (the two halves, or with SPLIT_D the whole block),
    then the forward's producer: the Q pieces and the K/V ring."""
    for c in gl.static_range(Q_PARTS):
        _f90._load_block(do_desc, do_bar.index(c), do_smem.index(c), q_row + c * HALF_M, q_col, True)
    _f90._ws_producer(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, q_bar, k_full, v_full, k_empty,
                      v_empty, (q_row, q_col, kv_row, kv_col, n_blocks), HALF_M, BLOCK_N, STAGES, False, Q_PARTS,
                      False)

@gluon.jit
def _dq_ws_consumer(q_smem, k_smem, v_smem, do_smem, q_bar, do_bar, k_full, v_full, k_empty, v_empty,
                    LSE, DELTA, DQ, row_lse, start_m, n_blocks, n_full, shift, qk_scale, sm_scale,
                    off_b, off_h, stride_dqb, stride_dqm, stride_dqh, o_rows,
                    C: gl.constexpr, HALF_M: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                    STAGES: gl.constexpr, CAUSAL: gl.constexpr, D_OUT: gl.constexpr = 0,
                    FUSE_DELTA: gl.constexpr = False):
    """dQ of rows [start_m + C·HALF_M, +HALF_M) of one (batch, head); D_OUT as in _store_dkdv.
    FUSE_DELTA: delta = rowsum(dO∘O) of these rows is computed here, from O (``o_rows``: its
    pointer and (batch, row, head) strides) and the dO rows already in shared memory, used,
    and stored into DELTA for the dK/dV kernel that runs after this one (the delta kernel's
    launch and its second read of dO are saved: _delta_rows)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_DIM, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    dtype: gl.constexpr = k_smem.dtype
    q_c = q_smem.index(C)                                                             # [HALF_M, HEAD_DIM]
    do_c = do_smem.index(C)                                                           # [HALF_M, HEAD_DIM]
    offs_m = start_m + C * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, s_layout))  # [HALF_M]
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))               # [BLOCK_N]
    if FUSE_DELTA:
        o_c = _load_o_rows(o_rows, off_b, off_h, start_m + C * HALF_M, HALF_M, HEAD_DIM, D_OUT)  # [HALF_M, HEAD_DIM]
        lse = _lse_rows(LSE, row_lse, offs_m)                                         # [HALF_M] base 2
    else:
        lse, delta = _lse_delta(LSE, DELTA, row_lse, offs_m)                          # [HALF_M] each
    s_zero = gl.zeros([HALF_M, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([HALF_M, HEAD_DIM], gl.float32, dq_layout)                          # [HALF_M, HEAD_DIM]
    mbarrier.wait(q_bar.index(C), 0)
    mbarrier.wait(do_bar.index(C), 0)
    if FUSE_DELTA:
        delta = _delta_rows(o_c, do_c, gl.SliceLayout(1, s_layout))                   # [HALF_M]
        gl.store(DELTA + row_lse + offs_m, delta)
    for j in range(n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(k_full.index(stage), phase)
        s_tok = warpgroup_mma(q_c, k_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        mbarrier.wait(v_full.index(stage), phase)
        dp_tok = warpgroup_mma(do_c, v_smem.index(stage).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok,))                     # [HALF_M, BLOCK_N]
        p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))                            # [HALF_M, BLOCK_N]
        if CAUSAL:
            if j >= n_full:  # bottom-right: key j visible to row i iff j <= i + shift
                vis = gl.expand_dims(j * BLOCK_N + offs_n, 0) <= gl.expand_dims(offs_m + shift, 1)
                p = gl.where(vis, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))                   # [HALF_M, BLOCK_N]
        mbarrier.arrive(v_empty.index(stage), count=1)                                # V_j no longer read
        ds = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(dtype), op_layout)  # [HALF_M, BLOCK_N]
        dq = warpgroup_mma(ds, k_smem.index(stage), dq, is_async=True)               # [HALF_M, HEAD_DIM]
        dq, ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds))               # ds: a register operand
        mbarrier.arrive(k_empty.index(stage), count=1)                                # K_j no longer read

    offs_qm = start_m + C * HALF_M + gl.arange(0, HALF_M, layout=gl.SliceLayout(1, dq_layout))
    offs_qd = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    _store_dq(DQ, dq, sm_scale, off_b, off_h, stride_dqb, stride_dqm, stride_dqh, offs_qm, offs_qd, D_OUT)

@gluon.jit
def _dq_ws_split_consumer(q_smem, k_smem, v_smem, do_smem, q_bar, do_bar, k_full, v_full, k_empty, v_empty,
                          LSE, DELTA, DQ, row_lse, start_m, n_blocks, n_full, shift, qk_scale, sm_scale,
                          off_b, off_h, stride_dqb, stride_dqm, stride_dqh, split,
                          C: gl.constexpr, BLOCK_M: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                          STAGES: gl.constexpr, CAUSAL: gl.constexpr, D_OUT: gl.constexpr = 0):
    """SPLIT_D (D = 256): the dQ kernel's counterpart of _bwd_ws_split_consumer. Both consumers
    work on the same BLOCK_M rows, and consumer C owns dQ's columns [C·D/2, +D/2) (64 fp32
    registers per thread). Per K/V block j:

        consumer 0: S = Q·Kⱼᵀ (async), P = exp2(S·scale − lse); P (fp32) to shared memory
        consumer 1: dP = dO·Vⱼᵀ (async); P from shared memory; dS = P∘(dP − delta);
                    dS (input dtype) to shared memory
        both:       dQ[:, C half] += dS·Kⱼ[:, C half]   (consumer 1: dS from registers; 0: shared)

    Each consumer issues half the block's multiply-adds. P, dS and their barriers (p_full,
    ds_full, pds_free) follow _bwd_ws_split_consumer's protocol; each phase flips once per
    block. Consumer 0 never reads V: it releases V's ring slot once per block all the same, so
    that the slot's empty barrier counts both consumers. D_OUT as in _store_dkdv: only dQ's
    columns below it are stored."""
    p_smem, ds_smem, p_full, ds_full, pds_free = split
    HALF_D: gl.constexpr = HEAD_DIM // 2                                              # this consumer's columns
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HALF_D, 16])
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    dtype: gl.constexpr = k_smem.dtype
    q_all = q_smem.index(0)                                                           # [BLOCK_M, HEAD_DIM]
    do_all = do_smem.index(0)                                                         # [BLOCK_M, HEAD_DIM]
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, s_layout))     # [BLOCK_M]
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))               # [BLOCK_N]
    lse, delta = _lse_delta(LSE, DELTA, row_lse, offs_m)                              # [BLOCK_M] each
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    dq = gl.zeros([BLOCK_M, HALF_D], gl.float32, dq_layout)                           # [BLOCK_M, HALF_D]
    if C == 0:
        mbarrier.wait(q_bar.index(0), 0)
    else:
        mbarrier.wait(do_bar.index(0), 0)
    for j in range(n_blocks):
        stage = j % STAGES
        phase = (j // STAGES) & 1
        k_s = k_smem.index(stage)                                                     # [BLOCK_N, HEAD_DIM]
        if C == 0:
            mbarrier.wait(k_full.index(stage), phase)
            s_tok = warpgroup_mma(q_all, k_s.permute((1, 0)), s_zero, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok,))                 # [BLOCK_M, BLOCK_N]
            p = gl.exp2(s * qk_scale - gl.expand_dims(lse, 1))                        # [BLOCK_M, BLOCK_N]
            if CAUSAL:
                if j >= n_full:  # bottom-right: key j visible to row i iff j <= i + shift
                    vis = gl.expand_dims(j * BLOCK_N + offs_n, 0) <= gl.expand_dims(offs_m + shift, 1)
                    p = gl.where(vis, p, 0.0)
            mbarrier.wait(pds_free, (j & 1) ^ 1, pred=j >= 1)   # block j - 1's P and dS are read
            _exchange_put(p_smem, p, p_full)
            mbarrier.arrive(v_empty.index(stage), count=1)                            # (V is not read here)
            mbarrier.wait(ds_full, j & 1)
            dq = warpgroup_mma(ds_smem, k_s.slice(0, HALF_D, dim=1), dq, is_async=True)  # [BLOCK_M, HALF_D]
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            mbarrier.arrive(pds_free, count=1)                                        # dS is read
        else:
            mbarrier.wait(v_full.index(stage), phase)
            dp_tok = warpgroup_mma(do_all, v_smem.index(stage).permute((1, 0)), s_zero, use_acc=False,
                                   is_async=True)
            dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp_tok,))               # [BLOCK_M, BLOCK_N]
            mbarrier.arrive(v_empty.index(stage), count=1)                            # V_j no longer read
            p = _exchange_take(p_smem, p_full, j & 1, pds_free, s_layout)            # [BLOCK_M, BLOCK_N]
            ds = (p * (dp - gl.expand_dims(delta, 1))).to(dtype)                      # [BLOCK_M, BLOCK_N]
            _exchange_put(ds_smem, ds, ds_full)
            mbarrier.wait(k_full.index(stage), phase)
            b_ds = gl.convert_layout(ds, op_layout)                                   # [BLOCK_M, BLOCK_N]
            dq = warpgroup_mma(b_ds, k_s.slice(HALF_D, HALF_D, dim=1), dq, is_async=True)  # [BLOCK_M, HALF_D]
            dq, b_ds = warpgroup_mma_wait(num_outstanding=0, deps=(dq, b_ds))        # b_ds: a register operand
        mbarrier.arrive(k_empty.index(stage), count=1)                                # K_j no longer read

    offs_qm = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    offs_qd = C * HALF_D + gl.arange(0, HALF_D, layout=gl.SliceLayout(0, dq_layout))
    _store_dq(DQ, dq, sm_scale, off_b, off_h, stride_dqb, stride_dqm, stride_dqh, offs_qm, offs_qd, D_OUT)

@gluon.jit
def _attn_bwd_dq_sm90_ws(
    q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DQ, O,
    q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,
    stride_lb, stride_lh, stride_dqb, stride_dqm, stride_dqh, stride_ob, stride_om, stride_oh,
    nheads, kv_group, seqlen_q, seqlen_k, qk_scale, sm_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
    CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, num_warps: gl.constexpr, D_OUT: gl.constexpr = 0,
    SPLIT_D: gl.constexpr = False, FUSE_DELTA: gl.constexpr = False,
):
    """dQ only; one program per (BLOCK_M-row Q block, batch·head); q_desc/do_desc blocks are
    the BLOCK_M // 2-row halves (SPLIT_D: the whole block, which both consumers share, each
    owning half of dQ's columns: _dq_ws_split_consumer). FUSE_DELTA (not with SPLIT_D): the
    kernel computes delta = rowsum(dO∘O) from O (and its strides) into DELTA instead of
    reading it (_dq_ws_consumer); otherwise O is not read."""
    gl.static_assert(not (SPLIT_D and FUSE_DELTA), "FUSE_DELTA needs whole rows per consumer (not SPLIT_D)")
    Q_PARTS: gl.constexpr = 1 if SPLIT_D else 2
    HALF_M: gl.constexpr = BLOCK_M // Q_PARTS                                         # rows per Q/dO piece
    off_b, off_h, start_m, q_row, q_col, kv_row, kv_col, shift = _f90._q_block_coords(
        nheads, kv_group, seqlen_q, seqlen_k, q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, BLOCK_M, CAUSAL)
    row_lse = off_b * stride_lb + off_h * stride_lh
    # both halves run the block's key range (the ring counts two releases per slot)
    n_full, n_blocks = _f90._key_blocks(start_m, shift, seqlen_k, BLOCK_M, BLOCK_N, CAUSAL)

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [Q_PARTS, HALF_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [Q_PARTS, HALF_M, HEAD_DIM], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [Q_PARTS, 1], mbarrier.MBarrierLayout())
    do_bar = gl.allocate_shared_memory(gl.int64, [Q_PARTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(Q_PARTS):
        mbarrier.init(q_bar.index(i), count=1)
        mbarrier.init(do_bar.index(i), count=1)
    k_full, v_full, k_empty, v_empty = _f90._kv_ring_bars(STAGES)   # both consumers release each slot

    if SPLIT_D:
        split = _split_exchange(BLOCK_M, BLOCK_N, dtype)   # P and dS of the current K/V block
        gl.warp_specialize([
            (_dq_ws_split_consumer, (q_smem, k_smem, v_smem, do_smem, q_bar, do_bar, k_full, v_full, k_empty,
                                     v_empty, LSE, DELTA, DQ, row_lse, start_m, n_blocks, n_full, shift, qk_scale,
                                     sm_scale, off_b, off_h, stride_dqb, stride_dqm, stride_dqh, split,
                                     0, BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, D_OUT)),
            (_dq_ws_split_consumer, (q_smem, k_smem, v_smem, do_smem, q_bar, do_bar, k_full, v_full, k_empty,
                                     v_empty, LSE, DELTA, DQ, row_lse, start_m, n_blocks, n_full, shift, qk_scale,
                                     sm_scale, off_b, off_h, stride_dqb, stride_dqm, stride_dqh, split,
                                     1, BLOCK_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, D_OUT)),
            (_dq_ws_producer, (q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, q_bar, do_bar,
                               k_full, v_full, k_empty, v_empty, q_row, q_col, kv_row, kv_col, n_blocks,
                               HALF_M, BLOCK_N, STAGES, Q_PARTS)),
        ], [4, 1], [CONSUMER_REGS, 24])
        return
    o_rows = (O, stride_ob, stride_om, stride_oh)
    gl.warp_specialize([
        (_dq_ws_consumer, (q_smem, k_smem, v_smem, do_smem, q_bar, do_bar, k_full, v_full, k_empty, v_empty,
                           LSE, DELTA, DQ, row_lse, start_m, n_blocks, n_full, shift, qk_scale, sm_scale,
                           off_b, off_h, stride_dqb, stride_dqm, stride_dqh, o_rows,
                           0, HALF_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, D_OUT, FUSE_DELTA)),
        (_dq_ws_consumer, (q_smem, k_smem, v_smem, do_smem, q_bar, do_bar, k_full, v_full, k_empty, v_empty,
                           LSE, DELTA, DQ, row_lse, start_m, n_blocks, n_full, shift, qk_scale, sm_scale,
                           off_b, off_h, stride_dqb, stride_dqm, stride_dqh, o_rows,
                           1, HALF_M, HEAD_DIM, BLOCK_N, STAGES, CAUSAL, D_OUT, FUSE_DELTA)),
        (_dq_ws_producer, (q_desc, k_desc, v_desc, do_desc, q_smem, k_smem, v_smem, do_smem, q_bar, do_bar,
                           k_full, v_full, k_empty, v_empty, q_row, q_col, kv_row, kv_col, n_blocks,
                           HALF_M, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, 24])


def config_for(head_dim: int, causal: bool, seqlen_q: int) -> dict:
    """Tiles and mode of the Gluon dK/dV kernel. Measured on the H200 (fp16, the kernel alone;
    TFLOP/s-equivalent = whole-backward flops over this kernel's time; N = 4k / 16k unless stated;
    docs/perf-notes.md, "Hopper backward (Gluon)"):

    * ``WITH_DQ=False`` (the default): dK and dV only; a dQ kernel runs separately (the Gluon one of
      :func:`backward_dq`, or the Triton dQ kernel). The first (8-warp) Gluon dK/dV kernel took
      2092 / 7924 µs at D=128 against 2518 / 10163 for the Triton dK/dV kernel (non-causal),
      1210 / 4119 against 1651 / 5650 (causal). The fused mode (``WITH_DQ=True``, dQ summed in fp32
      by ordered atomic adds) took 5570 / 21353 µs: its dQ matmul, with dS staged through shared
      memory, doubled the kernel time (4119 -> 8275 µs even with the adds replaced by stores).
    * 128 keys per program (two warpgroups of 64 rows), 64-row Q blocks, a 2-slot Q/dO ring (a
      3-slot ring: 231 / 247 against 236 / 255 TFLOP/s, fused mode); dQ added with 2-wide vector
      reductions in the fused mode (one add per element: the same speed).
    * D = 64: 128-row Q blocks: 435 / 480 / 532 non-causal and 317 / 440 / 519 causal
      (N = 1k / 4k / 16k), against 377 / 431 / 460 and 272 / 372 / 426 with 64-row blocks. At
      D = 128, 128-row blocks would need 256 registers of accumulators per thread (dK, dV, Sᵀ, dPᵀ).
    * ``WS=True``: the warp-specialized kernel (``_attn_bwd_sm90_ws``: a producer warp, two 64-key
      consumer warpgroups that release ring slots through mbarriers) instead of the 8-warp kernel
      whose two warpgroups meet at a CTA barrier per Q block. Same arithmetic per element, so the
      same bits. D = 64 non-causal 515 / 565 against 495 / 548, causal 460 / 538 against
      444 / 527; D = 128 non-causal 621 / 644 against 613 / 637, causal 577 / 622 against 546 / 634.
    * ``CARRY_DK``: at D = 128 dK is waited for at the end of each block (False). Carrying it in
      flight into the next block makes ptxas serialize every wgmma (advisory C7515; in the SASS a
      wait follows each of the 48 HGMMAs, against 4 without the carry): non-causal 673 / 709
      without the carry against 629 / 670 with it, causal 634 / 692 against 576 / 654. At D = 64
      the carry stays (True): without it ptxas spills 56-216 bytes and the kernel measured 2-5%
      slower (490 / 547 against 516 / 558 non-causal).
    * D = 64 causal: 64-row Q blocks without the carry (no spills, 4 full waits for 32 HGMMAs):
      481 / 562 against 404 / 485 with the carry at 64 rows and 460 / 528 for 128 rows with the
      carry; non-causal it measured 473 / 514, below the 128-row kernel, which stays the
      non-causal default.
    * D = 128: a 3-slot Q/dO ring (N = 1k / 4k / 16k): non-causal 532 / 590 / 712 against
      530 / 573 / 695 with 2 slots, causal 413 / 568 / 701 against 423 / 565 / 681. Causal keeps
      2 slots: the gains were within noise there (−2% to +3%), and the third slot raises the causal
      kernel's spills from 72 to 100 bytes (ptxas, triton 3.6; non-causal: none with either). At
      D = 64 a third slot was mixed (non-causal 429 / 491 / 569 against 440 / 511 / 554; causal
      331 / 407 / 555 against 333 / 471 / 549): 2 slots stay.
    * ``PINGPONG`` (WS only, off): the consumers take turns at issuing their matmuls, as the
      forward's ping-pong. Same bits; at D = 128 non-causal −1% to +3%, causal 0 to −16% against
      no turns, so it is not used.
    * ``PER_HEAD``: the grid launches a head's K/V blocks together (block 0 first), so that they
      share its Q and dO in L2, instead of block n of every head before block n + 1. Means of two
      alternated rounds: 1.3–16% faster in all 20 cells of the grid (D = 64 causal 4k 1.32 against
      1.53 ms; D = 128 non-causal 1k 0.593 against 0.640 ms), the same bits. The fused mode
      takes it for unordered sums only (:func:`fused_config_for`); the 8-warp kernel
      (``WS=False``) has only the old one and ignores the flag.
    * ``PDL_TRIGGER`` (off; with ``PDL`` in the dQ kernel's config, an opt-in overlap): the kernel
      lets the next one launch from its start, so that a dQ kernel launched with programmatic
      dependent launch takes the SMs the dK/dV kernel's last programs free. Both kernels, means of
      two alternated rounds: causal 0.99–1.08× the serial pair's time, non-causal 0.96–1.02× (all
      six cells at N ≥ 4k slower), but single rounds moved by up to 14%, and the best rounds of
      each arm differ by +1.7% (causal) and +0.15% (non-causal): within the spread. The dQ kernel
      runs no ``griddepcontrol.wait``, so that a kernel after it waits for the dK/dV kernel too is
      assumed, not established. Not the default.
    * ``LSE_EARLY`` (where the consumers load a Q block's LSE and delta rows; the same bits),
      N = 1k / 4k / 16k, against 0 (the load after the block's Sᵀ/dPᵀ issue): one block ahead (2)
      D = 128 causal 497 / 688 / 808 against 470 / 653 / 755, D = 64 causal 400 / 581 / 657
      against 369 / 544 / 623, D = 128 non-causal 658 / 758 / 714 against 595 / 713 / 749; before
      the Q/dO wait (1) D = 128 non-causal 601 / 739 / 757. At D = 64 non-causal (dK carried) both
      lost 10–50% (with 2, ptxas spills and serializes the wgmmas, C7512), so it kept 0.
      Staged by the producer warp through shared memory (3; taken everywhere but ``SPLIT_D``): the
      kernel alone against the previous rule (2 / 1 / 0 above) in one process, H200, 2026-12-05,
      9c63a38, ``tools/fused_ab.py --dkdv-cfg '{"LSE_EARLY": 3}'``: the same bits (max difference
      0), TFLOP/s-equivalent at D = 128 fp16 non-causal N = 4k / 16k 743 / 781 against 745 / 751,
      causal 708 / 826 against 690 / 792; D = 64 fp16 non-causal 602 / 631 against 583 / 618,
      causal 567 / 639 against 560 / 601; over 16 more D = 128 cells (fp16 and bf16, 1k-16k) a median
      +1.8% with single cells moving -16% to +12% (both signs at the same shape in the two
      dtypes, the run's spread). (``seqlen_q`` chose the old rule's mode and no longer changes the
      config; callers still pass it.)"""
    if head_dim > 128:
        # D = 256 (SPLIT_D): both consumers on the same 64 keys, each with half of dK's and dV's
        # columns; 64-row Q blocks and a 2-slot ring fill 222 KB of shared memory. H200
        # (fp16, kernel alone, N = 4k / 16k): 2114 / 8161 µs non-causal and
        # 1190 / 4111 causal, against 3785 / 15320 and 2763 / 10168 for the Triton dK/dV kernel on
        # descriptors. Not swept (the tiles are the only ones that fit).
        return dict(BLOCK_M=64, BLOCK_N=64, STAGES=2, num_warps=8, VEC=2, WITH_DQ=False, WS=True, CARRY_DK=False,
                    PER_HEAD=True, PDL_TRIGGER=False, LSE_EARLY=0, SPLIT_D=True)
    wide = head_dim <= 64 and not causal  # 128-row Q blocks with dK carried: D = 64 non-causal only
    stages = 3 if head_dim > 64 and not causal else 2
    return dict(BLOCK_M=128 if wide else 64, BLOCK_N=128, STAGES=stages, num_warps=8, VEC=2, WITH_DQ=False, WS=True,
                CARRY_DK=wide, PER_HEAD=True, PDL_TRIGGER=False, LSE_EARLY=3)


def fused_config_for(head_dim: int, causal: bool, deterministic: bool = True) -> dict:
    """Tiles of the fused warp-specialized backward (``WS=True, WITH_DQ=True``): dK, dV and dQ in one
    kernel, dQ summed over K blocks by TMA reductions into an fp32 buffer (ordered by default, so
    bitwise deterministic). The dK/dV tiles of :func:`config_for` with dK waited within each block
    and a 2-slot Q/dO ring; ``DQ_BUFS`` blocks of staged dQ halves for the writer warp (shared
    memory: 225 KB at D = 128). ``DQ_FIRST`` (D = 128): dQ's matmul issued before dK's, so dK runs
    on while dQ is staged (H200, fp16, ordered, TFLOP/s-equivalent: 459 against 436
    at D = 128 non-causal 16k, level at 4k; causal 382 against 390 at 16k and level at 4k, but 439
    against 416 unordered; at D = 64 it was slower). ``deterministic=False`` (unordered adds, what
    ``route`` runs for ``deterministic=False``): the LSE and delta rows staged in shared memory by
    the producer warp (``LSE_EARLY=3``). Against the previous one-block-ahead loads (2), same
    process, H200, 2026-12-05, 9c63a38, TFLOP/s-equivalent, unordered: D = 128 fp16 non-causal
    N = 4k / 8k / 16k 460 / 488 / 517-522 against 435 / 477 / 449-502, causal 419 / 467 / 504-505
    against 371 / 427 / 467-472 (bf16 alike); D = 64 fp16 non-causal 4k / 16k 336 / 412 against
    154 / 164 (the one-block-ahead loads spill there), causal 314 / 395 against 283 / 355. With one dQ staging slot
    (``DQ_BUFS=1``, no spills at D = 128) or a 3-slot ring it was level or slower (causal 16k
    453-460 against 504-518). Ordered sums (``deterministic=True``) keep the loads after the
    Q/dO wait (0). Unordered at D = 64 non-causal: 64-row Q blocks (no spills, 133 KB of shared
    memory, against 32 bytes of spills and 232 KB with 128 rows): H100, same process, 2026-12-05,
    b9ff7f0, TFLOP/s-equivalent, fp16 / bf16, N = 8k 371 / 385 against 259 / 259 with 128 rows (the
    split pair: 377 / 395), N = 16k 406 / 426 against 334 / 348 (split 393 / 401); a 3-slot Q/dO
    ring on top was level at 16k (416 / 427) and mixed at 8k (320 / 411). Through the public API
    the gain is smaller (docs/perf-notes.md, "64-row Q blocks"): that A/B timed its arms in one
    fixed order, which was later found to bias an arm by up to ~10%. Unordered, a head's K blocks
    are launched together (``PER_HEAD``, FA4's order), so that they share its Q, dO and fp32 dQ in
    L2: H200, fp16, B·N = 16k, 2026-12-06, 3 rotated rounds in one process, TFLOP/s-equivalent
    against the 2-D grid (heads fastest), N = 2k / 4k / 16k: D = 64 non-causal 380 / 408 / 435
    against 318 / 337 / 411, causal 307 / 363 / 421 against 268 / 317 / 407; D = 128 non-causal
    460 / 498 / 534 against 325 / 465 / 534, causal 375 / 431 / 520 against 281 / 422 / 516. The
    ordered sums (not routed by default) keep the 2-D grid: per head they measured 151-498, not
    compared with their 2-D grid in that run."""
    cfg = dict(config_for(head_dim, causal, 4096), STAGES=2, CARRY_DK=False, WITH_DQ=True, DQ_BUFS=2,
               LSE_EARLY=0 if deterministic else 3, DQ_FIRST=head_dim > 64, PER_HEAD=not deterministic,
               PDL_TRIGGER=False, SPLIT_D=False)  # ordered adds: the 2-D grid; no column split with dQ
    if not deterministic and head_dim == 64 and not causal:
        cfg["BLOCK_M"] = 64  # (causal D = 64 has 64-row Q blocks already)
    return cfg


_BROKEN: set = set()


def _head_offsets_fit(t) -> bool:
    """Whether the kernel's int32 head offset (kv head · head stride) of a dK/dV buffer fits."""
    return t is None or (t.shape[2] - 1) * abs(t.stride(2)) < 2 ** 31


def supported(dout, q, k, v, out, lse, softmax_scale, causal, causal_shift, flags, varlen, config,
              dk=None, dv=None) -> bool:
    """Whether this backward call can take the Gluon kernel (module docstring: scope). dk/dv: the
    gradient buffers the kernel will write, if already allocated. What follows from the tensors'
    layout (shapes, strides, dtypes, device) is decided once per layout and cached; the scale, the
    flags, the causal alignment, the pointers' alignment and the compile failures are checked on
    every call."""
    if config is not None or varlen or not softmax_scale > 0:
        return False  # (NaN scales fail too)
    if flags["HAS_LEFT"] or flags["HAS_SOFTCAP"] or flags["HAS_ALIBI"] or flags["HAS_DROPOUT"]:
        return False
    if flags["HAS_RIGHT"] and not causal:
        return False
    if causal and causal_shift != k.shape[1] - q.shape[1]:
        return False
    if _f90.padded_head_dim(q.shape[-1]) == q.shape[-1] and (q.data_ptr() % 16 or k.data_ptr() % 16 or v.data_ptr() % 16
                                     or dout.data_ptr() % 16):
        return False  # (a padded head dim runs on fresh copies: padded_head_dim)
    key = (_layout(dout, q, k, v, out, lse, dk, dv), bool(causal))
    try:
        cfg_key = _LAYOUTS[key]
    except KeyError:
        cfg_key = _layout_cfg_key(dout, q, k, v, out, lse, causal, dk, dv)
        if len(_LAYOUTS) >= _CACHE_MAX:
            _LAYOUTS.clear()
        _LAYOUTS[key] = cfg_key
    return cfg_key is not None and cfg_key not in _BROKEN


def _layout(*tensors):
    """The layout key of tensors (None entries allowed): shapes, strides, dtypes, and the device."""
    return tuple(None if t is None else (t.shape, t.stride(), t.dtype) for t in tensors) + (tensors[1].device,)


# layout key -> the config's _BROKEN key if the Gluon backward can take that layout, else None
_LAYOUTS: dict = {}
# layout key -> Launch of the dK/dV or dQ kernel
_LAUNCHES: dict = {}
_CACHE_MAX = 1024  # a cache is emptied when full (a workload with ever-new shapes re-plans)


def _layout_cfg_key(dout, q, k, v, out, lse, causal, dk, dv):
    """The layout half of :func:`supported`: config_for's _BROKEN key if the kernel can take
    tensors of this layout, else None."""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return None
    if not (_head_offsets_fit(dk) and _head_offsets_fit(dv)):
        return None  # e.g. head-major buffers of > 2^31 elements
    dt = q.dtype
    if dt not in (torch.float16, torch.bfloat16) or any(t.dtype != dt for t in (k, v, out, dout)):
        return None
    d = q.shape[-1]
    dp = _f90.padded_head_dim(d)
    if dp is None:
        return None
    if k.shape[-1] != d or v.shape != k.shape or q.shape[2] % k.shape[2] or out.shape != q.shape \
            or dout.shape != q.shape:
        return None
    sq, sk = q.shape[1], k.shape[1]
    if causal and sq > sk:
        return None
    cfg = config_for(dp, causal, sq)
    if sq % 128 or sk % cfg["BLOCK_N"] or lse.dtype != torch.float32 or lse.stride(-1) != 1:
        return None
    if dp != d:  # the kernels run on contiguous padded copies, whose strides and views always fit
        return _f90._key(dp, causal, dt, cfg)
    for t in (q, k, v, dout):
        if any((s * t.element_size()) % 16 for s in t.stride()[:-1]):
            return None
    views = [_f90._view_params(t, t.shape[1], t.shape[2]) for t in (q, dout, k, v)]
    if any(vw is None for vw in views):
        return None
    if views[0][2:] != views[1][2:] or views[2][2:] != views[3][2:]:
        return None
    return _f90._key(d, causal, dt, cfg)


def backward(dout, q, k, v, lse, delta, dq, dk, dv, softmax_scale: float, causal: bool, cfg: dict | None = None,
             deterministic: bool = True, bufs=None):
    """Launch the Gluon kernel; the caller checked :func:`supported` and computed delta
    ((B, H, Sq) fp32, like lse). Writes dk and dv, and dq too when ``cfg["WITH_DQ"]`` (the fused
    mode; the default config leaves dq to a dQ kernel, :func:`backward_dq` or the Triton one).
    ``bufs``: the fused mode's zeroed fp32 dQ sums and counters (:func:`fused_buffers`, zeroed by
    the caller's delta kernel), else made and zeroed here.
    Returns (dq or None, dk, dv), or None after a warning if the kernel does not compile with the
    installed triton (the caller then runs the Triton backward)."""
    d = q.shape[-1]
    cfg = cfg or config_for(d, causal, q.shape[1])
    key = _f90._key(d, causal, q.dtype, cfg)
    if key in _BROKEN:
        return None  # failed to compile before (e.g. the fused mode, which supported() does not check)
    ran = launch_or_fall_back(
        _BROKEN, key, "the Hopper Gluon backward",
        "using the Triton backward for this configuration. Options(backend='triton') turns the Gluon kernels off.",
        lambda: _launch(dout, q, k, v, lse, delta, dq, dk, dv, softmax_scale, causal, cfg, deterministic, bufs))
    return ((dq if cfg.get("WITH_DQ", False) else None), dk, dv) if ran else None


def _cached_launch(kind, build, tensors, modes: tuple, cfg):
    """The :class:`Launch` that ``build()`` makes for this layout, kernel kind and config,
    made once per key: the tensors' shapes, strides, dtypes and device, the ``modes`` (causal,
    ...) and the config."""
    key = (kind, _layout(*tensors), modes, tuple(sorted(cfg.items())))
    try:
        return _LAUNCHES[key]
    except KeyError:
        launch = build()
        if len(_LAUNCHES) >= _CACHE_MAX:
            _LAUNCHES.clear()
        _LAUNCHES[key] = launch
        return launch


def _d_out(grad, d: int) -> int:
    """The kernels' ``D_OUT``: 0 when the gradient buffer has the kernel's head dim d, else its own
    (a padded call, :func:`padded_head_dim`: only its first columns are stored)."""
    return 0 if grad.shape[-1] == d else grad.shape[-1]


def _run_dkdv(launch, dout, q, k, v, lse, delta, dk, dv, softmax_scale):
    """One launch of the cached dK/dV kernel (:func:`_ws_launch`'s argument layout)."""
    launch((q, k, v, dout), (lse, delta, dk, dv, None, None), (softmax_scale * LOG2E, softmax_scale),
           addresses(lse, delta, dk, dv, None, None))


def config_broken(q, causal: bool, cfg: dict) -> bool:
    """Whether this config failed to compile before for q's head dim and dtype (:func:`backward`
    then returns None at once): the route asks first, to skip making the fused mode's buffers."""
    return _f90._key(q.shape[-1], causal, q.dtype, cfg) in _BROKEN


def fused_buffers(q, bm: int, zeroed: bool = True):
    """The fused mode's fp32 dQ accumulator, (B, Sq, H, D) in q's order, and its int32 counters
    (one per (b, h, Q block), ordering the sums), in one allocation: (dq_acc, sem, words), ``words``
    the whole buffer as flat int32. Both must start at zero: ``zeroed`` makes them so with a memset;
    without it the caller hands ``words`` to the delta kernel, which zeroes them in the same launch
    (``triton.backward.compute_delta``'s ``zero``, as :func:`replay_default` and the route do)."""
    batch, seqlen_q, nheads, d = q.shape
    n_acc = batch * seqlen_q * nheads * d
    buf = (torch.zeros if zeroed else torch.empty)(n_acc + batch * nheads * (seqlen_q // bm), dtype=torch.int32,
                                                    device=q.device)
    # (the counters start n_acc · 4 bytes in: 16-byte aligned, as d is a multiple of 64)
    return buf[:n_acc].view(torch.float32).view(batch, seqlen_q, nheads, d), buf[n_acc:], buf


def _run_fused(launch, dout, q, k, v, lse, delta, dq, dk, dv, softmax_scale, bufs):
    """One launch of the cached fused kernel (:func:`_ws_launch` with ``dq_acc``) on the zeroed
    buffers of :func:`fused_buffers`, then dq = scale · dQ's fp32 sums (its first dq.shape[-1]
    columns), cast to dq's dtype in one pass by our own kernel (``triton.backward.scale_cast``: FA4's
    "postprocess"; the bits of ``torch.mul(..., out=dq)``, which the debug switch ``scale_cast=0``
    runs instead; docs/benchmarks.md, "H100 backward grid at 0dbc0b7")."""
    dq_acc, sem = bufs[0], bufs[1]
    launch((q, k, v, dout, dq_acc), (lse, delta, dk, dv, sem), (softmax_scale * LOG2E, softmax_scale),
           addresses(lse, delta, dk, dv, sem))
    acc = dq_acc if dq.shape[-1] == dq_acc.shape[-1] else dq_acc[..., :dq.shape[-1]]
    if DEBUG.scale_cast:
        _scale_cast(acc, dq, softmax_scale)
    else:
        torch.mul(acc, softmax_scale, out=dq)


def _run_dq(launch, dout, q, k, v, lse, delta, dq, o, softmax_scale):
    """One launch of the cached dQ kernel (:func:`_dq_launch`'s argument layout; ``o`` is the
    forward's output when the kernel computes delta, else dq in its place)."""
    launch((q, k, v, dout), (lse, delta, dq, o), (softmax_scale * LOG2E, softmax_scale), addresses(lse, delta, dq, o))


def _ws_launch(dout, q, k, v, lse, dk, dv, causal, cfg, deterministic, dq_acc=None):
    """The warp-specialized kernel's launch (``WS=True``) for this layout: descriptors Q, K, V, dO;
    pointers LSE, DELTA, DK, DV; then dq_desc and SEM; then the integer arguments and the two
    scales. Without ``dq_acc``, the dK/dV kernel (``WITH_DQ=False``: dq_desc and SEM unused, passed
    as None pointers). With it (the fused mode's fp32 accumulator, :func:`fused_buffers`), dQ
    too: dq_desc is a fifth descriptor, over dq_acc's (B·Sq, H·D) view in [BLOCK_M, D / 2] tiles
    (one column half per consumer; ``DQ_ALT``: whole rows; ``DQ_MSPLIT``: half the rows), summed
    into by TMA reductions, and SEM the counters that order the sums."""
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    q_desc, (q_rb, q_rh, q_ch) = _f90._desc(q, seqlen_q, nheads, bm)
    do_desc, _ = _f90._desc(dout, seqlen_q, nheads, bm)
    # the WS kernel loads K/V as the two 64-key halves of BLOCK_N (SPLIT_D: as one block)
    split = cfg.get("SPLIT_D", False)
    k_desc, (kv_rb, kv_rh, kv_ch) = _f90._desc(k, seqlen_k, nheads_k, bn if split else bn // 2)
    v_desc, _ = _f90._desc(v, seqlen_k, nheads_k, bn if split else bn // 2)
    ints = (q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, lse.stride(0), lse.stride(1),
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
            nheads_k, nheads // nheads_k, seqlen_q, seqlen_k)
    with_dq = dq_acc is not None
    constexprs = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
                      CONSUMER_REGS=cfg.get("CONSUMER_REGS", 240), num_warps=4, CARRY_DK=cfg.get("CARRY_DK", True),
                      PINGPONG=cfg.get("PINGPONG", False), WITH_DQ=with_dq, DETERMINISTIC=deterministic,
                      DQ_MODE=cfg.get("DQ_MODE", 0), PER_HEAD=cfg.get("PER_HEAD", False),
                      PDL_TRIGGER=cfg.get("PDL_TRIGGER", False), LSE_EARLY=cfg.get("LSE_EARLY", 0),
                      D_OUT=_d_out(dk, d), SPLIT_D=split)
    grid = (batch * nheads_k * (seqlen_k // bn),) if cfg.get("PER_HEAD", False) else (batch * nheads_k, seqlen_k // bn)
    if not with_dq:
        return Launch(_attn_bwd_sm90_ws, grid, (q_desc, k_desc, v_desc, do_desc), 6, ints, 2, constexprs)
    dq_view = dq_acc.view(batch * seqlen_q, nheads * d)
    msplit = cfg.get("DQ_MSPLIT", False)
    dq_m, dq_d = (bm // 2, d) if msplit else (bm, d if cfg.get("DQ_ALT", False) else d // 2)
    dq_desc = _f90.TensorDescriptor(dq_view, list(dq_view.shape), [nheads * d, 1], [dq_m, dq_d],
                                    gl.NVMMASharedLayout.get_default_for([dq_m, dq_d], gl.float32))
    constexprs.update(DQ_BUFS=cfg.get("DQ_BUFS", 2), DQ_FIRST=cfg.get("DQ_FIRST", False),
                      DQ_OWN_FIRST=cfg.get("DQ_OWN_FIRST", False), DQ_ALT=cfg.get("DQ_ALT", False),
                      DQ_LATE=cfg.get("DQ_LATE", False), DQ_MSPLIT=msplit)
    # (dq_desc is the kernel's ninth parameter: after the four descriptors and four pointers)
    return Launch(_attn_bwd_sm90_ws, grid, (q_desc, k_desc, v_desc, do_desc, dq_desc), 5, ints, 2, constexprs,
                  slots=(0, 1, 2, 3, 8))


def _fused_launch(dout, q, k, v, lse, delta, dk, dv, causal, cfg, deterministic, dq_acc=None):
    """The fused kernel's :class:`Launch` for this layout, config and ``deterministic``, made once
    (:func:`_cached_launch`); ``dq_acc``: an fp32 accumulator for its dQ descriptor's template, if
    at hand (a miss without one allocates one: only its layout matters)."""
    acc = (lambda: dq_acc) if dq_acc is not None else (lambda: torch.empty(q.shape, dtype=torch.float32,
                                                                            device=q.device))
    return _cached_launch("fused", lambda: _ws_launch(dout, q, k, v, lse, dk, dv, causal, cfg, deterministic,
                                                      dq_acc=acc()),
                          (dout, q, k, v, lse, dk, dv, delta), (bool(causal), bool(deterministic)), cfg)


def _launch(dout, q, k, v, lse, delta, dq, dk, dv, softmax_scale, causal, cfg, deterministic, bufs=None):
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    with_dq, ws = cfg.get("WITH_DQ", False), cfg.get("WS", False)
    modes = (bool(causal), bool(deterministic))
    if ws and not with_dq:  # the default: a launch cached per layout (host time; docs/perf-notes.md, "Host path")
        launch = _cached_launch("dkdv", lambda: _ws_launch(dout, q, k, v, lse, dk, dv, causal, cfg, deterministic),
                                (dout, q, k, v, lse, dk, dv, delta), modes, cfg)
        _run_dkdv(launch, dout, q, k, v, lse, delta, dk, dv, softmax_scale)
        return
    if with_dq and ws and cfg.get("PINGPONG", False):
        raise ValueError("the warp-specialized Gluon backward's fused mode (WITH_DQ) runs without PINGPONG")
    if with_dq and ws:
        # the fused mode: a launch cached per layout too, on fresh zeroed fp32 sums and counters (the
        # caller's, zeroed by its delta kernel, or made here)
        if bufs is None:
            bufs = fused_buffers(q, bm)
        elif bufs[0].shape != q.shape or bufs[1].numel() != batch * nheads * (seqlen_q // bm):
            raise ValueError(f"gluon.backward: the fused mode's buffers must be fused_buffers(q, {bm}) for q of "
                             f"shape {tuple(q.shape)}; got dQ sums {tuple(bufs[0].shape)} and "
                             f"{bufs[1].numel()} counters")
        launch = _fused_launch(dout, q, k, v, lse, delta, dk, dv, causal, cfg, deterministic, bufs[0])
        _run_fused(launch, dout, q, k, v, lse, delta, dq, dk, dv, softmax_scale, bufs)
        return
    # the 8-warp kernel (``WS=False``; not routed by default): launched through triton's JIT
    q_desc, (q_rb, q_rh, q_ch) = _f90._desc(q, seqlen_q, nheads, bm)
    do_desc, _ = _f90._desc(dout, seqlen_q, nheads, bm)
    k_desc, (kv_rb, kv_rh, kv_ch) = _f90._desc(k, seqlen_k, nheads_k, bn)
    v_desc, _ = _f90._desc(v, seqlen_k, nheads_k, bn)
    if with_dq:
        # fp32 dQ, (B·H, Sq, D), summed over K blocks; one counter per (b, h, Q block) orders the sums
        dq_acc = torch.zeros((batch * nheads, seqlen_q, d), dtype=torch.float32, device=q.device)
        sem = torch.zeros((batch * nheads * (seqlen_q // bm),), dtype=torch.int32, device=q.device)
    else:
        dq_acc = sem = None  # unused (WITH_DQ is a constexpr): no allocation, no memset
    grid = (batch * nheads_k, seqlen_k // bn)   # (the 8-warp kernel has the 2-D grid only)
    _attn_bwd_sm90[grid](
        q_desc, k_desc, v_desc, do_desc, lse, delta, dq_acc, sem, dk, dv,
        q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch,
        lse.stride(0), lse.stride(1), d,
        dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2),
        nheads, nheads_k, nheads // nheads_k, seqlen_q, seqlen_k, softmax_scale * LOG2E, softmax_scale,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
        DETERMINISTIC=deterministic, VEC=cfg.get("VEC", 2), WITH_DQ=with_dq,
        CARRY_DK=cfg.get("CARRY_DK", True), num_warps=cfg["num_warps"], D_OUT=_d_out(dk, d),
    )
    if with_dq:  # dq = scale · dq_acc, in q's layout and dtype
        dq.copy_(dq_acc.view(batch, nheads, seqlen_q, d).transpose(1, 2)[..., :dq.shape[-1]].mul_(softmax_scale))


def dq_config_for(head_dim: int, causal: bool) -> dict:
    """Tiles of the Gluon dQ kernel: 128-row Q blocks in two 64-row halves, 128-key K/V blocks, a
    2-slot ring. Measured (H200, fp16, the kernel alone, TFLOP/s-equivalent =
    whole-backward flops over this kernel's time, N = 4k / 16k): D = 128 non-causal 1165 / 1116
    against 1106 / 1087 with 64-key blocks and 3 slots; causal 1022 / 1088 against 951 / 991;
    D = 64 non-causal 959 / 985 against 901 / 892, causal 852 / 923 against 786 / 843. The Triton
    dQ kernel it replaces ran at ~1020 (D = 128 non-causal 16k, from the whole backward minus the
    dK/dV kernel). ``PDL`` (off; opt-in): launched with programmatic dependent launch, meant only
    right after a dK/dV kernel with ``PDL_TRIGGER`` (:func:`config_for`; its A/B was
    within the spread, so not the default)."""
    if head_dim > 128:
        # D = 256 (SPLIT_D): both consumers on the same 64 rows, each with half of dQ's columns;
        # 64-key blocks in a 2-slot ring (222 KB of shared memory). H200
        # (fp16, kernel alone, N = 4k / 16k): 1468 / 5989 µs non-causal, 803 / 2896 causal, against
        # 1950 / 7640 and 1106 / 3720 for the Triton dQ kernel. Not swept.
        return dict(BLOCK_M=64, BLOCK_N=64, STAGES=2, PDL=False, SPLIT_D=True)
    return dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, PDL=False)


def dq_supported(q, k, dq, causal: bool) -> bool:
    """Whether a call that took the Gluon dK/dV kernel can also take the Gluon dQ kernel: lengths
    that are multiples of its tiles, a dq buffer of q's shape (or, for q padded to the kernel's
    head dim, :func:`padded_head_dim`, of its own head dim) with contiguous rows and int32 head
    offsets, and at most 65535 batch*heads (its grid's axis 1; past that the Triton dQ kernel's
    flat grid runs)."""
    cfg = dq_config_for(q.shape[-1], causal)
    return (q.shape[-1] in (64, 128, 256) and q.shape[1] % cfg["BLOCK_M"] == 0 and k.shape[1] % cfg["BLOCK_N"] == 0
            and dq.shape[:-1] == q.shape[:-1] and _f90.padded_head_dim(dq.shape[-1]) == q.shape[-1]
            and dq.stride(-1) == 1 and _head_offsets_fit(dq) and q.shape[0] * q.shape[2] <= GRID_YZ_MAX)


def _dq_launch(dout, q, k, v, lse, dq, causal, cfg, out=None):
    """The Gluon dQ kernel's launch for this layout: descriptors Q, K, V, dO (Q/dO in the
    BLOCK_M // 2-row halves); pointers LSE, DELTA, DQ, O; then the integer arguments and the scales.
    ``out`` given: the kernel computes delta from it (``FUSE_DELTA``); else O is not read (the
    launch passes dq in its place)."""
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k, nheads_k = k.shape[1], k.shape[2]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    split = cfg.get("SPLIT_D", False)
    q_desc, (q_rb, q_rh, q_ch) = _f90._desc(q, seqlen_q, nheads, bm if split else bm // 2)
    do_desc, _ = _f90._desc(dout, seqlen_q, nheads, bm if split else bm // 2)
    k_desc, (kv_rb, kv_rh, kv_ch) = _f90._desc(k, seqlen_k, nheads_k, bn)
    v_desc, _ = _f90._desc(v, seqlen_k, nheads_k, bn)
    o = dq if out is None else out
    ints = (q_rb, q_rh, q_ch, kv_rb, kv_rh, kv_ch, lse.stride(0), lse.stride(1),
            dq.stride(0), dq.stride(1), dq.stride(2), o.stride(0), o.stride(1), o.stride(2),
            nheads, nheads // nheads_k, seqlen_q, seqlen_k)
    constexprs = dict(HEAD_DIM=d, BLOCK_M=bm, BLOCK_N=bn, STAGES=cfg["STAGES"], CAUSAL=causal,
                      CONSUMER_REGS=cfg.get("CONSUMER_REGS", 240), num_warps=4, D_OUT=_d_out(dq, d), SPLIT_D=split,
                      FUSE_DELTA=out is not None)
    if cfg.get("PDL", False):  # a launch option, not a parameter: it is in the compiled kernel's metadata
        constexprs["launch_pdl"] = True
    return Launch(_attn_bwd_dq_sm90_ws, (seqlen_q // bm, batch * nheads), (q_desc, k_desc, v_desc, do_desc),
                        4, ints, 2, constexprs)


def backward_dq(dout, q, k, v, lse, delta, dq, softmax_scale: float, causal: bool, cfg: dict | None = None,
                out=None):
    """dQ by the warp-specialized Gluon dQ kernel (``_attn_bwd_dq_sm90_ws``) into dq, in place of
    the Triton dQ kernel (``tileflash.ops.route`` sends Hopper calls here by default; the debug
    switch ``gluon_dq=0`` does not; ``cfg`` overrides :func:`dq_config_for`). Same
    scope as :func:`supported` (the caller checks it); lengths must be multiples
    of the tiles. Returns dq, or None after a warning if the kernel does not compile with the
    installed triton (the caller then runs the Triton dQ kernel).

    ``out`` (the forward's output: dq's shape, q's dtype, a unit last stride; not with
    ``SPLIT_D``, see :func:`dq_computes_delta`): the kernel also computes
    delta = rowsum(dO∘O) and writes it into ``delta`` (then an output, in the LSE's layout), so
    that no delta kernel runs before it; the dK/dV kernel, launched after, reads it. ``out`` None:
    ``delta`` is an input, as the delta kernel made it."""
    cfg = cfg or dq_config_for(q.shape[-1], causal)
    if delta.stride() != lse.stride():
        raise ValueError("backward_dq: delta must have lse's strides (the kernel addresses both alike)")
    if out is not None:
        if cfg.get("SPLIT_D", False):
            raise ValueError("backward_dq: out (delta computed in the kernel) needs a config without SPLIT_D")
        if not out_supported(out, q, dq):
            raise ValueError(f"backward_dq: out must have dq's shape {tuple(dq.shape)}, q's dtype {q.dtype}, a "
                             f"unit last stride and head offsets within int32; got {tuple(out.shape)} {out.dtype}, "
                             f"strides {out.stride()}")
    batch, seqlen_q, nheads, d = q.shape
    seqlen_k = k.shape[1]
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    if not _head_offsets_fit(dq):
        raise ValueError("backward_dq: dq's head offsets overflow int32; use the Triton dQ kernel")
    if seqlen_q % bm or seqlen_k % bn:
        raise ValueError(f"backward_dq: seqlen_q ({seqlen_q}) and seqlen_k ({seqlen_k}) must be multiples of "
                         f"BLOCK_M={bm} and BLOCK_N={bn}")
    key = ("dq",) + _f90._key(d, causal, q.dtype, cfg) + (out is not None,)
    if key in _BROKEN:
        return None

    tensors = (dout, q, k, v, lse, dq, delta) + ((out,) if out is not None else ())
    launch = _cached_launch("dq", lambda: _dq_launch(dout, q, k, v, lse, dq, causal, cfg, out),
                            tensors, (bool(causal), out is not None), cfg)
    o = dq if out is None else out
    if not launch_or_fall_back(
            _BROKEN, key, "the Gluon dQ kernel", "using the Triton dQ kernel for this configuration.",
            lambda: _run_dq(launch, dout, q, k, v, lse, delta, dq, o, softmax_scale)):
        return None
    return dq


def out_supported(out, q, dq) -> bool:
    """Whether the dQ kernel can read delta's O from ``out`` (:func:`backward_dq`): dq's shape, q's
    dtype, a unit last stride, int32 head offsets."""
    return out.shape == dq.shape and out.dtype == q.dtype and out.stride(-1) == 1 and _head_offsets_fit(out)


def dq_computes_delta(head_dim: int, causal: bool) -> bool:
    """Whether ``flash_attn_backward`` runs the Gluon dQ kernel first, computing delta itself
    (:func:`backward_dq` with ``out``), and the dK/dV kernel after it, instead of a delta kernel,
    the dK/dV kernel, then the dQ kernel. Not for ``SPLIT_D`` (D = 256: each consumer holds half a
    row) nor for an opt-in ``PDL`` config (its overlap assumes the dK/dV kernel runs first), nor
    with the debug switch ``dq_delta=0`` (``tileflash.options.DEBUG``)."""
    cfg = dq_config_for(head_dim, causal)
    return DEBUG.dq_delta and not cfg.get("SPLIT_D", False) and not cfg.get("PDL", False)


def default_launches(dout, q, k, v, lse, delta, dq, dk, dv, causal: bool, out):
    """The cached launches of the default backward of this layout, (dQ kernel computing delta from
    ``out``, dK/dV kernel), as :func:`backward_dq` (with ``out``) and :func:`backward` made them, or
    None where the default configs are not those two launches. ``tileflash.ops.route`` replays
    them for repeated calls of one layout (host time)."""
    d = q.shape[-1]
    cfg, dcfg = config_for(d, causal, q.shape[1]), dq_config_for(d, causal)
    if not cfg.get("WS", False) or cfg.get("WITH_DQ", False) or dcfg.get("SPLIT_D", False):
        return None
    dq_key = ("dq",) + _f90._key(d, causal, q.dtype, dcfg) + (True,)  # as backward_dq keys it, with out
    if _f90._key(d, causal, q.dtype, cfg) in _BROKEN or dq_key in _BROKEN:
        return None
    dq_launch = _cached_launch("dq", lambda: _dq_launch(dout, q, k, v, lse, dq, causal, dcfg, out),
                               (dout, q, k, v, lse, dq, delta, out), (bool(causal), True), dcfg)
    dkdv_launch = _cached_launch("dkdv", lambda: _ws_launch(dout, q, k, v, lse, dk, dv, causal, cfg, True),
                                 (dout, q, k, v, lse, dk, dv, delta), (bool(causal), True), cfg)
    return dq_launch, dkdv_launch


def fused_launches(dout, q, k, v, lse, delta, dk, dv, causal: bool, cfg: dict, deterministic: bool):
    """The cached launch of the fused backward of this layout and config (``cfg``:
    :func:`fused_config_for`'s, with ``WS``), as :func:`backward` made it, for
    :func:`replay_default`: ``("fused", launch, BLOCK_M)``, or None where it is not the
    warp-specialized fused mode or its configuration failed to compile."""
    if not (cfg.get("WS", False) and cfg.get("WITH_DQ", False)) or cfg.get("PINGPONG", False):
        return None
    if _f90._key(q.shape[-1], causal, q.dtype, cfg) in _BROKEN:
        return None
    return "fused", _fused_launch(dout, q, k, v, lse, delta, dk, dv, causal, cfg, deterministic), cfg["BLOCK_M"]


def replay_default(launches, dout, q, k, v, out, lse, softmax_scale, like_inputs: bool = False):
    """The default backward of a layout whose launches :func:`default_launches` (the split pair) or
    :func:`fused_launches` (the fused kernel) returned, on new tensors of that layout: allocations,
    then the dQ kernel (computing delta) and the dK/dV kernel, or the delta kernel and the fused
    kernel. ``like_inputs`` (``Options.like_inputs``, as the launches were recorded with): dq, dk, dv
    in q's, k's and v's memory order."""
    if like_inputs:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    else:  # (sizes unpacked: torch parses ints faster than a torch.Size, host time per call)
        dq = torch.empty(*q.shape, dtype=q.dtype, device=q.device)
        dk = torch.empty(*k.shape, dtype=k.dtype, device=k.device)
        dv = torch.empty(*v.shape, dtype=v.dtype, device=v.device)
    if len(launches) == 3:  # ("fused", launch, BLOCK_M)
        _, launch, bm = launches
        bufs = fused_buffers(q, bm, zeroed=False)  # (zeroed by the delta kernel)
        delta = _compute_delta(out, dout, lse, False, q.shape[2], q.shape[3], zero=bufs[2])
        _run_fused(launch, dout, q, k, v, lse, delta, dq, dk, dv, softmax_scale, bufs)
        return dq, dk, dv
    dq_launch, dkdv_launch = launches
    delta = torch.empty(*lse.shape, dtype=torch.float32, device=q.device)
    _run_dq(dq_launch, dout, q, k, v, lse, delta, dq, out, softmax_scale)
    _run_dkdv(dkdv_launch, dout, q, k, v, lse, delta, dk, dv, softmax_scale)
    return dq, dk, dv
