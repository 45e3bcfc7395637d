"""KV-cache attention for decoding: split-KV (flash-decoding) with GQA packing, paged caches.

Decoding is a few new query tokens against a long cache: memory-bound, and a prefill grid of one
program per (Q block, head) leaves most of the GPU idle at small batch. Here:

* one program per (KV split, batch, kv head, row block) reads its slice of the cache once for
  the query heads of its GQA group and the new tokens, packed as rows (row r = g·seqlen_q + t for
  query head hk·G + g and new token t; one row block of up to 64 rows covers a whole group when
  decoding a token, so each K/V byte is read once);
* each split writes its partial (fp32 out normalised within the split, LSE); the last split of a
  (batch, kv head, row block) to finish (an atomic ticket) merges them with their LSEs in the same
  launch: lse = log Σ_s exp(lse_s), out = Σ_s exp(lse_s − lse)·out_s; one split writes directly;
* the cache is either contiguous ``(batch_cache, max_len, nheads_k, d)`` (with an optional
  ``cache_batch_idx`` indirection) or paged ``(num_blocks, page_size, nheads_k, d)`` with a
  ``block_table (batch, max_blocks)``: key j of batch b lives in page block_table[b, j // page_size],
  row j % page_size. Any page size works: a tile inside one page looks the page up once, otherwise each key row does.

Masks follow tileflash.ops.triton.common: new token t sits at position seqlen_k_b − seqlen_q + t,
i.e. rel = t + shift − j with shift = seqlen_k_b − seqlen_q (bottom-right causal).
"""

from __future__ import annotations

import functools
import threading

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tileflash.ops.triton.common import LN2_C, LOG2E_C, score_mods, visible
from tileflash.ops.triton.forward import block_d_for, interpreting
from tileflash.ops.launch import Launch, addresses
from tileflash.ops.utils import GRID_YZ_MAX, LOG2E, cdiv, feature_args, lse_scratch, next_pow2
from tileflash.options import DEBUG

# GPU launch defaults of the split kernel, from H200 sweeps with tools/decode_sweep.py (bf16,
# Hq 32, Hkv 8, D 128, 2026-11-30/12-01; docs/perf-notes.md, "Decode (split-KV)"). waves: target
# programs per SM when choosing num_splits; full_unsplit: see choose_num_splits. The K/V tiles of
# all stages must fit the SM's shared memory: 128-key tiles on 3 stages leave room for one program per SM, hence
# one wave (B=1 L=8k 1.62 TB/s against 1.36 with two; L=128k 3.75 / 3.66).
WAVES = 2
DECODE_CONFIG = dict(block_n=128, num_warps=4, num_stages=3, waves=1,        # contiguous
                     full_unsplit=0.9, pdl=2)
# pages of 128·k: the same. With the table lookup pipelined by Triton (before TABLE_ASM), the K/V
# tiles were single-buffered and an unsplit page-256 cache read 2.75-2.89 TB/s at B=16;
# with TABLE_ASM, 4.51 at L=64k against 4.46 contiguous.
DECODE_CONFIG_PAGE128 = dict(DECODE_CONFIG)
DECODE_CONFIG_SHORT = dict(block_n=64, num_warps=4, num_stages=3, waves=2, pdl=0)   # the same, for splits of <= 256 keys
# pages of 16, 32 and 64: the contiguous config on 128-key tiles of several whole pages, one
# inline lookup per page (PAGES_PER_TILE; PDL on, us at B=1 8k / B=16 8k
# / B=16 64k / B=1 128k: page 64 16.9 / 127.8 / 971 / 132.0 against 19.5 / 129.0 / 961 / 137.2
# for 64-key page tiles; page 16 18.5 / 136.1 / 1018 / 151.8 against 23.0 / 131.3 / 1053 / 141.6
# for 16-key tiles; contiguous 16.8 / 125.5 / 966 / 129.7)
DECODE_CONFIG_MULTI_PAGE = dict(DECODE_CONFIG, multi_page=True)
# pages of 16 when the one-wave splits above would be longer than LONG_SPLIT keys: two programs
# per SM of 64-key tiles (4 pages each, one 16-byte lookup per tile), so that one program's
# synchronous page lookups are hidden behind the other's copies. Measured (us, 128-key
# one-wave config against this one): B=1 L=128k 147.9 -> 136.9 (contiguous 129.7), B=16 L=64k
# 992 -> 963, B=4 L=32k 134.4 -> 131.6; level at B=1 L=32k (2048-key splits: 44.4 / 45.1); slower
# at B=1 L=8k (512-key splits: 18.2 against 19.6)
DECODE_CONFIG_PAGE16_LONG = dict(block_n=64, num_warps=4, num_stages=3, waves=2, min_split=512, pdl=0,
                                 multi_page=True)
LONG_SPLIT = 2048
# pages of 64·k otherwise (192, 320, ...): two waves of 64-key page tiles, but splits of at least
# 512 keys (8 tiles, each waiting for its page lookup). Pages of 64: B=1
# L=8k 1.72 TB/s with 16 splits against 1.52 with 32; L=128k 3.71 with 33 splits against 3.32
# with 16; B=16: 2 splits
DECODE_CONFIG_PAGE64 = dict(block_n=64, num_warps=4, num_stages=3, waves=2, min_split=512, pdl=0)
DECODE_CONFIG_SMALL_PAGE = dict(block_n=16, num_warps=2, num_stages=8, waves=4, pdl=0)  # other pages (8, 24, 96, odd)
DECODE_CONFIG_WIDE = dict(block_n=64, num_warps=8, num_stages=2, waves=2, pdl=0)    # BLOCK_D 256: 2 x 64 KiB
# skew: the order of a program's tiles (see _decode_split): 2 starts each batch entry's programs at
# a tile spread over its split, wrapping around, so that the batch entries do not stream the same
# offsets of their caches at the same time. Measured at B=16 (Hkv 8, contiguous, 2-4
# separately allocated caches per measurement, graph of 8 calls, cuDNN on the same
# tensors): against cuDNN, L=64k/128k 0.988-1.011x with skew 2 against 0.959-1.011x in order (3
# of 24 in-order samples 2.4-4.1% low, none with skew 2), L=8k 0.998-1.002x against 0.996-0.998x.
# 1 (spread by program, the kv heads of an entry apart) read 4.357-4.472 TB/s at 128k (below
# both); 3 (every 37th tile) +0.5% over 2 at 64k/128k but -0.7% at 8k. None is reliably ahead
# of cuDNN (docs/perf-notes.md, "Decode (split-KV)"). At B=1 there is nothing to spread, and
# the rotation's index arithmetic cost 0.6 us at L=8k, so B=1 runs in order.
SKEW = 2
# pdl: where a programmatic dependent launch (sm90+) lets the next kernel be scheduled (see
# _decode_split; 0: no PDL). 8 calls per graph, A/B in one process: with one program
# per SM (128-key tiles on 3 stages) the trigger after the key loop (2) took B=1 L=8k from 17.3-17.4
# to 16.8 us contiguous and 18.9 to 18.3 us with pages of 256; B=16 and L=128k moved
# by under 1% either way. Where several programs share an SM (the 16-key config of pages of 16
# and the 64-key one then used for pages of 64), an early trigger (1, 2) let the next call's
# programs take SM slots while they wait: B=16 L=8k went from 131 to 140-180 us (page 16) and 129
# to 135-160 us (page 64); the trigger at exit (3) was level with no PDL everywhere (within
# 0.2%), so configs with several programs per SM keep PDL off.


def decode_config(block_d: int, page_size: int = 0) -> dict:
    """Launch config of the split kernel for a head dim padded to block_d and a cache of
    `page_size`-token pages (0: contiguous). See DECODE_CONFIG_SHORT for short splits."""
    if block_d > 128:
        return dict(DECODE_CONFIG_WIDE)
    if block_d < 128:
        # smaller K/V tiles let several programs share an SM, where an early PDL trigger slowed
        # the calls (see the pdl note above); PDL was measured at D=128 only
        return {**decode_config(128, page_size), "pdl": 0}
    if page_size <= 0:
        return dict(DECODE_CONFIG)
    if page_size % 128 == 0:
        return dict(DECODE_CONFIG_PAGE128)
    if page_size in (16, 32, 64):
        return dict(DECODE_CONFIG_MULTI_PAGE)
    return dict(DECODE_CONFIG_PAGE64 if page_size % 64 == 0 else DECODE_CONFIG_SMALL_PAGE)


@triton.jit
def _table_load(ptr, TABLE_ASM: tl.constexpr):
    """Block-table entries at ptr (in range). TABLE_ASM (GPU): a plain ``ld.global.nc`` in inline
    PTX, which Triton's software pipeliner leaves where it is. Through ``tl.load`` the pipeliner
    makes the lookup an asynchronous copy one stage ahead of the K/V tile it addresses, and with
    it the K/V copies only one tile ahead of their use (triton 3.6, 3 stages: one K/V buffer and a
    wait for every copy at the top of each iteration). The table is a few cache lines read by every
    program of a batch entry, so the synchronous load mostly hits L1. The interpreter cannot run
    PTX, so it takes ``tl.load``."""
    if TABLE_ASM:
        return tl.inline_asm_elementwise("ld.global.nc.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                         is_pure=True, pack=1)
    else:
        return tl.load(ptr)


@triton.jit
def _page_select(page, entry, j, o_nb, PAGE_KEYS: tl.constexpr, num_cache):
    """The keys of page j of a multi-page tile take block-table entry `entry` (clamped into the
    cache, as every lookup is): page [BLOCK_N] int64."""
    entry = tl.minimum(tl.maximum(entry, 0), num_cache - 1).to(tl.int64)
    return tl.where(o_nb // PAGE_KEYS == j, entry, page)


@triton.jit
def _merge_splits(O, LSE, O_PART, LSE_PART, part0, part_step, row0, n_rows, off_b, off_hk, nheads, seqlen_q,
                  stride_ob, stride_om, stride_oh, num_splits,
                  KV_GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                  S_CHUNK: tl.constexpr, MERGE_ROWS: tl.constexpr):
    """Merge packed rows [row0, row0 + n_rows) of one (batch, kv head) over the splits, and store
    them: lse = log Σ_s exp(lse_s), out = Σ_s exp(lse_s − lse)·out_s (base 2 inside).

    Split s's partial of row r is row part0 + s·part_step + r of the partial buffers. MERGE_ROWS
    rows at a time, S_CHUNK splits per load ([S_CHUNK, MERGE_ROWS, BLOCK_D]): when the host's rule
    (``decode_forward``) fits a decode step's whole GQA group and all its splits in one load, the
    merge is one round of independent L2 loads; otherwise it goes a row at a time. A row with
    every split empty gets 0 and lse -inf. The sums are in a fixed order whichever program merges,
    so the result is deterministic."""
    o_s = tl.arange(0, BLOCK_S)
    o_c = tl.arange(0, S_CHUNK)
    o_rr = tl.arange(0, MERGE_ROWS)
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < HEAD_DIM
    for r0 in range(row0, row0 + n_rows, MERGE_ROWS):
        rr = r0 + o_rr                                                                # [MERGE_ROWS]
        m_rr = rr < row0 + n_rows
        lse_s = tl.load(LSE_PART + part0 + o_s[:, None].to(tl.int64) * part_step + rr[None, :],
                        mask=(o_s < num_splits)[:, None] & m_rr[None, :], other=float("-inf"),
                        cache_modifier=".cg")                                         # [BLOCK_S, MERGE_ROWS]
        m = tl.max(lse_s, 0)                                                          # [MERGE_ROWS]
        m_use = tl.where(m == float("-inf"), 0.0, m)
        total = tl.sum(tl.math.exp2(lse_s - m_use[None, :]), 0)                       # [MERGE_ROWS]
        acc = tl.zeros([MERGE_ROWS, BLOCK_D], dtype=tl.float32)
        for s0 in range(0, num_splits, S_CHUNK):
            rows = part0 + (s0 + o_c)[:, None].to(tl.int64) * part_step + rr[None, :]  # [S_CHUNK, MERGE_ROWS]
            m_c = (s0 + o_c < num_splits)[:, None] & m_rr[None, :]
            w = tl.math.exp2(tl.load(LSE_PART + rows, mask=m_c, other=float("-inf"), cache_modifier=".cg")
                             - m_use[None, :])                                   # [S_CHUNK, MERGE_ROWS]; 0 if empty
            # every split stored its rows (0 where it saw no key), so this load need not wait for w
            o_part = tl.load(O_PART + rows[:, :, None] * BLOCK_D + o_d[None, None, :],
                             mask=m_c[:, :, None] & m_d[None, None, :], other=0.0,
                             cache_modifier=".cg")                                    # [S_CHUNK, MERGE_ROWS, BLOCK_D]
            acc += tl.sum(w[:, :, None] * o_part, 0)
        t_safe = tl.where(total == 0.0, 1.0, total)
        lse = tl.where(total == 0.0, float("-inf"), (m_use + tl.math.log2(t_safe)) * LN2_C)
        h = off_hk * KV_GROUP + rr // seqlen_q                                        # [MERGE_ROWS] query head
        t = rr % seqlen_q                                                             # [MERGE_ROWS] new token
        tl.store(O + off_b * stride_ob + t[:, None].to(tl.int64) * stride_om + h[:, None] * stride_oh + o_d[None, :],
                 (acc / t_safe[:, None]).to(O.dtype.element_ty), mask=m_rr[:, None] & m_d[None, :])
        tl.store(LSE + (off_b * nheads + h) * seqlen_q + t, lse, mask=m_rr)


@triton.jit(do_not_specialize=["seqlen_q", "seqlen_fixed", "split_len", "num_splits", "window_left", "window_right"])
def _decode_split(
    Q, K, V, O, LSE, O_PART, LSE_PART, COUNTER, SEQLENS_K, BATCH_IDX, BLOCK_TABLE, ALIBI, LEFTPAD,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_bt_b, stride_ab, stride_ah,
    nheads, nheads_k, seqlen_q, seqlen_fixed, split_len, num_splits, page_size, window_left, window_right,
    rows_total, capacity, num_cache,
    qk_scale, softcap_scale, softcap2,
    KV_GROUP: tl.constexpr, HAS_LEFT: tl.constexpr, HAS_RIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
    HAS_ALIBI: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, PAGED: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DOT_PRECISION: tl.constexpr, PAGE_TILE: tl.constexpr = False, HAS_SEQLENS: tl.constexpr = True,
    SPLIT: tl.constexpr = True, BLOCK_S: tl.constexpr = 2, S_CHUNK: tl.constexpr = 2,
    HAS_LEFTPAD: tl.constexpr = False, TABLE_ASM: tl.constexpr = False, MERGE_ROWS: tl.constexpr = 1,
    PDL: tl.constexpr = 0, PAGES_PER_TILE: tl.constexpr = 1, TABLE_VEC: tl.constexpr = False,
    SKEW: tl.constexpr = 0, BH_AXIS0: tl.constexpr = False,
):
    """One (KV split, batch·kv head, row block) program: attention of the packed rows over keys
    [pid_s·split_len, (pid_s+1)·split_len) of the cache.

    SPLIT (num_splits > 1): each program writes its unnormalised partial (out_s, lse_s), then takes
    a ticket from COUNTER (zero on entry, one int32 per (batch·kv head, row block)); the program
    that takes the last ticket resets the counter for the next call and merges every split's partial
    into O and LSE (so no second launch).
    Otherwise the program writes O and LSE directly. HAS_SEQLENS: batch entry b holds
    SEQLENS_K[b] + seqlen_fixed keys (seqlen_fixed: the tokens an append just added after the
    lengths it was given), else every batch entry holds seqlen_fixed keys.
    PAGE_TILE (paged, page_size a multiple of BLOCK_N): a K/V tile never straddles two pages
    (splits start at multiples of BLOCK_N), so one block-table entry per tile gives affine row
    addresses, as in a contiguous cache. PAGES_PER_TILE > 1 (paged, BLOCK_N that many whole pages):
    one lookup per page, each key taking its page's id. Otherwise each key looks its page up.
    HAS_LEFTPAD: keys before LEFTPAD[b] are invisible (flash-attn's cache_leftpad); every position
    stays absolute, so masks, ALiBi and the bottom-right alignment are unchanged.
    PDL > 0 (launched with programmatic dependent launch, sm90+): the program waits for the kernel
    before it in the stream to complete, with its writes visible, before its first global access;
    it lets the next PDL kernel be scheduled (which waits the same way, so only its launch and
    index arithmetic overlap our tail) at its start (PDL=1), after its key loop (PDL=2), or at its
    exit (PDL=3, no explicit trigger).
    SKEW: the order of the split's tiles: in order (0), or rotated to start at a tile spread by
    batch entry (2) or by program (1), wrapping around, or from that start every 37th tile (3);
    the sum then runs in that order.
    The grid is (splits, batch·kv heads, row blocks), or, past 65535 batch·kv heads (a grid's y
    limit), (batch·kv heads, splits, row blocks) (BH_AXIS0)."""
    if PDL > 0:
        gdc_wait()                # nothing global is read or written before this
    if PDL == 1:
        gdc_launch_dependents()
    if BH_AXIS0:
        pid_s = tl.program_id(1)
        pid_bh = tl.program_id(0)
        n_bh = tl.num_programs(0)
    else:
        pid_s = tl.program_id(0)
        pid_bh = tl.program_id(1)
        n_bh = tl.num_programs(1)
    pid_m = tl.program_id(2)
    off_b = (pid_bh // nheads_k).to(tl.int64)
    off_hk = (pid_bh % nheads_k).to(tl.int64)
    # cache length after the append, this batch entry; clamped, as are page and batch indices below,
    # because a read-only call does not check the values on the host (no sync): bad values give
    # wrong numbers for that row, never an access outside the cache
    if HAS_SEQLENS:
        seqlen_k = tl.load(SEQLENS_K + off_b) + seqlen_fixed  # (seqlen_fixed: the tokens just appended)
    else:
        seqlen_k = seqlen_fixed
    seqlen_k = tl.minimum(tl.maximum(seqlen_k, 0), capacity)
    shift = seqlen_k - seqlen_q
    lo = pid_s * split_len
    hi = tl.minimum(lo + split_len, seqlen_k)
    if HAS_LEFTPAD:
        k_first = tl.minimum(tl.maximum(tl.load(LEFTPAD + off_b), 0), seqlen_k)     # first visible key
        lo = tl.maximum(lo, (k_first // BLOCK_N) * BLOCK_N)  # skip whole tiles before it, keep alignment

    o_r = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)                                     # [BLOCK_M] packed rows
    o_g = o_r // seqlen_q                                                             # query head within group
    o_t = o_r % seqlen_q                                                              # new token index
    m_r = o_r < KV_GROUP * seqlen_q
    o_h = off_hk * KV_GROUP + o_g                                                     # [BLOCK_M] query head
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < HEAD_DIM
    p_q = Q + off_b * stride_qb + o_t[:, None].to(tl.int64) * stride_qm + o_h[:, None] * stride_qh + o_d[None, :]
    b_q = tl.load(p_q, mask=m_r[:, None] & m_d[None, :], other=0.0)                  # [BLOCK_M, BLOCK_D]
    slope2 = tl.zeros([BLOCK_M], dtype=tl.float32)
    if HAS_ALIBI:
        slope2 = tl.load(ALIBI + off_b * stride_ab + o_h * stride_ah, mask=m_r, other=0.0) * LOG2E_C

    if HAS_BATCH_IDX:
        cache_b = tl.minimum(tl.maximum(tl.load(BATCH_IDX + off_b), 0), num_cache - 1).to(tl.int64)
    else:
        cache_b = off_b
    K_base = K + off_hk * stride_kh
    V_base = V + off_hk * stride_vh
    if not PAGED:
        K_base += cache_b * stride_kb
        V_base += cache_b * stride_vb
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    o_nb = tl.arange(0, BLOCK_N)
    # last block-table entry of a row. Every lookup index is clamped to it, also for tiles the loop
    # never runs: Triton's pipeliner issues the lookups (pure inline PTX) of the first tiles in its
    # prologue, before the loop's bounds are checked
    last_page = tl.maximum(capacity // page_size - 1, 0)
    # the split's tiles in a rotated order (SKEW): tile (j + rot) mod n_tiles at step j. SKEW 2:
    # batch entry b of B starts b/B of the way into its split (its kv heads together), so the
    # entries do not all stream the same offsets of their caches at once; 1: rot by program; 3: rot
    # by batch entry, then every 37th tile, (j·37 + rot) mod n_tiles; 0: in order
    n_tiles = tl.cdiv(tl.maximum(hi - lo, 0), BLOCK_N)
    if SKEW == 1:     # products in int64: a block table may give a row far more tiles than memory holds
        rot = ((pid_bh.to(tl.int64) * n_tiles) // n_bh).to(tl.int32)
    elif SKEW >= 2:
        rot = ((off_b * n_tiles) // (n_bh // nheads_k)).to(tl.int32)
    else:
        rot = 0
    step = tl.where(n_tiles % 37 == 0, 1, 37)        # SKEW 3: every 37th tile (coprime: a permutation)
    for t_n in range(lo, hi, BLOCK_N):                # in order: t_n is the tile's first key
        if SKEW == 3:   # the pipeliner may compute this for a loop that never runs: no % 0
            jj = (((t_n - lo) // BLOCK_N).to(tl.int64) * step + rot) % tl.maximum(n_tiles, 1)
            start_n = lo + jj.to(tl.int32) * BLOCK_N
        elif SKEW > 0:
            start_n = t_n + rot * BLOCK_N
            start_n = tl.where(start_n >= lo + n_tiles * BLOCK_N, start_n - n_tiles * BLOCK_N, start_n)
        else:
            start_n = t_n
        o_n = start_n + o_nb                                                          # [BLOCK_N]
        m_n = o_n < hi
        if HAS_LEFTPAD:
            m_n = m_n & (o_n >= k_first)
        if PAGED and PAGE_TILE:
            page1 = _table_load(BLOCK_TABLE + off_b * stride_bt_b + tl.minimum(start_n // page_size, last_page),
                                TABLE_ASM)                                                      # scalar
            page1 = tl.minimum(tl.maximum(page1, 0), num_cache - 1).to(tl.int64)
            r0 = (start_n % page_size).to(tl.int64)
            p_kt = K_base + page1 * stride_kb + (r0 + o_nb[None, :]) * stride_kn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
            p_v = V_base + page1 * stride_vb + (r0 + o_nb[:, None]) * stride_vn + o_d[None, :]   # [BLOCK_N, BLOCK_D]
        elif PAGED and PAGES_PER_TILE > 1:
            # tiles start on page boundaries (split_len and the leftpad skip are multiples of
            # BLOCK_N): one lookup per page, then a select per page gives each key its page id
            PAGE_KEYS: tl.constexpr = BLOCK_N // PAGES_PER_TILE                      # = page_size
            page = tl.zeros([BLOCK_N], dtype=tl.int64)                                # [BLOCK_N]
            if TABLE_VEC:
                # the tile's PAGES_PER_TILE entries, 4 per 16-byte load (the host checked that the
                # table is int32, its rows 16-byte aligned and a whole number of tiles' entries
                # long, so the clamped start stays a multiple of PAGES_PER_TILE)
                p_tab = BLOCK_TABLE + off_b * stride_bt_b + tl.minimum(start_n // PAGE_KEYS,
                                                                       last_page + 1 - PAGES_PER_TILE)
                for c in tl.static_range(PAGES_PER_TILE // 4):
                    e0, e1, e2, e3 = tl.inline_asm_elementwise(
                        "ld.global.nc.v4.b32 {$0, $1, $2, $3}, [$4];", "=r,=r,=r,=r,l", [p_tab + 4 * c],
                        dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
                    page = _page_select(page, e0, 4 * c, o_nb, PAGE_KEYS, num_cache)
                    page = _page_select(page, e1, 4 * c + 1, o_nb, PAGE_KEYS, num_cache)
                    page = _page_select(page, e2, 4 * c + 2, o_nb, PAGE_KEYS, num_cache)
                    page = _page_select(page, e3, 4 * c + 3, o_nb, PAGE_KEYS, num_cache)
            else:
                for j in tl.static_range(PAGES_PER_TILE):
                    pj = _table_load(BLOCK_TABLE + off_b * stride_bt_b
                                     + tl.minimum(start_n // PAGE_KEYS + j, last_page), TABLE_ASM)
                    page = _page_select(page, pj, j, o_nb, PAGE_KEYS, num_cache)
            row = (o_nb % PAGE_KEYS).to(tl.int64)                                     # [BLOCK_N]
            p_kt = K_base + page[None, :] * stride_kb + row[None, :] * stride_kn + o_d[:, None]  # [BLOCK_D, BLOCK_N]
            p_v = V_base + page[:, None] * stride_vb + row[:, None] * stride_vn + o_d[None, :]   # [BLOCK_N, BLOCK_D]
        elif PAGED:
            # the index is clamped into the table's row, not masked: keys past hi are masked below
            page = _table_load(BLOCK_TABLE + off_b * stride_bt_b + tl.minimum(o_n // page_size, last_page),
                               TABLE_ASM)                                                      # [BLOCK_N]
            page = tl.minimum(tl.maximum(page, 0), num_cache - 1).to(tl.int64)                 # [BLOCK_N]
            row = (o_n % page_size).to(tl.int64)
            p_kt = K_base + page[None, :] * stride_kb + row[None, :] * stride_kn + o_d[:, None]
            p_v = V_base + page[:, None] * stride_vb + row[:, None] * stride_vn + o_d[None, :]
        else:
            p_kt = K_base + o_n[None, :].to(tl.int64) * stride_kn + o_d[:, None]
            p_v = V_base + o_n[:, None].to(tl.int64) * stride_vn + o_d[None, :]
        b_kt = tl.load(p_kt, mask=m_n[None, :] & m_d[:, None], other=0.0)            # [BLOCK_D, BLOCK_N]
        b_v = tl.load(p_v, mask=m_n[:, None] & m_d[None, :], other=0.0)              # [BLOCK_N, BLOCK_D]
        rel = o_t[:, None] + shift - o_n[None, :]                                     # [BLOCK_M, BLOCK_N]
        b_s, b_t = score_mods(tl.dot(b_q, b_kt, input_precision=DOT_PRECISION), rel, qk_scale,
                              softcap_scale, softcap2, slope2[:, None], HAS_SOFTCAP, HAS_ALIBI)
        m_s = m_n[None, :] & visible(rel, window_left, window_right, HAS_LEFT, HAS_RIGHT)
        b_s = tl.where(m_s, b_s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        b_p = tl.math.exp2(b_s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(b_p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(b_p.to(b_v.dtype), b_v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
    if PDL == 2:
        gdc_launch_dependents()   # the next kernel may be scheduled; it waits for our completion
    # this split's result: out_s = acc / l, lse_s (base 2) = m + log2 l; an empty split -> 0, -inf
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]                                                       # [BLOCK_M, BLOCK_D]
    lse2 = tl.where(l_i == 0.0, float("-inf"), m_i + tl.math.log2(l_safe))            # [BLOCK_M]
    if SPLIT:
        part0 = pid_bh.to(tl.int64) * rows_total                                      # split 0's rows
        part_step = n_bh.to(tl.int64) * rows_total                                    # rows per split
        part = part0 + pid_s * part_step
        tl.store(LSE_PART + part + o_r, lse2, mask=m_r)
        tl.store(O_PART + (part + o_r[:, None]) * BLOCK_D + o_d[None, :], out, mask=m_r[:, None] & m_d[None, :])
        # every thread's partial stores precede the ticket (a barrier, then a gpu-scope acq_rel
        # atomic), so the program holding the last ticket sees all the splits' partials
        tl.debug_barrier()
        p_ticket = COUNTER + pid_bh * tl.num_programs(2) + pid_m
        ticket = tl.atomic_add(p_ticket, 1, sem="acq_rel", scope="gpu")
        if ticket == num_splits - 1:
            # every split has taken its ticket: reset the counter for the next call that uses it
            # (counters are reused across calls, so no memset per call; see ticket_counters)
            tl.store(p_ticket, 0)
            _merge_splits(O, LSE, O_PART, LSE_PART, part0, part_step, pid_m * BLOCK_M,
                          tl.minimum(BLOCK_M, KV_GROUP * seqlen_q - pid_m * BLOCK_M), off_b, off_hk, nheads,
                          seqlen_q, stride_ob, stride_om, stride_oh, num_splits,
                          KV_GROUP, HEAD_DIM, BLOCK_D, BLOCK_S, S_CHUNK, MERGE_ROWS)
    else:
        p_o = O + off_b * stride_ob + o_t[:, None].to(tl.int64) * stride_om + o_h[:, None] * stride_oh + o_d[None, :]
        tl.store(p_o, out.to(O.dtype.element_ty), mask=m_r[:, None] & m_d[None, :])
        tl.store(LSE + (off_b * nheads + o_h) * seqlen_q + o_t, lse2 * LN2_C, mask=m_r)


# Ticket counters are zero between calls: the program that merges a (batch·kv head, row block)
# resets its counter, so no call needs a memset (a graph node of its own in a captured decode
# step). Eager calls reuse one buffer per (device, stream): calls on a stream run in order. A call
# captured in a CUDA graph gets counters of its own, never handed out again, from an arena zeroed
# outside any graph (at the first eager split call on that device); graphs, or calls within one,
# then never share counters (graphs that share a memory pool must still not be replayed
# concurrently: their partial buffers share memory). Regions are not reclaimed when a graph is
# freed: once the arena is used up (about a million counters, e.g. 2048 captured calls of 512),
# or if nothing ran eagerly before the capture, a captured call zeroes fresh counters (a memset
# in the graph, correct but ~1 µs slower).
_COUNTERS: dict = {}          # (device index, stream handle) -> int32 zeros
_ARENAS: dict = {}            # device index -> [int32 zeros, first free offset]
ARENA_COUNTERS = 1 << 20      # 4 MiB per device
_ARENA_LOCK = threading.Lock()


def ticket_counters(n: int, device) -> torch.Tensor:
    """A buffer of at least n zeroed int32 ticket counters (the launch uses the first n) for a split
    launch on the current stream of `device`, which must be the current device (as for the launch
    itself; ``flash_attn_with_kvcache`` makes it so). The stream's buffer itself, not a slice of it
    (a view per call costs host time)."""
    if device.type != "cuda":
        return torch.zeros(n, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if torch.cuda.is_current_stream_capturing():
        with _ARENA_LOCK:
            arena = _ARENAS.get(index)
            if arena is None or arena[1] + n > arena[0].numel():
                return torch.zeros(n, dtype=torch.int32, device=device)
            start = arena[1]
            arena[1] = start + n
        return arena[0][start: start + n]
    key = (index, torch._C._cuda_getCurrentRawStream(index))  # (the handle, without a Stream object)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        # the old buffer may still be in use by queued kernels of this stream; the allocator
        # reuses its memory only in stream order
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = buf
    if index not in _ARENAS:
        _ARENAS[index] = [torch.zeros(ARENA_COUNTERS, dtype=torch.int32, device=device), 0]
    return buf


_PARTIALS: dict = {}          # (device index, stream handle) -> fp32 buffer for split partials
PARTIALS_MAX = 1 << 22        # floats (16 MiB) kept per stream; a larger launch allocates its own
PARTIALS_STREAMS = 64         # streams with a kept buffer at most (then all are dropped)


def split_partials(n: int, device) -> torch.Tensor:
    """An fp32 buffer of at least n elements for a split launch's partial outputs and LSEs, on the
    current stream of `device` (the current device, as for the launch). Outside a CUDA graph
    capture and up to ``PARTIALS_MAX`` floats it is the stream's own buffer, reused by every split
    launch on that stream (one allocation less per call, host time): launches of one stream run in
    order, and a PDL launch touches no global memory before its ``gdc_wait``, which waits for the
    previous kernel to complete. Otherwise (a capture, whose graph must own its memory; larger
    launches; CPU) a fresh buffer."""
    if device.type != "cuda" or n > PARTIALS_MAX or torch.cuda.is_current_stream_capturing():
        return torch.empty(n, dtype=torch.float32, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch._C._cuda_getCurrentRawStream(index))
    buf = _PARTIALS.get(key)
    if buf is None or buf.numel() < n:
        # (the old buffer may still be read by queued kernels of this stream: the allocator reuses
        # its memory only in stream order)
        size = min(max(n, 2 * (0 if buf is None else buf.numel())), PARTIALS_MAX)
        buf = torch.empty(size, dtype=torch.float32, device=device)
        if len(_PARTIALS) >= PARTIALS_STREAMS:
            # (a caller making a stream per request must not pile up buffers; a dropped one's memory
            # goes back to its stream's pool, reused in that stream's order)
            _PARTIALS.clear()
        _PARTIALS[key] = buf
    return buf


def split_scratch(n: int, n_counters: int, device) -> tuple:
    """``(split_partials(n, device), ticket_counters(n_counters, device))`` with one capture check
    and one stream lookup where the current stream's two buffers already exist and are large
    enough (every eager split call on that stream after its first): the same buffers, less host
    time per decode step. Otherwise the two functions, which make them."""
    if device.type == "cuda" and n <= PARTIALS_MAX and not torch.cuda.is_current_stream_capturing():
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, torch._C._cuda_getCurrentRawStream(index))
        buf, counters = _PARTIALS.get(key), _COUNTERS.get(key)
        if (buf is not None and counters is not None and buf.numel() >= n and counters.numel() >= n_counters
                and index in _ARENAS):
            return buf, counters
    return split_partials(n, device), ticket_counters(n_counters, device)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(batch: int, nheads_k: int, max_seqlen_k: int, device, waves: int = WAVES,
                      full_unsplit: float = 0.0, min_split: int = 256) -> int:
    """Enough (batch, kv head, split) programs for `waves` programs per SM, and at least
    `min_split` keys per split (fewer makes the merge cost more than the parallelism gains).

    full_unsplit > 0: one split when the batch x kv-head programs alone reach that fraction of the
    SMs. For tiles that fill an SM's shared memory (one resident program per SM), a second split
    only adds a second wave and the merge: on the H200 at B=16, Hkv=8 (128 programs, 132 SMs),
    one split read 3.99 / 4.47 TB/s against 3.70 / 4.41 with two (L = 8k / 64k)."""
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device()) \
        if device.type == "cuda" else 8
    if full_unsplit > 0 and batch * nheads_k >= full_unsplit * sms:
        return 1
    want = max(1, (waves * sms) // max(1, batch * nheads_k))
    return int(max(1, min(want, cdiv(max_seqlen_k, min_split), 128)))


@functools.lru_cache(maxsize=None)
def _pdl_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_supported(device) -> bool:
    """A CUDA device of compute capability 9.0 or more (not the interpreter)."""
    if device.type != "cuda" or interpreting():
        return False
    return _pdl_capable(device.index if device.index is not None else torch.cuda.current_device())


def pdl_trigger(device, default: int) -> int:
    """Programmatic dependent launch (PDL) for a split launch: 0 (off) or where the kernel lets the
    next one be scheduled (1, 2, 3: see ``_decode_split``). Off unless the device is a CUDA device
    of compute capability 9.0 or more (Hopper: the ``griddepcontrol`` instructions); there, the
    debug switch ``pdl`` (0-3, ``tileflash.options.DEBUG``) if set, else `default` (the config's ``pdl``).
    With PDL, back-to-back decode calls (e.g. the layers of a captured decode step) overlap each
    launch with the previous kernel's tail; each program still waits for the previous kernel's
    completion before touching memory."""
    if not pdl_supported(device):
        return 0
    return DEBUG.pdl if DEBUG.pdl >= 0 else int(default)


def table_lookup_asm(page_tile: bool, block_n: int) -> bool:
    """Whether a paged cache's block-table lookups go through inline PTX (``_table_load``): for one
    lookup per tile of 64 keys or more. The synchronous lookup then costs little against the tile,
    and the K/V copies stay stages ahead (H200: B=16 L=64k page 256 unsplit
    4.51 TB/s; page 64 at 0.94-0.98x contiguous). 16-key tiles (pages of 16) were 8-38% slower
    with it (each tile waits for its lookup), so they keep Triton's pipelined load."""
    return bool(page_tile) and block_n >= 64


def paged_tiling(page_size: int, block_n: int):
    """(BLOCK_N, PAGE_TILE) for a cache of `page_size`-token pages (0: contiguous).

    A tile that lies inside one page needs one block-table lookup (PAGE_TILE); splits start at
    multiples of BLOCK_N, so that holds when page_size is a multiple of BLOCK_N. Pages of 64 or
    more that are smaller than the tile get tiles of one page (the largest power of two dividing
    the page, down to 64), e.g. page 64 with the GPU's 128-key tiles; smaller or odd pages keep the
    tile and look each key's page up."""
    if page_size <= 0:
        return block_n, False
    if page_size % block_n:
        tile = block_n
        while tile > 64 and page_size % tile:
            tile //= 2
        if page_size % tile == 0 and tile >= 64:
            block_n = tile
    return block_n, page_size % block_n == 0


def pages_per_tile(page_size: int, block_n: int) -> int:
    """With a config's ``multi_page``: how many whole pages a BLOCK_N-key tile covers, one lookup
    each (PAGES_PER_TILE), when a power-of-two page size smaller than the tile divides it; else 1
    (``paged_tiling`` decides)."""
    if 0 < page_size < block_n and block_n % page_size == 0 and page_size & (page_size - 1) == 0:
        return block_n // page_size
    return 1


def long_split_config(block_d: int, page_size: int, split_len: int):
    """The config that replaces ``decode_config(block_d, page_size)`` when its splits would hold
    `split_len` keys each, or None to keep it: pages of 16 at head dims padded to 128 take
    DECODE_CONFIG_PAGE16_LONG beyond LONG_SPLIT keys per split (measured at D=128 only)."""
    if block_d == 128 and page_size == 16 and split_len > LONG_SPLIT:
        return dict(DECODE_CONFIG_PAGE16_LONG)
    return None


ROWS_MAX = 64  # rows per row block of the split kernel


def row_blocks(group: int, seqlen_q: int):
    """(BLOCK_M, row blocks): the G query heads of a kv head x the new tokens, packed as rows, in
    tiles of 16 to ROWS_MAX rows. One tile holds every row up to ROWS_MAX, so the count is
    ``row_block_count``."""
    block_m = min(ROWS_MAX, max(16, next_pow2(group * seqlen_q)))
    return block_m, cdiv(group * seqlen_q, block_m)


def row_block_count(group: int, seqlen_q: int) -> int:
    """``row_blocks(group, seqlen_q)[1]`` without the power of two, which under torch.compile
    would guard on the exact length (a recompile per new seqlen_q)."""
    return cdiv(group * seqlen_q, ROWS_MAX)


# the split kernel indexes its ticket counters, one per (batch·kv head, row block), in int32
TICKETS_MAX = 2 ** 31


def check_grid(n_bh: int, m_blocks: int, num_splits=None) -> bool:
    """Whether batch·kv heads go on grid axis 0 (BH_AXIS0: past GRID_YZ_MAX); raise ValueError
    unless the split kernel's grid fits CUDA's limits: batch·kv heads up to
    2**31 - 1 (on axis 0 past GRID_YZ_MAX, where the splits take axis 1), row blocks up to
    GRID_YZ_MAX, and fewer than TICKETS_MAX (batch·kv heads x row blocks) ticket counters.
    ``flash_attn_with_kvcache`` calls it before it appends (num_splits None: the split count is
    only known in ``decode_forward``), and ``decode_forward`` before the launch."""
    bh_axis0 = n_bh > GRID_YZ_MAX
    if (max((num_splits or 1) if bh_axis0 else n_bh, m_blocks) > GRID_YZ_MAX or n_bh >= 2 ** 31
            or n_bh * m_blocks >= TICKETS_MAX):
        splits = "" if num_splits is None else f" x {num_splits} splits"
        raise ValueError(f"flash_attn_with_kvcache: {n_bh} batch*kv heads{splits} x {m_blocks} row blocks exceed "
                         f"CUDA's grid limits; split the batch or the new tokens into smaller calls")
    return bh_axis0


def decode_forward(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, *, window=(-1, -1), softcap=0.0,
                   alibi_slopes=None, cache_batch_idx=None, block_table=None, num_splits=0, max_seqlen_k=-1,
                   cache_leftpad=None, config=None, seqlen_add=0, need_lse=True):
    """Attention of q (batch, seqlen_q, nheads, d) over the first seqlens_k[b] keys of the cache.

    Returns out (q's shape and dtype) and lse (batch, nheads, seqlen_q) fp32 (None with
    ``need_lse=False`` where the write-only scratch buffer took it: ``utils.lse_scratch``).
    Inputs validated by ``tileflash.interface.flash_attn_with_kvcache``. seqlens_k: int32 (batch,),
    or None when every batch entry holds max_seqlen_k keys (no length tensor to build or read).
    max_seqlen_k (if >= 0) bounds seqlens_k and sizes the splits (a kept plan: rounded up to
    ``LENGTH_BUCKET`` keys). cache_leftpad: int32 (batch,), keys before it are masked (positions
    stay absolute). One launch: the split programs merge their own partials (see
    ``_decode_split``), with ticket counters reused across calls (``ticket_counters``).
    config: dict(block_n, num_warps, num_stages[, waves, min_split, table_asm, reuse_counter,
    multi_page, table_vec, merge_rows, pdl, skew]) overriding ``decode_config`` (and the switch of pages
    of 16 to ``long_split_config`` on long splits, which applies only when config is None), for
    tuning scripts:
    waves and min_split go to
    ``choose_num_splits``; table_asm True/False forces the block-table lookups through inline PTX
    or ``tl.load`` (default: ``table_lookup_asm``); reuse_counter=False zeroes a fresh counter
    buffer per call (the behaviour before the reused buffer, for comparison); multi_page=True lets
    a tile span several whole pages (``pages_per_tile``), table_vec=False keeps their lookups one
    entry per load; merge_rows (a power of two) sets the merge's rows per load; pdl 0-3 sets
    programmatic dependent launch (0 off; 1, 2, 3: see ``_decode_split``; ignored where the GPU
    has no PDL, and overridden by the debug switch ``pdl``; see ``pdl_trigger``); skew 0-3 sets the
    order of each program's tiles (default SKEW at batch > 1, else 0; see ``_decode_split``).
    seqlen_add: added to every entry of seqlens_k in the kernel (the tokens an append just wrote
    after those lengths), so that a decoding step builds no new length tensor; with seqlens_k only.
    """
    if seqlens_k is None and max_seqlen_k < 0:
        raise ValueError("decode_forward: pass seqlens_k, or max_seqlen_k >= 0 as every entry's length")
    if seqlens_k is None and seqlen_add:
        raise ValueError("decode_forward: seqlen_add needs seqlens_k (without it, pass the lengths as max_seqlen_k)")
    paged = block_table is not None
    key = None
    if config is None and alibi_slopes is None and not (paged and block_table.shape[1] == 0):
        # what the plan depends on: layouts, the scalar arguments, which optional tensors are given,
        # the debug switch pdl. max_seqlen_k only sizes the splits, so the key holds it rounded up to
        # LENGTH_BUCKET keys: a decoding loop whose int lengths grow by a token per step makes a plan
        # every LENGTH_BUCKET steps, and the exact length is a per-call argument of the kernel.
        # A contiguous (not paged) cache with an int length bound (max_seqlen_k >= 0) is keyed by
        # its capacity's and strides' classes only (_cache_layout): a loop whose whole cache grows
        # by a token per step (the keys of a dense decode-shaped forward) shares the plan too
        grows = not paged and max_seqlen_k >= 0
        key = _decode_key(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap, cache_batch_idx,
                          block_table, num_splits, max_seqlen_k, cache_leftpad, seqlen_add, grows)
        plan = _DECODE_PLANS.get(key)
        if plan is not None:
            return plan(q, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, None, cache_leftpad,
                        max_seqlen_k if seqlens_k is None else seqlen_add, need_lse)
    # (a kept plan is sized for the bucket's length, and one for a growing cache not capped by this
    # call's capacity; one made for this call alone, for the length itself)
    plan = _plan_decode(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap, alibi_slopes,
                        cache_batch_idx, block_table, num_splits,
                        length_bucket(max_seqlen_k) if key is not None else max_seqlen_k, cache_leftpad, config,
                        uncapped=key is not None and grows)
    if key is not None:
        if len(_DECODE_PLANS) >= 1024:
            _DECODE_PLANS.clear()
        _DECODE_PLANS[key] = plan
    if paged and block_table.shape[1] == 0:  # the one-entry table _plan_decode planned with
        block_table = torch.zeros((q.shape[0], 1), dtype=block_table.dtype, device=block_table.device)
    return plan(q, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, alibi_slopes, cache_leftpad,
                max_seqlen_k if seqlens_k is None else seqlen_add, need_lse)


def _decode_key(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap, cache_batch_idx, block_table,
                num_splits, max_seqlen_k, cache_leftpad, seqlen_add, grows) -> tuple:
    """``decode_forward``'s plan key (see there)."""
    paged = block_table is not None
    return (DEBUG.pdl, q.shape, q.stride(), *_cache_layout(k_cache, v_cache, grows), q.dtype,
            k_cache.dtype, v_cache.dtype, q.device, None if seqlens_k is None else seqlens_k.dtype,
            length_bucket(max_seqlen_k),
            softmax_scale, causal, window, softcap, num_splits, seqlen_add,
            None if cache_batch_idx is None else cache_batch_idx.dtype,
            None if cache_leftpad is None else cache_leftpad.dtype,
            None if not paged else (block_table.shape, block_table.stride(), block_table.dtype,
                                    block_table.data_ptr() % 16 == 0))


def planned_decode(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap, cache_batch_idx,
                   block_table, num_splits, cache_leftpad, seqlen_add, max_seqlen_k=-1):
    """The kept :class:`_DecodePlan` of a ``decode_forward`` call with no ALiBi (arguments as there:
    a length tensor, or none and every entry's key count, at least 1, as max_seqlen_k), or None:
    what ``flash_attn_with_kvcache`` keeps per call signature to call directly
    (``_DecodePlan.__call__``) on later steps. Without a length tensor the plan serves the lengths
    of max_seqlen_k's ``length_bucket`` only."""
    if (seqlens_k is None and max_seqlen_k < 1) or (block_table is not None and block_table.shape[1] == 0):
        return None
    grows = block_table is None and max_seqlen_k >= 0  # (as decode_forward keys it)
    return _DECODE_PLANS.get(_decode_key(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap,
                                         cache_batch_idx, block_table, num_splits, max_seqlen_k, cache_leftpad,
                                         seqlen_add, grows))


_DECODE_PLANS: dict = {}  # decode_forward's key -> _DecodePlan
LENGTH_BUCKET = 256  # the granularity of max_seqlen_k in decode_forward's plans (min_split's default)


def _int_class(x: int) -> tuple:
    """What triton specializes an integer kernel argument on (1 becomes a constant, a multiple of 16
    is marked divisible, the type is i32 or i64 by range): two values of one class run the same
    compiled kernel, so a kept launch may take either as a per-call argument."""
    return x == 1, x % 16 == 0, -2 ** 31 <= x < 2 ** 31


def _cache_layout(k_cache, v_cache, grows: bool) -> tuple:
    """The cache's part of ``decode_forward``'s plan key: its shape and strides, or with ``grows``
    (a contiguous cache with an int length bound) only what does not change as the whole cache
    grows by a token per step: the batch, heads and head dim, and the classes (``_int_class``) of
    the capacity and of every stride (with a (B, H, L, D) cache seen as (B, L, H, D), as
    transformers passes it, the batch and head strides grow with L). The plan then takes them
    per call (``_DecodePlan.__call__``)."""
    if not grows:
        return k_cache.shape, k_cache.stride(), v_cache.stride()
    shape = k_cache.shape
    return ((shape[0], shape[2], shape[3], _int_class(shape[1])), tuple(map(_int_class, k_cache.stride())),
            tuple(map(_int_class, v_cache.stride())))


def length_bucket(n: int) -> int:
    """n (a key count, or -1 for none) rounded up to a multiple of LENGTH_BUCKET."""
    return n if n <= 0 else cdiv(n, LENGTH_BUCKET) * LENGTH_BUCKET


class _DecodePlan:
    """One decode launch, decided once per key (``decode_forward``): the output shapes, the split
    buffers' size and the kernel's :class:`Launch` (its grid, integer arguments, scales and
    constexprs); a call allocates the buffers and launches."""

    __slots__ = ("launch", "lse_shape", "lse_numel", "part_sizes", "n_counters", "scales", "empty", "cache_ints")

    def __call__(self, q, k_cache, v_cache, seqlens_k, cache_batch_idx, block_table, alibi_slopes, cache_leftpad,
                 seqlen_fixed: int, need_lse: bool = True):
        """seqlen_fixed: every entry's key count without a length tensor, else the tokens added to
        each entry of it (``_decode_split``'s seqlen_fixed: not specialized, so any value reuses the
        compiled kernel). need_lse=False: the LSE may go to the write-only scratch buffer, and None
        comes back for it. A plan kept for a growing cache (``_cache_layout``) passes this call's
        cache strides and capacity where they are not the ones it was made with."""
        # (sizes unpacked: torch parses ints faster than a torch.Size, host time per call)
        out = torch.empty(*q.shape, dtype=q.dtype, device=q.device)  # contiguous, as the ops' fake outputs
        lse = None if need_lse else lse_scratch(self.lse_numel, q.device)
        keep = lse is None
        if keep:
            lse = torch.empty(*self.lse_shape, dtype=torch.float32, device=q.device)
        if self.empty:
            return out, (lse if keep else None)
        if self.part_sizes is not None:  # partial outs, then partial LSEs, in one fp32 buffer
            n_o, n_l = self.part_sizes
            if self.n_counters > 0:
                buf, counter = split_scratch(n_o + n_l, self.n_counters, q.device)
            else:
                buf = split_partials(n_o + n_l, q.device)
                counter = torch.zeros(-self.n_counters, dtype=torch.int32, device=q.device)
            o_part, lse_part = buf, buf[n_o:]  # (the partial outs start the buffer: no view for them)
        else:
            o_part = lse_part = counter = None
        ptrs = (q, k_cache, v_cache, out, lse, o_part, lse_part, counter, seqlens_k, cache_batch_idx, block_table,
                alibi_slopes, cache_leftpad)
        ints = self.launch.ints_with(_DECODE_FIXED, seqlen_fixed)
        if self.cache_ints is not None:  # a plan shared by a growing cache (_cache_layout)
            ks, vs, cap = k_cache.stride(), v_cache.stride(), k_cache.shape[1]
            k0, v0, cap0 = self.cache_ints
            if ks != k0 or vs != v0 or cap != cap0:  # this call's strides and capacity (same classes: the key)
                ints = (*ints[:_CACHE_STRIDES], ks[0], ks[1], ks[2], vs[0], vs[1], vs[2],
                        *ints[_CACHE_STRIDES + 6:_CAPACITY], cap, *ints[_CAPACITY + 1:])
        self.launch((), ptrs, self.scales, addresses(*ptrs), ints)
        return out, (lse if keep else None)


# the index of seqlen_fixed among _decode_split's integer arguments (after its 13 pointers), of the
# first of its six cache strides (K's, then V's) and of the capacity (read off the kernel)
_DECODE_FIXED = _decode_split.arg_names.index("seqlen_fixed") - 13
_CACHE_STRIDES = _decode_split.arg_names.index("stride_kb") - 13
_CAPACITY = _decode_split.arg_names.index("capacity") - 13
assert _decode_split.arg_names[13 + _CACHE_STRIDES:13 + _CACHE_STRIDES + 6] == [
    "stride_kb", "stride_kn", "stride_kh", "stride_vb", "stride_vn", "stride_vh"]


def _plan_decode(q, k_cache, v_cache, seqlens_k, softmax_scale, causal, window, softcap, alibi_slopes,
                 cache_batch_idx, block_table, num_splits, max_seqlen_k, cache_leftpad, config, uncapped=False):
    """The :class:`_DecodePlan` of a ``decode_forward`` call (arguments as there; max_seqlen_k sizes
    the splits, the exact lengths come with each call; the plan's seqlen_fixed is a placeholder 0).
    uncapped: split max_seqlen_k keys even where this call's cache holds fewer (a plan shared by a
    growing cache, whose later calls have more)."""
    batch, seqlen_q, nheads, head_dim = q.shape
    nheads_k = k_cache.shape[2]
    group = nheads // nheads_k
    paged = block_table is not None
    cfg = {**decode_config(block_d_for(head_dim), k_cache.shape[1] if paged else 0), **(config or {})}
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    max_k = capacity
    if max_seqlen_k >= 0:
        # split the keys that exist, not the cache's capacity (nor past it, unless the plan is shared)
        max_k = max_seqlen_k if uncapped else min(max_k, max_seqlen_k)
    max_k = max(max_k, 1)
    auto_splits = num_splits <= 0

    def auto_split_count(cfg):
        # the no-split rule was measured with one length for every row (seqlens_k None); with a
        # length tensor the rows may be uneven, and splitting keeps a long row from straggling
        return choose_num_splits(batch, nheads_k, max_k, q.device, waves=cfg.get("waves", WAVES),
                                 min_split=cfg.get("min_split", 256),
                                 full_unsplit=cfg.get("full_unsplit", 0.0) if seqlens_k is None else 0.0)
    if auto_splits:
        num_splits = auto_split_count(cfg)
    long_cfg = (long_split_config(block_d_for(head_dim), k_cache.shape[1], cdiv(max_k, num_splits))
                if config is None and paged else None)
    if long_cfg is not None:
        cfg = long_cfg
        if auto_splits:
            num_splits = auto_split_count(cfg)
    if config is None and cfg["block_n"] == 128 and not cfg.get("multi_page") and cdiv(max_k, num_splits) <= 256:
        cfg = dict(DECODE_CONFIG_SHORT)  # a few tiles per split: 64-key tiles keep more loads in flight
    block_n = 16 if interpreting() else cfg["block_n"]
    ppt = pages_per_tile(k_cache.shape[1], block_n) if paged and cfg.get("multi_page") else 1
    if ppt > 1:
        page_tile = False
    else:
        block_n, page_tile = paged_tiling(k_cache.shape[1] if paged else 0, block_n)
    split_len = cdiv(cdiv(max_k, num_splits), block_n) * block_n
    num_splits = cdiv(max_k, split_len)
    block_m, m_blocks = row_blocks(group, seqlen_q)
    rows_total = m_blocks * block_m
    block_d = block_d_for(head_dim)
    plan = object.__new__(_DecodePlan)
    plan.lse_shape = (batch, nheads, seqlen_q)
    plan.lse_numel = batch * nheads * seqlen_q
    plan.empty = q.numel() == 0
    plan.part_sizes, plan.n_counters, plan.scales, plan.launch, plan.cache_ints = None, 0, (), None, None
    if plan.empty:
        return plan
    split = num_splits > 1
    n_bh = batch * nheads_k
    if split:  # partial outs, then partial LSEs, in one fp32 buffer; tickets reset by the merging programs
        plan.part_sizes = (num_splits * n_bh * rows_total * block_d, num_splits * n_bh * rows_total)
        # (reuse_counter=False: a fresh zeroed buffer per call, marked by a negative count)
        plan.n_counters = n_bh * m_blocks if cfg.get("reuse_counter", True) else -n_bh * m_blocks
    flags, sc, alibi_strides = feature_args(softmax_scale, causal, window, softcap, alibi_slopes, batch, 0.0,
                                            seqlen_q + max_k, seqlen_q + max_k)
    flags.pop("HAS_DROPOUT")
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    block_s = max(2, next_pow2(num_splits))
    # merge: MERGE_ROWS packed rows x S_CHUNK splits x BLOCK_D per load, at most 64 fp32 per thread.
    # All the rows of a block with all their splits in one load when that fits (one round of L2
    # loads), else one row at a time (H200, B=1 L=8k, 16 splits, 4 warps:
    # 17.4 us against 18.1 a row at a time; 32 splits on 2 or 4 warps: rows one at a time were
    # fastest, 23.3 us against 23.9-26.9 for 2 or 4 rows per load in several chunks)
    merge_elems = 64 * 32 * cfg["num_warps"]
    rows_pow2 = next_pow2(min(block_m, group * seqlen_q))
    merge_rows = cfg.get("merge_rows") or (rows_pow2 if rows_pow2 * block_s * block_d <= merge_elems else 1)
    s_chunk = max(1, min(block_s, merge_elems // (block_d * merge_rows)))
    # multi-page tiles of >= 4 pages read their block-table entries 4 per load when the table is
    # int32, its rows hold whole tiles' entries and are 16-byte aligned (see _decode_split)
    table_asm = bool(paged and cfg.get("table_asm", table_lookup_asm(page_tile or ppt > 1, block_n))
                     and not interpreting())
    table_vec = (ppt % 4 == 0 and table_asm and cfg.get("table_vec", True) and block_table.dtype == torch.int32
                 and block_table.shape[1] >= ppt and block_table.shape[1] % ppt == 0 and block_table.stride(1) == 1
                 and block_table.stride(0) % 4 == 0 and block_table.data_ptr() % 16 == 0)
    pdl = pdl_trigger(q.device, cfg.get("pdl", 0))   # the debug switch pdl, if set, wins over the config
    if paged and block_table.shape[1] == 0:
        # no pages: every length clamps to capacity 0, but the pipeliner's prologue still reads
        # entry 0 of a row (see _decode_split), so hand it a one-entry table (such plans are not
        # kept; decode_forward passes such a table to the launch too)
        block_table = torch.zeros((batch, 1), dtype=block_table.dtype, device=block_table.device)
    # batch·kv heads on grid axis 1, or on axis 0 (up to 2**31 - 1) past axis 1's limit
    bh_axis0 = check_grid(n_bh, m_blocks, num_splits)
    grid = (n_bh, num_splits, m_blocks) if bh_axis0 else (num_splits, n_bh, m_blocks)
    out_strides = torch.empty(q.shape, device="meta").stride()  # _DecodePlan's contiguous output
    ints = (q.stride(0), q.stride(1), q.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
            out_strides[0], out_strides[1], out_strides[2],
            block_table.stride(0) if paged else 0, *alibi_strides,
            nheads, nheads_k, seqlen_q, 0, split_len, num_splits,
            k_cache.shape[1] if paged else 1, sc["window_left"], sc["window_right"],
            rows_total, capacity, k_cache.shape[0])
    plan.scales = (softmax_scale * LOG2E, sc["softcap_scale"], sc["softcap2"])
    constexprs = dict(
        KV_GROUP=group, **flags, HAS_BATCH_IDX=cache_batch_idx is not None, PAGED=paged,
        HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, DOT_PRECISION=precision,
        PAGE_TILE=page_tile, HAS_SEQLENS=seqlens_k is not None, SPLIT=split,
        BLOCK_S=block_s, S_CHUNK=s_chunk, MERGE_ROWS=merge_rows, HAS_LEFTPAD=cache_leftpad is not None,
        TABLE_ASM=table_asm,
        PAGES_PER_TILE=ppt, TABLE_VEC=table_vec,
        PDL=pdl, SKEW=cfg.get("skew", SKEW if batch > 1 else 0), num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], launch_pdl=pdl > 0, BH_AXIS0=bh_axis0,
    )
    plan.launch = Launch(_decode_split, grid, (), 13, ints, 3, constexprs)
    if uncapped:  # a plan kept for a growing cache: the strides and capacity it was made with
        plan.cache_ints = (k_cache.stride(), v_cache.stride(), k_cache.shape[1])
    return plan


# ----------------------------------------------------------------------------------------------
# In-place append of new keys/values (flash_attn_with_kvcache with k, v), without a host sync
# ----------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["seqlen_new", "seqlen_fixed"])
def _append_kv(
    K_NEW, V_NEW, K_CACHE, V_CACHE, SEQLENS, BATCH_IDX, BLOCK_TABLE,
    stride_knb, stride_knt, stride_knh, stride_vnb, stride_vnt, stride_vnh,
    stride_kcb, stride_kcs, stride_kch, stride_vcb, stride_vcs, stride_vch, stride_btb,
    seqlen_new, seqlen_fixed, nheads_k, capacity, num_cache, page_size, max_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_SEQLENS: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, PAGED: tl.constexpr,
):
    """New token t of batch row b goes to position p = seqlens[b] + t (seqlen_fixed without a
    length tensor) of that row's cache: page block_table[b, p // page_size], row p % page_size
    (paged), or row p of cache entry batch_idx[b] (contiguous). One program per (b, t) and block
    of BLOCK_H kv heads. Guards instead of host-side checks: a position outside [0, capacity), a
    page or cache entry outside the cache is not written (the rest of the row still is), so bad
    lengths or tables never write outside the cache."""
    pid = tl.program_id(0)
    b = pid // seqlen_new
    t = pid % seqlen_new
    if HAS_SEQLENS:
        pos = tl.load(SEQLENS + b) + t
    else:
        pos = seqlen_fixed + t
    ok = (pos >= 0) & (pos < capacity)
    pos = tl.where(ok, pos, 0)
    if PAGED:
        slot = tl.minimum(pos // page_size, max_blocks - 1)
        row = tl.load(BLOCK_TABLE + b.to(tl.int64) * stride_btb + slot)
        col = pos % page_size
    else:
        if HAS_BATCH_IDX:
            row = tl.load(BATCH_IDX + b)
        else:
            row = b
        col = pos
    ok = ok & (row >= 0) & (row < num_cache)
    row = tl.where(ok, row, 0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)                 # [BLOCK_H]
    offs_d = tl.arange(0, BLOCK_D)                                              # [BLOCK_D]
    n_heads = tl.where(ok, nheads_k, 0)  # (the interpreter rejects a scalar bool &-ed into a block mask)
    mask = (offs_h[:, None] < n_heads) & (offs_d[None, :] < HEAD_DIM)          # [BLOCK_H, BLOCK_D]
    b64, t64, col64 = b.to(tl.int64), t.to(tl.int64), col.to(tl.int64)
    kn = tl.load(K_NEW + b64 * stride_knb + t64 * stride_knt + offs_h[:, None] * stride_knh + offs_d[None, :],
                 mask=mask)
    vn = tl.load(V_NEW + b64 * stride_vnb + t64 * stride_vnt + offs_h[:, None] * stride_vnh + offs_d[None, :],
                 mask=mask)
    tl.store(K_CACHE + row * stride_kcb + col64 * stride_kcs + offs_h[:, None] * stride_kch + offs_d[None, :], kn,
             mask=mask)
    tl.store(V_CACHE + row * stride_vcb + col64 * stride_vcs + offs_h[:, None] * stride_vch + offs_d[None, :], vn,
             mask=mask)


def append_kv(k_cache, v_cache, k, v, seqlens, seqlen_fixed: int, cache_batch_idx=None, block_table=None):
    """Write k/v (batch, seqlen_new, nheads_k, d) into the cache at positions seqlens[b] + t
    (seqlen_fixed + t when seqlens is None), in place, in one launch and without reading any value
    on the host (see ``_append_kv`` for what is done with positions or pages out of range).

    The launch is planned once per layout (``_APPEND_PLANS``: grid, strides, constexprs) and replayed
    through the compiled kernel's launcher; seqlen_fixed, which grows by a token per decoding step,
    is a per-call argument that triton does not specialize on, so a decoding loop reuses one plan."""
    batch, seqlen_new, nheads_k, d = k.shape
    if batch == 0 or seqlen_new == 0 or nheads_k == 0:
        return
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k, v))
    key = _append_key(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table)
    launch = _APPEND_PLANS.get(key)
    if launch is None:
        launch = _plan_append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table)
        if len(_APPEND_PLANS) >= 1024:
            _APPEND_PLANS.clear()
        _APPEND_PLANS[key] = launch
    if launch is _NOTHING:
        return
    replay_append(launch, k_cache, v_cache, k, v, seqlens, seqlen_fixed, cache_batch_idx, block_table)


def _append_key(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table) -> tuple:
    return (k.shape, k.stride(), v.stride(), k_cache.shape, k_cache.stride(), v_cache.stride(), k.dtype,
            k_cache.dtype, k.device, seqlens is None, cache_batch_idx is None,
            None if block_table is None else (block_table.shape, block_table.stride()))


def planned_append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table):
    """The kept append :class:`Launch` of this layout (k and v with unit last strides) that has
    launched before (its compiled launcher kept), or None: for :func:`replay_append`."""
    launch = _APPEND_PLANS.get(_append_key(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table))
    return launch if launch.__class__ is Launch and launch.runner is not None else None


def replay_append(launch, k_cache, v_cache, k, v, seqlens, seqlen_fixed: int, cache_batch_idx, block_table):
    """:func:`append_kv` through a :func:`planned_append` launch (no key, no checks of its own: the
    caller keeps the launch per call signature)."""
    ptrs = (k, v, k_cache, v_cache, seqlens, cache_batch_idx, block_table)
    launch((), ptrs, (), addresses(*ptrs), launch.ints_with(_APPEND_FIXED, seqlen_fixed))


_APPEND_PLANS: dict = {}  # append_kv's key -> Launch, or _NOTHING (a cache with no room: no launch)
_NOTHING = object()
# the index of seqlen_fixed among _append_kv's integer arguments (after its 7 pointers)
_APPEND_FIXED = _append_kv.arg_names.index("seqlen_fixed") - 7


def _plan_append(k_cache, v_cache, k, v, seqlens, cache_batch_idx, block_table):
    """The :class:`Launch` of an ``append_kv`` layout (seqlen_fixed 0 in its ints: the call passes its own)."""
    batch, seqlen_new, nheads_k, d = k.shape
    paged = block_table is not None
    block_d = next_pow2(d)
    block_h = max(1, min(next_pow2(nheads_k), 4096 // block_d))
    grid = (batch * seqlen_new, cdiv(nheads_k, block_h))
    if grid[1] > GRID_YZ_MAX:
        raise ValueError(f"flash_attn_with_kvcache: {nheads_k} kv heads exceed the append kernel's grid")
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if capacity == 0:
        return _NOTHING
    ints = (k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
            v_cache.stride(2), block_table.stride(0) if paged else 0,
            seqlen_new, 0, nheads_k, capacity, k_cache.shape[0], k_cache.shape[1],
            block_table.shape[1] if paged else 1)
    constexprs = dict(HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=block_h, HAS_SEQLENS=seqlens is not None,
                      HAS_BATCH_IDX=cache_batch_idx is not None, PAGED=paged, num_warps=4)
    return Launch(_append_kv, grid, (), 7, ints, 0, constexprs)
