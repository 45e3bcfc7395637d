"""flash_attn_with_kvcache: in-place append, rotary, contiguous and paged caches, split-KV.

The reference rebuilds the expected cache with plain indexing and runs naive attention over each
batch entry's rows; the cache after the call must equal the expected one exactly.
"""

import itertools

import pytest
import torch

import tileflash
from tileflash.ops.utils import apply_rotary
from tileflash.options import DEBUG
from tileflash.reference import attention_ref

from helpers import backend_device, rounding_atol

B, H, D, CAP = 3, 4, 32, 48


def _dtype(dev):
    """float32 on the CPU paths; float16 on the GPU, which rejects float32."""
    return torch.float16 if dev == "cuda" else torch.float32


def _assert_matches(out, q, k, v, fixed_tol, **kw):
    """fp32: max error against fp64 at most `fixed_tol`; fp16: flash-attn's rule, at most twice
    the error of eager attention in fp16 plus the rounding atol."""
    ref, _ = attention_ref(q.cpu().double(), k.cpu().double(), v.cpu().double(), **kw)
    err = (out.cpu().double() - ref).abs().max().item()
    if out.dtype == torch.float32:
        assert err <= fixed_tol, f"err {err:.3g}"
    else:
        ekw = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in kw.items()}
        eager, _ = attention_ref(q.cpu(), k.cpu(), v.cpu(), upcast=False, **ekw)
        bound = 2 * (eager.double() - ref).abs().max().item() + rounding_atol(ref, out.dtype)
        assert err <= bound, f"err {err:.3g} > {bound:.3g}"


def _assert_same(a, b):
    """Two split counts agree: fp32 to 1e-5 relative; fp16 to the output's own rounding."""
    atol = 2e-6 if a.dtype == torch.float32 else rounding_atol(b.double(), a.dtype)
    torch.testing.assert_close(a, b, rtol=1e-5 if a.dtype == torch.float32 else 0, atol=atol)


def _rotary_tables(n, rd, dev):
    inv = 1.0 / (10000 ** (torch.arange(0, rd, 2, dtype=torch.float64) / rd))
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return ang.cos().float().to(dev), ang.sin().float().to(dev)


def _setup(dev, hk, paged, page_size, seed):
    g = torch.Generator().manual_seed(seed)
    dt = _dtype(dev)
    if paged:
        nblocks = B * (CAP // page_size) + 3
        kc = torch.randn(nblocks, page_size, hk, D, generator=g).to(dev, dt)
        vc = torch.randn(nblocks, page_size, hk, D, generator=g).to(dev, dt)
        perm = torch.randperm(nblocks, generator=g)[: B * (CAP // page_size)]
        table = perm.view(B, CAP // page_size).int().to(dev)
    else:
        kc = torch.randn(B + 1, CAP, hk, D, generator=g).to(dev, dt)
        vc = torch.randn(B + 1, CAP, hk, D, generator=g).to(dev, dt)
        table = None
    return kc, vc, table, g


def _rows(cache, b, n, table, batch_idx):
    if table is None:
        cb = b if batch_idx is None else int(batch_idx[b])
        return cache[cb, :n]
    ps = cache.shape[1]
    return torch.cat([cache[int(table[b, j // ps]), j % ps][None] for j in range(n)]) if n else cache[0, :0]


def _expected_cache(kc0, vc0, k, v, sl, table, batch_idx):
    """The caches kc0/vc0 after appending k/v (batch, new, hk, d) of row b at positions sl[b] + t,
    through the page table or cache_batch_idx; nothing else touched."""
    exp_k, exp_v = kc0.clone(), vc0.clone()
    for b in range(k.shape[0] if k is not None else 0):
        for t in range(k.shape[1]):
            j = int(sl[b]) + t
            if table is None:
                cb = b if batch_idx is None else int(batch_idx[b])
                exp_k[cb, j], exp_v[cb, j] = k[b, t], v[b, t]
            else:
                ps = kc0.shape[1]
                exp_k[int(table[b, j // ps]), j % ps], exp_v[int(table[b, j // ps]), j % ps] = k[b, t], v[b, t]
    return exp_k, exp_v


@pytest.mark.parametrize("layout", ["contiguous", "batch_idx", "paged16", "paged6"])
@pytest.mark.parametrize("rotary", [None, "interleaved", "neox"])
@pytest.mark.parametrize("new,causal", [(1, True), (3, True), (3, False), (0, True)])
@pytest.mark.parametrize("hk", [2, 1], ids=["gqa", "mqa"])
def test_kvcache_matches_reference(backend, layout, rotary, new, causal, hk):
    dev = backend_device(backend)
    paged = layout.startswith("paged")
    kc, vc, table, g = _setup(dev, hk, paged, int(layout[5:]) if paged else 0, seed=new * 10 + hk)
    seqlen_q = max(new, 1)
    dt = _dtype(dev)
    q = torch.randn(B, seqlen_q, H, D, generator=g).to(dev, dt)
    k = torch.randn(B, new, hk, D, generator=g).to(dev, dt) if new else None
    v = torch.randn(B, new, hk, D, generator=g).to(dev, dt) if new else None
    cache_seqlens = torch.tensor([5, 0, CAP - new - 1], dtype=torch.int32, device=dev)
    batch_idx = torch.tensor([2, 0, 3], dtype=torch.int32, device=dev) if layout == "batch_idx" else None
    cos = sin = None
    if rotary:
        cos, sin = _rotary_tables(CAP + 4, 16, dev)
    kc0, vc0 = kc.clone(), vc.clone()

    out, lse = tileflash.flash_attn_with_kvcache(
        q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx,
        block_table=table, causal=causal, rotary_interleaved=rotary == "interleaved", num_splits=2,
        return_softmax_lse=True)

    # expected cache: the new (rotated) k/v written at cache_seqlens[b] + t, nothing else touched
    qr = q
    sl = cache_seqlens.long()
    if rotary and new:  # rotary applies only together with an append (flash-attn's rule)
        interleaved = rotary == "interleaved"
        tq = torch.arange(seqlen_q, device=dev) if causal else torch.zeros(seqlen_q, dtype=torch.long, device=dev)
        qr = apply_rotary(q, cos, sin, sl[:, None] + tq[None], interleaved)
        k = apply_rotary(k, cos, sin, sl[:, None] + torch.arange(new, device=dev)[None], interleaved)
    exp_k, exp_v = _expected_cache(kc0, vc0, k, v, sl, table, batch_idx)
    assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v), "cache contents after the append"
    for b in range(B):
        n = int(sl[b]) + new
        kb, vb = _rows(exp_k, b, n, table, batch_idx)[None], _rows(exp_v, b, n, table, batch_idx)[None]
        _assert_matches(out[b:b + 1], qr[b:b + 1], kb, vb, 2e-5, causal=causal)
        _, ref_lse = attention_ref(qr[b:b + 1].cpu().double(), kb.cpu().double(), vb.cpu().double(), causal=causal)
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isinf(lse[b:b + 1].cpu()), ~fin)
        assert (lse[b:b + 1].cpu().double()[fin] - ref_lse[fin]).abs().max().item() <= 1e-4 if fin.any() else True


@pytest.mark.parametrize("layout", ["contiguous", "batch_idx", "paged16", "paged6"])
@pytest.mark.parametrize("new,causal,window", [(0, False, (-1, -1)), (2, True, (-1, -1)), (1, True, (6, -1)),
                                               (2, False, (-1, -1))])
@pytest.mark.parametrize("splits", [1, 3])
def test_kvcache_leftpad(backend, layout, new, causal, window, splits):
    """cache_leftpad: keys before cache_leftpad[b] are ignored, every position stays absolute
    (append at cache_seqlens[b], rotary at cache_seqlens[b] + t, causal aligned to the end), as in
    flash-attn. Leftpads past the first splits leave those splits empty; one row has leftpad =
    cache_seqlens (only the new keys, or none, are visible)."""
    dev = backend_device(backend)
    paged = layout.startswith("paged")
    kc, vc, table, g = _setup(dev, 2, paged, int(layout[5:]) if paged else 0, seed=40 + new)
    dt = _dtype(dev)
    seqlen_q = max(new, 1)
    q = torch.randn(B, seqlen_q, H, D, generator=g).to(dev, dt)
    k = torch.randn(B, new, 2, D, generator=g).to(dev, dt) if new else None
    v = torch.randn(B, new, 2, D, generator=g).to(dev, dt) if new else None
    cache_seqlens = torch.tensor([40, 9, CAP - new - 3], dtype=torch.int32, device=dev)
    leftpad = torch.tensor([35, 9 if new else 4, 20], dtype=torch.int32, device=dev)
    batch_idx = torch.tensor([2, 0, 3], dtype=torch.int32, device=dev) if layout == "batch_idx" else None
    cos, sin = _rotary_tables(CAP + 4, 16, dev)
    rot = dict(rotary_cos=cos, rotary_sin=sin) if new else {}
    kc0, vc0 = kc.clone(), vc.clone()
    out, lse = tileflash.flash_attn_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=cache_seqlens, cache_batch_idx=batch_idx, cache_leftpad=leftpad,
        block_table=table, causal=causal, window_size=window, num_splits=splits, return_softmax_lse=True, **rot)
    sl, lp = cache_seqlens.long(), leftpad.tolist()
    qr = q
    if new:  # rotary at absolute positions, as without left padding
        tq = torch.arange(seqlen_q, device=dev) if causal or window != (-1, -1) else \
            torch.zeros(seqlen_q, dtype=torch.long, device=dev)
        qr = apply_rotary(q, cos, sin, sl[:, None] + tq[None], True)
        k = apply_rotary(k, cos, sin, sl[:, None] + torch.arange(new, device=dev)[None], True)
    exp_k, exp_v = _expected_cache(kc0, vc0, k, v, sl, table, batch_idx)
    assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v), "cache contents after the append"
    for b in range(B):
        n = int(sl[b]) + new
        kb = _rows(exp_k, b, n, table, batch_idx)[lp[b]:][None]
        vb = _rows(exp_v, b, n, table, batch_idx)[lp[b]:][None]
        if kb.shape[1] == 0:  # nothing visible: zeros and lse -inf
            assert torch.equal(out[b].cpu(), torch.zeros_like(out[b].cpu()))
            assert bool((lse[b] == float("-inf")).all())
            continue
        _assert_matches(out[b:b + 1], qr[b:b + 1], kb, vb, 2e-5, causal=causal, window_size=window)
        _, ref_lse = attention_ref(qr[b:b + 1].cpu().double(), kb.cpu().double(), vb.cpu().double(), causal=causal,
                                   window_size=window)
        fin = torch.isfinite(ref_lse)
        assert torch.equal(torch.isinf(lse[b:b + 1].cpu()), ~fin)
        if fin.any():
            assert (lse[b:b + 1].cpu().double()[fin] - ref_lse[fin]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("splits", [1, 2, 5, 0])
def test_num_splits_agree(backend, splits):
    dev = backend_device(backend)
    kc, vc, _, g = _setup(dev, 2, False, 0, seed=3)
    q = torch.randn(B, 1, H, D, generator=g).to(dev, kc.dtype)
    seqlens = torch.tensor([47, 13, 30], dtype=torch.int32, device=dev)
    one = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=1)
    out = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=splits)
    _assert_same(out, one)


def test_bf16_on_cuda_or_interpreter(backend):
    """bf16 caches (the decode dtype of the issue); the interpreter computes bf16 in fp32."""
    dev = backend_device(backend)
    kc, vc, _, g = _setup(dev, 2, False, 0, seed=4)
    kc, vc = kc.bfloat16(), vc.bfloat16()
    q = torch.randn(B, 1, H, D, generator=g).to(dev).bfloat16()
    seqlens = torch.tensor([40, 1, 12], dtype=torch.int32, device=dev)
    out = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens)
    for b in range(B):
        n = int(seqlens[b])
        ref, _ = attention_ref(q[b:b + 1].double().cpu(), kc[b:b + 1, :n].double().cpu(), vc[b:b + 1, :n].double().cpu())
        eager, _ = attention_ref(q[b:b + 1].cpu(), kc[b:b + 1, :n].cpu(), vc[b:b + 1, :n].cpu(), upcast=False)
        err = (out[b:b + 1].cpu().double() - ref).abs().max().item()
        assert err <= 2 * (eager.double() - ref).abs().max().item() + rounding_atol(ref, torch.bfloat16)


_VALUE_CASES = ("overflow", "table_range", "batch_idx_range", "leftpad", "dup_batch_idx", "shared_page",
                "short_rotary")


@pytest.mark.parametrize("bad,err,match", [
    ("overflow", ValueError, "cache overflow"),
    ("table_range", ValueError, "block_table entries must be in"),
    ("batch_idx_range", ValueError, "cache_batch_idx entries must be in"),
    ("seqlens_dtype", TypeError, "cache_seqlens must be int32"),
    ("kv_heads", ValueError, "k must be"),
    ("only_k", ValueError, "both k and v"),
    ("leftpad", ValueError, "cache_leftpad must satisfy"),
    ("leftpad_dtype", TypeError, "cache_leftpad must be int32"),
    ("dtype", TypeError, "cache's dtype"),
    ("cache_stride", ValueError, "unit stride on headdim"),
    ("dup_batch_idx", ValueError, "repeated entries"),
    ("shared_page", ValueError, "same page"),
    ("small_cache", ValueError, "k_cache holds 2 sequences"),
    ("short_rotary", ValueError, "rotary_cos has"),
])
def test_bad_input_leaves_cache_untouched(backend, bad, err, match, monkeypatch):
    """On every device. CUDA reads values inside tensors only with TILEFLASH_CHECK_INPUTS=1 (by
    default it guards in the kernels instead: test_append_kernel_guards), so the value cases set it
    there."""
    dev = backend_device(backend)
    if dev == "cuda" and bad in _VALUE_CASES:
        monkeypatch.setenv("TILEFLASH_CHECK_INPUTS", "1")
    dt = _dtype(dev)
    paged = bad in ("table_range", "shared_page")
    kc, vc, table, g = _setup(dev, 2, paged, 16, seed=5)
    q = torch.randn(B, 2, H, D, generator=g).to(dev, dt)
    k, v = torch.randn(B, 2, 2, D, generator=g).to(dev, dt), torch.randn(B, 2, 2, D, generator=g).to(dev, dt)
    seqlens = torch.tensor([3, 4, 5], dtype=torch.int32, device=dev)
    kw = dict(cache_seqlens=seqlens, block_table=table)
    if bad == "overflow":
        kw["cache_seqlens"] = torch.tensor([3, CAP - 1, 5], dtype=torch.int32, device=dev)
    elif bad == "table_range":
        table[1, 0] = kc.shape[0] + 7
    elif bad == "batch_idx_range":
        kw["cache_batch_idx"] = torch.tensor([0, 1, 9], dtype=torch.int32, device=dev)
    elif bad == "seqlens_dtype":
        kw["cache_seqlens"] = seqlens.long()
    elif bad == "kv_heads":
        k = torch.randn(B, 2, 4, D).to(dev, dt)
    elif bad == "only_k":
        v = None
    elif bad == "leftpad":
        kw["cache_leftpad"] = torch.tensor([0, 5, 2], dtype=torch.int32, device=dev)  # row 1 holds only 4
    elif bad == "leftpad_dtype":
        kw["cache_leftpad"] = torch.zeros(B, dtype=torch.int64, device=dev)
    elif bad == "dtype":
        k = k.double()
    elif bad == "cache_stride":
        kc = torch.randn(B + 1, CAP, D, 2).to(dev, dt).transpose(-1, -2)
    elif bad == "dup_batch_idx":
        kw["cache_batch_idx"] = torch.tensor([0, 1, 1], dtype=torch.int32, device=dev)
    elif bad == "shared_page":
        kw["block_table"] = table = torch.zeros(B, CAP // 16, dtype=torch.int32, device=dev)
        kw["block_table"][:, 1:] = torch.arange(1, CAP // 16).int()
    elif bad == "small_cache":
        kc, vc = kc[:2].clone(), vc[:2].clone()
    elif bad == "short_rotary":
        kw["rotary_cos"], kw["rotary_sin"] = _rotary_tables(6, 16, dev)  # positions up to 6 needed
    kc0, vc0 = kc.clone(), vc.clone()
    with pytest.raises(err, match=match):
        tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0), "a rejected call must not write the cache"


@pytest.mark.parametrize("case", ["plain", "window", "softcap_alibi_causal"])
def test_long_cache_many_splits(backend, case):
    """A cache of 300 keys: several splits even with the GPU's 64-key blocks, one split empty for the
    short sequence, and the running-max rescale across blocks inside a split."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(9)
    cap, b, dt = 300, 3, _dtype(dev)
    kc = torch.randn(b, cap, 2, D, generator=g).to(dev, dt)
    vc = torch.randn(b, cap, 2, D, generator=g).to(dev, dt)
    q = torch.randn(b, 2, H, D, generator=g).to(dev, dt)
    seqlens = torch.tensor([300, 3, 170], dtype=torch.int32, device=dev)
    kw = {"plain": {}, "window": dict(window_size=(40, 0)),
          "softcap_alibi_causal": dict(softcap=6.0, alibi_slopes=torch.rand(H, generator=g).to(dev), causal=True)}[case]
    outs = [tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=ns, **kw)
            for ns in (1, 4)]
    _assert_same(outs[1], outs[0])
    for i in range(b):
        n = int(seqlens[i])
        rkw = {key: (val.cpu() if isinstance(val, torch.Tensor) else val) for key, val in kw.items()}
        _assert_matches(outs[1][i:i + 1], q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], 3e-5, **rkw)


def test_paged_tiling_rule():
    """Which page sizes take one table lookup per tile (PAGE_TILE), for the GPU's 128-key tiles and
    the interpreter's 16-key ones."""
    from tileflash.ops.triton.decode import paged_tiling

    assert paged_tiling(0, 128) == (128, False)  # contiguous
    assert paged_tiling(256, 128) == (128, True) and paged_tiling(128, 128) == (128, True)
    assert paged_tiling(64, 128) == (64, True) and paged_tiling(192, 128) == (64, True)
    assert paged_tiling(16, 128) == (128, False) and paged_tiling(6, 128) == (128, False)
    assert paged_tiling(96, 128) == (128, False)
    assert paged_tiling(16, 16) == (16, True) and paged_tiling(6, 16) == (16, False)


def test_decode_config_rule():
    """The GPU launch config by page size (the H200 sweep's winners) and the tiles that follow."""
    from tileflash.ops.triton.decode import decode_config, pages_per_tile, paged_tiling, table_lookup_asm

    assert decode_config(128)["block_n"] == 128 and decode_config(128, 256)["block_n"] == 128
    # one split when the batch fills the SMs: contiguous, pages of 128·k (whose lookups no longer
    # hold back the K/V pipeline) and tiles of several pages of 16-64; not other pages
    assert decode_config(128).get("full_unsplit", 0) > 0 and decode_config(128, 256) == decode_config(128)
    for page in (16, 32, 64):   # the contiguous config on tiles of several whole pages
        assert decode_config(128, page) == {**decode_config(128), "multi_page": True}, page
        assert pages_per_tile(page, decode_config(128, page)["block_n"]) == 128 // page
    assert not decode_config(128, 192).get("full_unsplit", 0) and not decode_config(128, 8).get("full_unsplit", 0)
    # 128-key tiles fill an SM's shared memory: one wave of programs
    assert decode_config(128)["waves"] == 1
    # inline-PTX table lookups: one per tile (or per page of a tile) of >= 64 keys only
    assert table_lookup_asm(True, 128) and table_lookup_asm(True, 64)
    assert not table_lookup_asm(True, 16) and not table_lookup_asm(False, 128)
    assert decode_config(128, 192)["block_n"] == 64 and decode_config(128, 192)["min_split"] == 512
    assert decode_config(128, 8)["block_n"] == 16 and decode_config(64, 6)["block_n"] == 16
    assert not decode_config(128, 8).get("multi_page") and not decode_config(128, 6).get("multi_page")
    assert decode_config(256, 16) == decode_config(256)  # BLOCK_D 256: one config (shared memory)
    for page in (128, 192, 256):  # these pages get one table lookup per tile
        assert paged_tiling(page, decode_config(128, page)["block_n"])[1], page
    assert not paged_tiling(6, decode_config(128, 6)["block_n"])[1] and not paged_tiling(8, 16)[1]
    assert pages_per_tile(6, 128) == pages_per_tile(256, 128) == pages_per_tile(48, 96) == 1


def test_paged_lookup_keeps_kv_pipelined_sm90():
    """Compiled for sm_90 with the installed triton (no GPU): with TABLE_ASM the block-table lookup
    is a plain ld.global.nc, and a paged cache's K/V tiles get as many shared-memory buffers as a
    contiguous cache's (triton 3.6 pipelined the lookup through tl.load and left the paged K/V
    single-buffered, 73.7 KB against 139 KB). In a subprocess: this one built the interpreter's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = """
import sys
sys.path.insert(0, "tools")
from compile_check import compile_one
from tileflash.ops.triton import decode as DEC
base = dict(KV_GROUP=4, HAS_LEFT=False, HAS_RIGHT=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_BATCH_IDX=False,
            HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=128, DOT_PRECISION="tf32", SPLIT=False)
for name, extra in (("contiguous", dict(PAGED=False)), ("asm", dict(PAGED=True, PAGE_TILE=True, TABLE_ASM=True))):
    k = compile_one(DEC._decode_split, "bf16", dict(base, **extra), 4, 3)
    print(name, k.metadata.shared, k.asm["ptx"].count("ld.global.nc.b32"))
"""
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    got = {ln.split()[0]: [int(x) for x in ln.split()[1:]] for ln in res.stdout.splitlines()}
    assert got["asm"][1] >= 1, got                       # the lookup is the inline load
    assert got["asm"][0] >= got["contiguous"][0], got    # K/V buffered like the contiguous kernel's


def test_pdl_waits_before_any_global_access_sm90(monkeypatch):
    """Compiled for sm_90 with the installed triton (no GPU): with PDL the split kernel's first
    instruction of note is griddepcontrol.wait, before any global load, store or atomic (a PDL
    launch may start while the previous kernel still runs, e.g. the one that wrote q or the
    cache), in every table-lookup variant (the lookups are pure inline PTX, which the compiler
    could in principle hoist); the trigger is where PDL says (1: before any global access, 2:
    after the key loop's last matmul, 3: none, i.e. at exit); without PDL there is no
    griddepcontrol at all. Host side: pdl_trigger is 0 on the CPU; where PDL is supported (faked
    here), the debug switch pdl (TILEFLASH_DEBUG=pdl=N) overrides the config's value and a bad
    value is an error that names the choices. In a subprocess: this one built the interpreter's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = """
import sys
sys.path.insert(0, "tools")
from compile_check import compile_one
from tileflash.ops.triton import decode as DEC
base = dict(KV_GROUP=4, HAS_LEFT=False, HAS_RIGHT=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_BATCH_IDX=False,
            HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=128, DOT_PRECISION="tf32")
paged = dict(SPLIT=True, PAGED=True, TABLE_ASM=True, HAS_SEQLENS=True)
for name, extra in (("split", dict(SPLIT=True, PAGED=False)), ("paged", dict(paged, PAGE_TILE=True)),
                    ("multipage", dict(paged, PAGES_PER_TILE=8)), ("vec", dict(paged, PAGES_PER_TILE=8, TABLE_VEC=True)),
                    ("unsplit", dict(SPLIT=False, PAGED=False))):
    for pdl in (0, 1, 2, 3):
        ptx = compile_one(DEC._decode_split, "bf16", dict(base, PDL=pdl, **extra), 4, 3).asm["ptx"]
        body = ptx[ptx.index(".entry"):]
        marks = [body.find(x) for x in ("griddepcontrol.wait", "griddepcontrol.launch_dependents")]
        first = min(i for i in (body.find(x) for x in ("ld.global", "st.global", "atom.", "red.", "cp.async"))
                    if i >= 0)
        print(name, pdl, *marks, first, body.rfind("mma."))
"""
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                         timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [ln.split() for ln in res.stdout.splitlines()]
    assert len(rows) == 20, res.stdout
    for name, pdl, wait, launch, first, last_mma in rows:
        wait, launch, first, last_mma = int(wait), int(launch), int(first), int(last_mma)
        assert last_mma > first, (name, last_mma, first)
        if pdl == "0":
            assert wait == -1 and launch == -1, (name, wait, launch)
        else:
            assert 0 <= wait < first, (name, pdl, wait, first)
            assert (launch >= 0) == (pdl in ("1", "2")), (name, pdl, launch)
            if pdl == "1":
                assert wait < launch < first, (name, wait, launch, first)
            if pdl == "2":
                assert launch > last_mma, (name, launch, last_mma)

    from tileflash.ops.triton import decode as dec
    assert dec.pdl_trigger(torch.device("cpu"), 2) == 0
    assert dec.decode_config(128)["pdl"] == 2 and dec.decode_config(128, 16)["pdl"] == 2   # see DECODE_CONFIG
    assert dec.decode_config(128, 8)["pdl"] == 0 and dec.decode_config(64)["pdl"] == 0
    monkeypatch.setattr(DEBUG, "pdl", -1)
    monkeypatch.setattr(dec, "pdl_supported", lambda device: True)
    cuda = torch.device("cuda", 0)
    assert dec.pdl_trigger(cuda, 2) == 2 and dec.pdl_trigger(cuda, 0) == 0
    monkeypatch.setattr(DEBUG, "pdl", 0)
    assert dec.pdl_trigger(cuda, 2) == 0
    monkeypatch.setattr(DEBUG, "pdl", 1)
    assert dec.pdl_trigger(cuda, 0) == 1
    from tileflash.options import Debug
    assert Debug.from_env("pdl=3").pdl == 3 and Debug.from_env("").pdl == -1
    with pytest.raises(ValueError, match=r"pdl='yes'.*0 \(off\), 1, 2 or 3"):
        Debug.from_env("pdl=yes")


def test_merge_in_row_and_split_chunks_with_reused_counters(backend, monkeypatch):
    """The in-kernel merge takes MERGE_ROWS packed rows x S_CHUNK splits per load: 32 rows (8 query
    heads x 4 new tokens) over 40 splits, merged in several row chunks and several split chunks
    (uneven last chunk), in row chunks with one split chunk, and by the default rule. The ticket
    counters are one buffer reused across calls: the merging program resets its counter, so the
    buffer must be all zero after each call, and a second call with another split count must
    still merge the right programs."""
    if backend == "tiled":
        pytest.skip("the merge and its tickets are in the Triton kernel")
    from tileflash.ops.triton import decode as dec

    dev = backend_device(backend)
    dt = _dtype(dev)
    g = torch.Generator().manual_seed(77)
    b, hq, hk, d, n, new = 2, 16, 2, 128, 40 * 16, 4
    q = torch.randn(b, new, hq, d, generator=g).to(dev, dt)
    kc = torch.randn(b, n, hk, d, generator=g).to(dev, dt)
    vc = torch.randn(b, n, hk, d, generator=g).to(dev, dt)
    lens = torch.tensor([n, 301], dtype=torch.int32, device=dev)
    if dev == "cpu":  # the interpreter allocates per call; reuse one buffer as the GPU does
        shared = torch.zeros(4096, dtype=torch.int32)
        monkeypatch.setattr(dec, "ticket_counters", lambda count, device: shared[:count])
        buffers = [shared]
    # (splits, merge_rows): 8 row chunks x 3 split chunks (16 + 16 + 8); 4 row chunks x 1 split chunk;
    # the default rule (here one row at a time, all 40 splits per load)
    for splits, merge_rows in ((40, 4), (7, 8), (40, None)):
        out, lse = dec.decode_forward(q, kc, vc, lens, d ** -0.5, True, num_splits=splits,
                                      config=dict(block_n=16, num_warps=4, num_stages=2, merge_rows=merge_rows))
        if dev == "cuda":
            torch.cuda.synchronize()
            buffers = list(dec._COUNTERS.values())
        assert all(int(buf.abs().sum()) == 0 for buf in buffers), "ticket counters not reset"
        for i in range(b):
            m = int(lens[i])
            _assert_matches(out[i:i + 1], q[i:i + 1], kc[i:i + 1, :m], vc[i:i + 1, :m], 3e-5, causal=True)
            _, ref_lse = attention_ref(q[i:i + 1].cpu().double(), kc[i:i + 1, :m].cpu().double(),
                                       vc[i:i + 1, :m].cpu().double(), causal=True)
            assert (lse[i:i + 1].cpu().double() - ref_lse).abs().max().item() <= 1e-4


def test_growing_int_lengths_share_a_plan(backend):
    """A decoding loop with an int cache_seqlens growing by one token per step keeps one decode plan
    per LENGTH_BUCKET keys (the exact length is a per-call kernel argument): every step matches
    the reference, the cache included, and the loop across a bucket boundary makes two plans."""
    if backend == "tiled":
        pytest.skip("the plans are the Triton kernel's launches")
    from tileflash.ops.triton import decode as dec

    dev = backend_device(backend)
    dt = _dtype(dev)
    g = torch.Generator().manual_seed(79)
    cap = dec.LENGTH_BUCKET + 8
    kc, vc = (torch.randn(2, cap, 2, 32, generator=g).to(dev, dt) for _ in range(2))
    exp_k, exp_v = kc.clone(), vc.clone()
    dec._DECODE_PLANS.clear()
    start = dec.LENGTH_BUCKET - 3
    for n in range(start, start + 6):  # lengths after the append: LENGTH_BUCKET - 2 ... + 3
        q = torch.randn(2, 1, 4, 32, generator=g).to(dev, dt)
        k, v = (torch.randn(2, 1, 2, 32, generator=g).to(dev, dt) for _ in range(2))
        out = tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=n, causal=True)
        exp_k[:, n], exp_v[:, n] = k[:, 0], v[:, 0]
        assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v)
        _assert_matches(out, q, exp_k[:, :n + 1], exp_v[:, :n + 1], 3e-5, causal=True)
    assert len(dec._DECODE_PLANS) == 2, sorted(k[11] for k in dec._DECODE_PLANS)
    assert dec.length_bucket(0) == 0 and dec.length_bucket(-1) == -1
    assert dec.length_bucket(1) == dec.length_bucket(dec.LENGTH_BUCKET) == dec.LENGTH_BUCKET


@pytest.mark.parametrize("splits", [1, 5])
def test_seqlen_add_is_added_to_every_length(backend, splits):
    """decode_forward's seqlen_add (the tokens an append wrote after the given lengths) reads
    seqlens_k[b] + seqlen_add keys of entry b: the same bits as passing the summed lengths, split or
    not; and it is refused without a length tensor."""
    if backend == "tiled":
        pytest.skip("decode_forward is the Triton kernel's launcher")
    from tileflash.ops.triton import decode as dec

    dev = backend_device(backend)
    dt = _dtype(dev)
    g = torch.Generator().manual_seed(78)
    q = torch.randn(3, 2, 4, 64, generator=g).to(dev, dt)
    kc, vc = (torch.randn(3, 96, 2, 64, generator=g).to(dev, dt) for _ in range(2))
    lens = torch.tensor([0, 37, 93], dtype=torch.int32, device=dev)
    got = dec.decode_forward(q, kc, vc, lens, 0.125, True, num_splits=splits, seqlen_add=3)
    want = dec.decode_forward(q, kc, vc, lens + 3, 0.125, True, num_splits=splits)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for i, m in enumerate((lens + 3).tolist()):
        _assert_matches(got[0][i:i + 1], q[i:i + 1], kc[i:i + 1, :m], vc[i:i + 1, :m], 3e-5, causal=True)
    with pytest.raises(ValueError, match="seqlen_add needs seqlens_k"):
        dec.decode_forward(q, kc, vc, None, 0.125, True, max_seqlen_k=40, seqlen_add=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (graph capture)")
@pytest.mark.parametrize("arena", [True, False])
def test_captured_calls_own_their_counters(monkeypatch, arena):
    """Calls captured in CUDA graphs take ticket counters from the pre-zeroed arena, one region per
    call, never shared: two graphs of four split calls each, replayed concurrently on two streams
    20 times with their outputs poisoned with NaN before every replay, must give the eager results
    bitwise each time (the merge is deterministic), and leave their counters at zero. Without an
    arena (nothing ran eagerly before the capture) each captured call zeroes fresh counters."""
    from tileflash.ops.triton import decode as dec

    monkeypatch.setattr(dec, "_ARENAS", {})
    monkeypatch.setattr(dec, "_COUNTERS", {})
    g = torch.Generator().manual_seed(5)
    b, hq, hk, d, n, calls = 2, 8, 2, 64, 16384, 4
    q = torch.randn(b, 1, hq, d, generator=g).cuda().half()
    caches = [(torch.randn(b, n, hk, d, generator=g).cuda().half(), torch.randn(b, n, hk, d, generator=g).cuda().half())
              for _ in range(2)]

    def call(i):
        return dec.decode_forward(q, caches[i][0], caches[i][1], None, d ** -0.5, False, num_splits=32,
                                  max_seqlen_k=n)[0]
    want = [call(0), call(1)]
    torch.cuda.synchronize()
    if not arena:
        dec._ARENAS.clear()
    graphs, outs = [], []
    for i in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs.append([call(i) for _ in range(calls)])
        graphs.append(graph)
    dev = torch.cuda.current_device()
    if arena:
        assert dec._ARENAS[dev][1] == 2 * calls * b * hk, "captured calls did not take arena regions"
    else:
        assert not dec._ARENAS
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(20):
        for out in outs:
            for o in out:
                o.fill_(float("nan"))
        for graph, st in zip(graphs, streams):
            st.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(st):
                graph.replay()
        for st in streams:
            torch.cuda.current_stream().wait_stream(st)
        torch.cuda.synchronize()
        for i in range(2):
            for o in outs[i]:
                assert torch.equal(o, want[i])
        if arena:
            assert int(dec._ARENAS[dev][0][: dec._ARENAS[dev][1]].abs().sum()) == 0, "arena counters not reset"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="needs a CUDA GPU with programmatic dependent launch (sm90+)")
@pytest.mark.parametrize("split,page", [(True, 0), (False, 0), (True, 16)])
def test_pdl_chain_reads_the_previous_output(split, page, monkeypatch):
    """Each call's q is the previous call's output, so a PDL launch that read q before the previous
    kernel finished would see stale or NaN values: six chained calls per trigger position (1, 2,
    3), eagerly and replayed from a CUDA graph with the chain's buffers poisoned with NaN before
    every replay, must equal the chain without PDL bit for bit; contiguous, and paged with pages of
    16 (the multi-page tiles and their vector lookups). With the wait compiled out, trigger 1 gave
    300 of 300 (split) and 250 of 300 (unsplit) wrong graph outputs and none eagerly
    (a negative-control run on the H200, eleventh session, run 3)."""
    from tileflash.bench.bench import _to_paged
    from tileflash.ops.triton import decode as dec

    monkeypatch.setattr(DEBUG, "pdl", -1)   # a debug setting would override the configs' pdl

    g = torch.Generator().manual_seed(11)
    b, hq, hk, d, n = 2, 8, 2, 128, 4096
    q0 = torch.randn(b, 1, hq, d, generator=g).cuda().to(torch.bfloat16)
    kc = torch.randn(b, n, hk, d, generator=g).cuda().to(torch.bfloat16)
    vc = torch.randn(b, n, hk, d, generator=g).cuda().to(torch.bfloat16)
    splits = 8 if split else 1
    kw = {}
    if page:
        kc, vc, table = _to_paged(kc, vc, page, torch.Generator().manual_seed(page))
        kw = dict(block_table=table)

    def chain(pdl, q):
        outs = []
        for _ in range(6):
            q = dec.decode_forward(q, kc, vc, None, d ** -0.5, False, num_splits=splits, max_seqlen_k=n,
                                   config={**dec.decode_config(d, page), "pdl": pdl}, **kw)[0]
            outs.append(q)
        return outs

    want = chain(0, q0)
    for pdl in (1, 2, 3):
        got = chain(pdl, q0)
        assert all(torch.equal(a, w) for a, w in zip(got, want)), f"eager chain, pdl={pdl}"
        qin = q0.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = chain(pdl, qin)
        for _ in range(5):
            for o in outs:
                o.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            assert all(torch.equal(a, w) for a, w in zip(outs, want)), f"graph chain, pdl={pdl}"


def test_choose_num_splits_rule():
    """Splits fill `waves` programs per SM (8 stand-in SMs off CUDA), at least 256 keys each (512
    for pages of 64); with full_unsplit, a batch whose (batch, kv head) programs already fill the
    SMs is not split."""
    from tileflash.ops.triton.decode import choose_num_splits, decode_config

    cpu = torch.device("cpu")
    assert choose_num_splits(1, 2, 8192, cpu, waves=2) == 8       # 16 programs / 2 kv heads
    assert choose_num_splits(1, 2, 1000, cpu, waves=2) == 4       # capped at 256 keys per split
    assert choose_num_splits(1, 8, 8192, cpu, waves=2) == 2
    assert choose_num_splits(1, 8, 8192, cpu, waves=2, full_unsplit=0.9) == 1   # 8 programs fill 8 SMs
    assert choose_num_splits(1, 4, 8192, cpu, waves=2, full_unsplit=0.9) == 4   # 4 do not
    assert choose_num_splits(1, 1, 8192, cpu, waves=8) == 32                     # 64 wanted, 256 keys each
    assert choose_num_splits(1, 1, 8192, cpu, waves=8, min_split=512) == 16      # pages of 64·k (not 128·k or 16-64): 512 keys
    assert decode_config(128, 192)["min_split"] == 512 and "min_split" not in decode_config(128)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("cap", [160, 592])
def test_skewed_tile_order(backend, paged, cap):
    """Every tile order (SKEW 0: in order; 1, 2: rotated by program or by batch entry, wrapping
    around; 3: every 37th tile, or every tile where 37 divides the count) against the reference:
    uneven lengths (a partial last tile, which the rotation puts mid-loop; an empty row), a
    left-pad, a causal window over several new tokens, one and three splits; cap 592 gives the
    interpreter's 16-key tiles 37 per unsplit row (SKEW 3's fallback). The orders agree to the
    output's rounding."""
    if backend == "tiled":
        pytest.skip("the Triton kernel's tile order")
    from tileflash.ops.triton import decode as dec

    dev = backend_device(backend)
    dt = _dtype(dev)
    g = torch.Generator().manual_seed(31 + paged + cap)
    b, hq, hk, d, sq, page = 4, 4, 2, 64, 3, 16
    kc = torch.randn(b, cap, hk, d, generator=g).to(dev, dt)
    vc = torch.randn(b, cap, hk, d, generator=g).to(dev, dt)
    q = torch.randn(b, sq, hq, d, generator=g).to(dev, dt)
    lens = torch.tensor([cap, 77, 0, cap - 29], dtype=torch.int32, device=dev)
    pad = torch.tensor([0, 5, 0, 40], dtype=torch.int32, device=dev)
    kw = {}
    if paged:
        kp, vp, table = _shuffled_pool(kc, vc, page, g)
        kw = dict(block_table=table)
    for ns, causal, window, leftpad in [(1, False, (-1, -1), None), (3, False, (-1, -1), pad), (1, True, (40, 0), None),
                                        (3, True, (-1, -1), pad)]:
        outs = []
        for skew in (0, 1, 2, 3):
            cfg = {**dec.decode_config(d, page if paged else 0), "skew": skew}
            out, lse = dec.decode_forward(q, kp if paged else kc, vp if paged else vc, lens, d ** -0.5, causal,
                                          window=window, num_splits=ns, cache_leftpad=leftpad, config=cfg, **kw)
            outs.append(out)
            for i in range(b):
                lo, n = (0 if leftpad is None else int(leftpad[i])), int(lens[i])
                if n == 0:
                    assert torch.equal(out[i].cpu(), torch.zeros_like(out[i].cpu()))
                    continue
                _assert_matches(out[i:i + 1], q[i:i + 1], kc[i:i + 1, lo:n], vc[i:i + 1, lo:n], 3e-5,
                                causal=causal, window_size=window)
        for o in outs[1:]:
            _assert_same(o, outs[0])


def test_long_split_config_rule():
    """Pages of 16 at head dims padded to 128 switch to two programs per SM of 64-key tiles of 4
    pages when the one-wave splits would exceed LONG_SPLIT keys; nothing else switches."""
    from tileflash.ops.triton import decode as dec

    long = dec.long_split_config(128, 16, dec.LONG_SPLIT + 1)
    assert long == dec.DECODE_CONFIG_PAGE16_LONG and long is not dec.DECODE_CONFIG_PAGE16_LONG
    assert long["block_n"] == 64 and long["waves"] == 2 and long["multi_page"] and long["pdl"] == 0
    assert dec.pages_per_tile(16, long["block_n"]) == 4      # one 16-byte lookup per tile
    assert dec.long_split_config(128, 16, dec.LONG_SPLIT) is None
    for block_d, page in ((128, 0), (128, 32), (128, 64), (128, 256), (64, 16), (256, 16), (128, 8)):
        assert dec.long_split_config(block_d, page, 1 << 20) is None, (block_d, page)


def test_long_split_config_is_taken(monkeypatch):
    """decode_forward asks long_split_config with the one-wave split length of a paged call, takes
    its config (and the split count for its waves) without an explicit config, and never asks
    with one. Records what the kernel launch receives instead of launching it."""
    from tileflash.ops.triton import decode as dec

    seen = []

    class Launch:
        def __getitem__(self, grid):
            def run(*args, **kw):
                seen.append((grid, kw["BLOCK_N"], kw["num_warps"], kw["PAGES_PER_TILE"]))
            return run
    monkeypatch.setattr(dec, "_decode_split", Launch())
    monkeypatch.setattr(dec, "interpreting", lambda: False)       # the GPU's tiles, not 16 keys
    monkeypatch.setattr(dec, "pdl_trigger", lambda device, default: 0)
    q = torch.randn(1, 1, 4, 128)
    kp = torch.randn(600, 16, 1, 128)
    table = torch.arange(512, dtype=torch.int32).view(1, 512)       # 8192 keys
    dec.decode_forward(q, kp, kp, None, 0.1, False, block_table=table, max_seqlen_k=8192)
    # CPU stand-in: 8 SMs; one wave of 1 kv head gives 8 splits of 1024 keys: no switch
    assert seen[-1][0][0] == 8 and seen[-1][1:] == (128, 4, 8)
    kp = torch.randn(4200, 16, 1, 128)
    table = torch.arange(4096, dtype=torch.int32).view(1, 4096)     # 65536 keys: 8192 per split
    dec.decode_forward(q, kp, kp, None, 0.1, False, block_table=table, max_seqlen_k=65536)
    assert seen[-1][0][0] == 16 and seen[-1][1:] == (64, 4, 4)       # two waves of 64-key tiles
    dec.decode_forward(q, kp, kp, None, 0.1, False, block_table=table, max_seqlen_k=65536, num_splits=3)
    assert seen[-1][0][0] == 3 and seen[-1][1:] == (64, 4, 4)        # the caller's split count stays
    dec.decode_forward(q, kp, kp, None, 0.1, False, block_table=table, max_seqlen_k=65536,
                       config=dec.decode_config(128, 16))
    assert seen[-1][1:] == (128, 4, 8)                               # an explicit config wins


def _shuffled_pool(kc, vc, page, g):
    """The contiguous cache (b, cap, hk, d) as pages of `page` rows scattered over a pool with 3
    spare pages of random values: (k pool, v pool, int32 block table (b, cap // page))."""
    b, cap, hk, d = kc.shape
    nb = cap // page
    perm = torch.randperm(b * nb + 3, generator=g)[: b * nb]
    kp = torch.randn(b * nb + 3, page, hk, d, generator=g).to(kc.device, kc.dtype)
    vp = torch.randn(b * nb + 3, page, hk, d, generator=g).to(kc.device, kc.dtype)
    kp[perm.to(kc.device)] = kc.reshape(b * nb, page, hk, d)
    vp[perm.to(kc.device)] = vc.reshape(b * nb, page, hk, d)
    return kp, vp, perm.view(b, nb).int().to(kc.device)


@pytest.mark.parametrize("page", [6, 16, 64, 128, 256])
def test_paged_page_sizes_match_contiguous(backend, page):
    """Every page size against the same keys in a contiguous cache (see test_paged_tiling_rule for
    which sizes take one table lookup per tile). Uneven lengths end mid-page and mid-tile; one
    and three splits."""
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(page)
    b, hk, cap, dt = 2, 2, 768, _dtype(dev)  # 768 = 3 pages of 256, 128 pages of 6
    kc = torch.randn(b, cap, hk, D, generator=g).to(dev, dt)
    vc = torch.randn(b, cap, hk, D, generator=g).to(dev, dt)
    q = torch.randn(b, 1, H, D, generator=g).to(dev, dt)
    seqlens = torch.tensor([cap - 5, 200], dtype=torch.int32, device=dev)
    kp, vp, table = _shuffled_pool(kc, vc, page, g)
    for ns in (1, 3):
        got = tileflash.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=seqlens, block_table=table, num_splits=ns)
        want = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, num_splits=ns)
        _assert_same(got, want)
        for i in range(b):
            n = int(seqlens[i])
            _assert_matches(got[i:i + 1], q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n], 3e-5)


@pytest.mark.parametrize("page", [4, 8, 16, 32, 64])
def test_multi_page_tiles_match_contiguous(backend, page):
    """Tiles that span several whole pages (config multi_page: one lookup per page; the GPU tiles
    are 128 keys, so every page size here runs there; the interpreter's are 16 keys, so pages 4
    and 8 run there) against the same keys in a contiguous cache and the reference: uneven
    lengths ending mid-page, a cache left-pad (its skip must keep tiles on page boundaries), one
    and three splits. Three block tables: int32 with whole tiles per row (on the GPU, 4 entries
    per load when a tile has 4 or more pages), the same with one spare column (one entry per
    load), and int64 (one entry per load: a 16-byte load would take an int64 entry for two)."""
    if backend == "tiled":
        pytest.skip("multi-page tiles are a Triton kernel tiling")
    from tileflash.ops.triton import decode as dec

    dev = backend_device(backend)
    block_n = 16 if dev != "cuda" else 128
    if dec.pages_per_tile(page, block_n) < 2:
        pytest.skip(f"a page of {page} is not several pages of a {block_n}-key tile")
    g = torch.Generator().manual_seed(100 + page)
    b, hq, hk, d, cap, dt = 2, 8, 2, 64, 768, _dtype(dev)
    kc = torch.randn(b, cap, hk, d, generator=g).to(dev, dt)
    vc = torch.randn(b, cap, hk, d, generator=g).to(dev, dt)
    q = torch.randn(b, 1, hq, d, generator=g).to(dev, dt)
    seqlens = torch.tensor([cap - 5, 200 + page // 2], dtype=torch.int32, device=dev)
    leftpad = torch.tensor([0, 3 * page + 1], dtype=torch.int32, device=dev)
    kp, vp, table = _shuffled_pool(kc, vc, page, g)
    spare = torch.cat([table, table[:, :1]], 1)            # width nb + 1: not whole tiles per row
    tables = (table, spare, table.long())
    # the contiguous config's tiles (16 keys in the interpreter); on the GPU also the 64-key
    # tiles that pages of 16 take on long splits (long_split_config)
    cfgs = [{**dec.decode_config(d), "multi_page": True}]
    if dev == "cuda" and dec.pages_per_tile(page, dec.DECODE_CONFIG_PAGE16_LONG["block_n"]) >= 2:
        cfgs.append(dict(dec.DECODE_CONFIG_PAGE16_LONG))
    runs = [(1, None, t) for t in tables] + [(3, None, table), (1, leftpad, table), (3, leftpad, spare)]
    for cfg, (ns, pad, tab) in itertools.product(cfgs, runs):
        # max_seqlen_k: the same split boundaries for every table width and the contiguous cache
        got = dec.decode_forward(q, kp, vp, seqlens, d ** -0.5, False, block_table=tab, num_splits=ns,
                                 cache_leftpad=pad, config=cfg, max_seqlen_k=cap)[0]
        want = dec.decode_forward(q, kc, vc, seqlens, d ** -0.5, False, num_splits=ns, cache_leftpad=pad,
                                  config=dec.decode_config(d), max_seqlen_k=cap)[0]
        assert not torch.isnan(got).any()
        _assert_same(got, want)
        for i in range(b):
            lo, n = (0 if pad is None else int(pad[i])), int(seqlens[i])
            _assert_matches(got[i:i + 1], q[i:i + 1], kc[i:i + 1, lo:n], vc[i:i + 1, lo:n], 3e-5)


def test_zero_width_block_table(backend):
    """A block table with no columns (a cache of capacity 0): every row attends to nothing, so
    the output is 0 and the LSE -inf (the kernel is handed a one-entry table, since its pipeliner
    reads a row's first entry before any bound check)."""
    if backend == "tiled":
        pytest.skip("the Triton kernel's table handling")
    from tileflash.ops.triton import decode as dec

    dev = backend_device(backend)
    dt = _dtype(dev)
    q = torch.randn(2, 1, 4, 64).to(dev, dt)
    kp = torch.randn(3, 16, 2, 64).to(dev, dt)
    table = torch.zeros((2, 0), dtype=torch.int32, device=dev)
    for ns in (1, 2):
        out, lse = dec.decode_forward(q, kp, kp, torch.tensor([5, 0], dtype=torch.int32, device=dev), 0.125, False,
                                      block_table=table, num_splits=ns)
        assert torch.equal(out.cpu(), torch.zeros_like(out.cpu()))
        assert bool((lse == float("-inf")).all())


@pytest.mark.parametrize("n", [0, 1, 29, CAP])
@pytest.mark.parametrize("splits", [1, 3])
def test_int_cache_seqlens(backend, n, splits):
    """An int cache_seqlens (one length for every row, handed to the kernel as a scalar, with no
    length tensor) against the same length as a tensor and the reference. No keys: zeros, lse -inf.
    The same call twice must agree bitwise (on the GPU the second call reuses the counters that the
    first call's merging programs reset; off the GPU the counters are fresh per call)."""
    dev = backend_device(backend)
    kc, vc, _, g = _setup(dev, 2, False, 0, seed=11 + n)
    q = torch.randn(B, 1, H, D, generator=g).to(dev, kc.dtype)
    out, lse = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n, num_splits=splits,
                                                 return_softmax_lse=True)
    again, _ = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=n, num_splits=splits,
                                                 return_softmax_lse=True)
    assert torch.equal(out, again)
    lens = torch.full((B,), n, dtype=torch.int32, device=dev)
    out_t, lse_t = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits,
                                                     return_softmax_lse=True)
    _assert_same(out, out_t)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_t))
    if n == 0:
        assert torch.equal(out.cpu(), torch.zeros_like(out.cpu())) and bool((lse == float("-inf")).all())
        return
    torch.testing.assert_close(lse, lse_t, rtol=0, atol=1e-5)
    for b in range(B):
        _assert_matches(out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], 2e-5)


def test_int_cache_seqlens_append(backend):
    """An append with an int cache_seqlens writes at that position in every row, as the tensor form."""
    dev = backend_device(backend)
    kc, vc, _, g = _setup(dev, 2, False, 0, seed=21)
    q = torch.randn(B, 2, H, D, generator=g).to(dev, kc.dtype)
    k = torch.randn(B, 2, 2, D, generator=g).to(dev, kc.dtype)
    v = torch.randn(B, 2, 2, D, generator=g).to(dev, kc.dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    out = tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=7, causal=True, num_splits=2)
    lens = torch.full((B,), 7, dtype=torch.int32, device=dev)
    want = tileflash.flash_attn_with_kvcache(q, kc2, vc2, k, v, cache_seqlens=lens, causal=True, num_splits=2)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    assert torch.equal(kc[:B, 7:9], k) and torch.equal(vc[:B, 7:9], v)
    _assert_same(out, want)


def test_split_merge_under_concurrency(backend):
    """Many splits racing for the merge ticket on a GPU: every repeat equals the first bitwise, and
    matches one split. (On CPU the programs run one after another, so there is no race to test.)"""
    if backend != "cuda":
        pytest.skip("the ticket race needs programs running concurrently (GPU)")
    dev = backend_device(backend)
    g = torch.Generator().manual_seed(5)
    b, hk, cap = 4, 2, 8192
    kc = torch.randn(b, cap, hk, D, generator=g).to(dev, torch.float16)
    vc = torch.randn(b, cap, hk, D, generator=g).to(dev, torch.float16)
    q = torch.randn(b, 1, H, D, generator=g).to(dev, torch.float16)
    lens = torch.tensor([cap, 5000, 130, 0], dtype=torch.int32, device=dev)
    one = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=1)
    first = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=64)
    for _ in range(20):
        assert torch.equal(tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=64), first)
    _assert_same(first, one)
    assert torch.equal(first[3].cpu(), torch.zeros_like(first[3].cpu()))


def test_long_chunk_spans_several_row_blocks(backend):
    """A 40-token chunk with 2 query heads per kv head: 80 packed rows, two 64-row blocks."""
    dev = backend_device(backend)
    kc, vc, _, g = _setup(dev, 2, False, 0, seed=10)
    q = torch.randn(B, 40, H, D, generator=g).to(dev, kc.dtype)
    k = torch.randn(B, 40, 2, D, generator=g).to(dev, kc.dtype)
    v = torch.randn(B, 40, 2, D, generator=g).to(dev, kc.dtype)
    seqlens = torch.tensor([0, 3, 7], dtype=torch.int32, device=dev)
    out = tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seqlens, causal=True, num_splits=2)
    for b in range(B):
        n = int(seqlens[b]) + 40
        _assert_matches(out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], 3e-5, causal=True)


def test_kernel_clamps_unchecked_indices(backend):
    """A read-only call on CUDA does not read cache_seqlens / block_table on the host (no sync), so
    the kernel clamps them: bad entries in one row must not touch memory outside the cache nor
    change the other rows. Called below the interface, where nothing is checked."""
    if backend == "tiled":
        pytest.skip("the clamping is in the Triton kernel")
    from tileflash.ops.triton.decode import decode_forward

    dev = backend_device(backend)
    kc, vc, table, g = _setup(dev, 2, True, 16, seed=12)
    q = torch.randn(B, 1, H, D, generator=g).to(dev, kc.dtype)
    table = table.clone()
    table[1, 0], table[2, 1] = 10 ** 6, -5                       # out of range, both ways
    seqlens = torch.tensor([30, 20, 10 ** 6], dtype=torch.int32, device=dev)  # row 2 longer than the cache
    out, lse = decode_forward(q, kc, vc, seqlens, D ** -0.5, False, block_table=table)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    kb, vb = _rows(kc, 0, 30, table, None)[None], _rows(vc, 0, 30, table, None)[None]
    _assert_matches(out[:1], q[:1], kb, vb, 2e-5)


def test_value_check_policy(monkeypatch):
    """When flash_attn_with_kvcache reads values on the host (a sync on CUDA): CPU always (a
    read-only call not while tracing); CUDA never by default, appends included (flash-attn's rule)."""
    from tileflash.interface import _kvcache_checks_values as checks

    monkeypatch.delenv("TILEFLASH_CHECK_INPUTS", raising=False)
    assert checks("cpu", 1, False, False) and checks("cpu", 1, False, True)     # CPU appends: always
    assert checks("cpu", 0, True, True)                                         # CPU rotary: always
    assert checks("cpu", 0, False, False) and not checks("cpu", 0, False, True)  # read-only CPU, not traced
    for args in ((0, False, False), (1, False, False), (1, False, True), (0, True, False)):
        assert not checks("cuda", *args)                                        # CUDA: no sync


def test_value_check_policy_env(monkeypatch):
    from tileflash.interface import _kvcache_checks_values as checks

    monkeypatch.setenv("TILEFLASH_CHECK_INPUTS", "1")
    assert checks("cuda", 0, False, False) and not checks("cuda", 0, False, True)
    assert checks("cuda", 1, False, False) and checks("cuda", 1, False, True)


@pytest.mark.parametrize("paged", [False, True])
def test_append_kernel_guards(backend, paged):
    """The append kernel (below the interface, where nothing is checked) writes exactly the valid
    positions: a row whose lengths overflow keeps the tokens that fit, negative lengths, pages or
    cache entries out of range write nothing, and no byte outside those positions changes."""
    if backend == "tiled":
        pytest.skip("the guards are in the Triton kernel")
    from tileflash.ops import route

    dev = backend_device(backend)
    kc, vc, table, g = _setup(dev, 2, paged, 16, seed=21)
    new = 3
    k = torch.randn(B, new, 2, D, generator=g).to(dev, kc.dtype)
    v = torch.randn(B, new, 2, D, generator=g).to(dev, kc.dtype)
    seqlens = torch.tensor([4, CAP - 1, -2], dtype=torch.int32, device=dev)  # row 1 overflows, row 2 < 0
    batch_idx = None
    if paged:
        table = table.clone()
        table[0, 0] = 10 ** 6  # row 0's first page is out of range (positions 4..6 live in it)
    else:
        batch_idx = torch.tensor([0, 1, 7], dtype=torch.int32, device=dev)  # entry 7 does not exist
    kc0, vc0 = kc.clone(), vc.clone()
    route.kvcache_append(kc, vc, k, v, seqlens, 0, batch_idx, table)
    exp_k, exp_v = kc0.clone(), vc0.clone()
    for b, start in enumerate(seqlens.tolist()):
        for t in range(new):
            pos = start + t
            if not 0 <= pos < CAP:
                continue
            if paged:
                page = int(table[b, pos // 16])
                if not 0 <= page < kc.shape[0]:
                    continue
                exp_k[page, pos % 16], exp_v[page, pos % 16] = k[b, t], v[b, t]
            else:
                row = b if batch_idx is None else int(batch_idx[b])
                if not 0 <= row < kc.shape[0]:
                    continue
                exp_k[row, pos], exp_v[row, pos] = k[b, t], v[b, t]
    assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v)
    assert not torch.equal(kc, kc0), "the valid positions must have been written"


@pytest.mark.parametrize("lengths", ["int", "tensor"])
def test_decode_loop_reuses_its_checks_and_plans(lengths):
    """A decoding loop (one appended token per step, lengths growing) checks its call signature
    once (``interface._KV_PREPARED``) and plans its append once (``decode._APPEND_PLANS``, the
    int length passed per launch); every step still matches the reference, cache included. A
    changed call after that is checked in full: a wrong k shape and an int length that overflows
    the cache raise ValueError and leave the cache untouched."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tileflash import interface
    from tileflash.ops.triton import decode

    dev, dt = "cuda", torch.float16
    kc, vc, _, g = _setup(dev, 2, False, 16, seed=31)
    exp_k, exp_v = kc.clone(), vc.clone()
    interface._KV_PREPARED.clear()
    decode._APPEND_PLANS.clear()
    decode._DECODE_PLANS.clear()
    for i in range(6):
        q = torch.randn(B, 1, H, D, generator=g).to(dev, dt)
        k, v = torch.randn(B, 1, 2, D, generator=g).to(dev, dt), torch.randn(B, 1, 2, D, generator=g).to(dev, dt)
        pos = [5 + i] * B if lengths == "int" else [5 + i, 17 + i, 30 + i]
        sl = pos[0] if lengths == "int" else torch.tensor(pos, dtype=torch.int32, device=dev)
        out = torch.full_like(q, float("nan"))
        out.copy_(tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=sl, causal=True))
        for b in range(B):
            exp_k[b, pos[b]], exp_v[b, pos[b]] = k[b, 0], v[b, 0]
        assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v), f"step {i}: the cache"
        for b in range(B):
            n = pos[b] + 1
            _assert_matches(out[b:b + 1], q[b:b + 1], exp_k[b:b + 1, :n], exp_v[b:b + 1, :n], 0, causal=True)
    assert len(interface._KV_PREPARED) == 1, "one signature for the whole loop"
    assert len(decode._APPEND_PLANS) == 1, "one append plan for the whole loop"
    assert len(decode._DECODE_PLANS) == 1, "one decode plan for the whole loop (int lengths: per length bucket)"
    with pytest.raises(ValueError, match="must be \\(batch, seqlen_new, nheads_k, headdim\\)"):
        tileflash.flash_attn_with_kvcache(q, kc, vc, k[:, :, :1], v[:, :, :1], cache_seqlens=sl, causal=True)
    if lengths == "int":
        with pytest.raises(ValueError, match="cache overflow"):
            tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=CAP, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v), "a refused call wrote into the cache"


@pytest.mark.parametrize("lengths", ["tensor", "int"])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("append", [False, True])
def test_decode_steps_replay_their_kept_launches(paged, append, lengths):
    """With a length tensor or an int length (one length bucket here), a repeated decoding step
    replays its kept append and decode launches
    (``interface._KV_FAST`` -> ``route.replay_kvcache``) without the other layers: every replayed
    step matches the reference and the cache holds exactly the appended tokens; the LSE comes back
    when asked for; a changed debug switch (pdl) or another signature takes the full path."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tileflash import interface
    from tileflash.ops import route

    dev, dt = "cuda", torch.float16
    kc, vc, table, g = _setup(dev, 2, paged, 16, seed=37)
    exp_k, exp_v = kc.clone(), vc.clone()
    interface._KV_FAST.clear()
    replays = []
    real = route.replay_kvcache
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(route, "replay_kvcache", lambda *a: replays.append(1) or real(*a))
        for i in range(5):
            q = torch.randn(B, 1, H, D, generator=g).to(dev, dt)
            k, v = (torch.randn(B, 1, 2, D, generator=g).to(dev, dt) for _ in range(2))
            pos = [5 + i, 17 + i, 30 + i] if lengths == "tensor" else [20 + i] * B
            sl = torch.tensor(pos, dtype=torch.int32, device=dev) if lengths == "tensor" else pos[0]
            kw = dict(cache_seqlens=sl, causal=True, block_table=table, return_softmax_lse=i % 2 == 1)
            res = tileflash.flash_attn_with_kvcache(q, kc, vc, *((k, v) if append else ()), **kw)
            out, lse = res if i % 2 == 1 else (res, None)
            assert len(replays) == i, f"step {i}: steps after the first replay"
            n_new = 1 if append else 0
            if append:
                for b in range(B):
                    if table is None:
                        exp_k[b, pos[b]], exp_v[b, pos[b]] = k[b, 0], v[b, 0]
                    else:
                        page, row = int(table[b, pos[b] // 16]), pos[b] % 16
                        exp_k[page, row], exp_v[page, row] = k[b, 0], v[b, 0]
            assert torch.equal(kc, exp_k) and torch.equal(vc, exp_v), f"step {i}: the cache"
            for b in range(B):
                n = pos[b] + n_new
                keys, vals = _rows(exp_k, b, n, table, None), _rows(exp_v, b, n, table, None)
                _assert_matches(out[b:b + 1], q[b:b + 1], keys[None], vals[None], 0, causal=True)
                if lse is not None:
                    s = (q[b, 0].float().view(2, H // 2, D) @ keys.float().transpose(0, 1).transpose(1, 2))
                    want = torch.logsumexp(s * D ** -0.5, dim=-1).reshape(H)
                    assert torch.allclose(lse[b, :, 0], want, atol=1e-3), f"step {i}: the LSE"
        assert len(interface._KV_FAST) == 1
        n = len(replays)
        with pytest.MonkeyPatch.context() as mp2:
            mp2.setattr(DEBUG, "pdl", 0 if DEBUG.pdl else 1)
            tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True, block_table=table)
        tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=False, block_table=table)
        assert len(replays) == n, "a changed debug switch or signature must not replay"


def _kv_fast_standins(monkeypatch, planned, replay):
    """CPU tensors through flash_attn_with_kvcache's kept-launch tables (``_PREPARE_CPU``), empty,
    with stand-ins for the route's ``planned_kvcache`` / ``replay_kvcache`` and the value checks off."""
    from tileflash import interface
    from tileflash.ops import route

    monkeypatch.setattr(interface, "_PREPARE_CPU", True)
    monkeypatch.setattr(interface, "_KV_FAST", {})
    monkeypatch.setattr(interface, "_KV_PREPARED", {})
    monkeypatch.delenv("TILEFLASH_CHECK_INPUTS", raising=False)
    monkeypatch.setattr(route, "planned_kvcache", planned)
    monkeypatch.setattr(route, "replay_kvcache", replay)


def test_kvcache_int_length_replays_within_its_bucket(monkeypatch):
    """An int ``cache_seqlens`` keeps its launches too (``interface._KV_FAST``, with stand-ins for
    the route's kept launches on CPU tensors): the next step whose length falls in the same length
    bucket replays them with no length tensor, every entry's key count and the append position;
    a length in another bucket, a cache overflow and a negative length take the full path (which
    plans the new bucket, or raises before any write)."""
    from tileflash.ops.triton.decode import LENGTH_BUCKET

    planned_for, replays = [], []

    def planned(q, k_cache, v_cache, k, v, seqlens, scale, causal, window, softcap, cbi, table, splits, leftpad, add,
                options, max_seqlen_k=-1):
        planned_for.append((seqlens, max_seqlen_k))
        return ("plan", max_seqlen_k)

    def replay(kept, q, k_cache, v_cache, k, v, seqlens, cbi, table, leftpad, fixed, need_lse, append_at=0):
        replays.append((kept, seqlens, fixed, append_at))
        return torch.full_like(q, 7.0), None

    _kv_fast_standins(monkeypatch, planned, replay)
    cap, new = 2 * LENGTH_BUCKET - 8, 2  # (a cache that ends inside the second bucket)
    g = torch.Generator().manual_seed(47)
    kc, vc = (torch.randn(B, cap, 2, D, generator=g) for _ in range(2))
    q = torch.randn(B, 1, H, D, generator=g)
    k, v = (torch.randn(B, new, 2, D, generator=g) for _ in range(2))

    def step(length):
        return tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=length, causal=True)

    out = step(5)  # the full path: appends at 5, attends over 7 keys, keeps the launches
    assert not replays and planned_for == [(None, 5 + new)]
    assert torch.equal(kc[:, 5:5 + new], k) and torch.equal(vc[:, 5:5 + new], v)
    for b in range(B):
        _assert_matches(out[b:b + 1], q[b:b + 1], kc[b:b + 1, :5 + new], vc[b:b + 1, :5 + new], 1e-5, causal=True)
    written = kc.clone()
    out = step(9)  # same bucket: the kept launches, told the key count and where to append
    assert replays == [(("plan", 5 + new), None, 9 + new, 9)] and torch.equal(out, torch.full_like(q, 7.0))
    assert torch.equal(kc, written), "a replayed step runs nothing but the kept launches"
    n = len(replays)
    with pytest.raises(ValueError, match="cache_seqlens must be >= 0"):
        step(-1)  # (-1 + 2 keys is in the kept bucket: the sign check must come first)
    assert len(replays) == n and torch.equal(kc, written), "a refused step wrote into the cache"
    out = step(LENGTH_BUCKET + 1)  # another bucket: the full path, which keeps a plan for it
    assert len(replays) == n and planned_for[-1] == (None, LENGTH_BUCKET + 1 + new)
    for b in range(B):
        m = LENGTH_BUCKET + 1 + new
        _assert_matches(out[b:b + 1], q[b:b + 1], kc[b:b + 1, :m], vc[b:b + 1, :m], 1e-5, causal=True)
    step(LENGTH_BUCKET + 3)
    assert len(replays) == n + 1 and replays[-1][2:] == (LENGTH_BUCKET + 3 + new, LENGTH_BUCKET + 3)
    written = kc.clone()
    with pytest.raises(ValueError, match="cache overflow"):
        step(cap - 1)  # (cap + 1 keys is in the kept bucket: the room check must come first)
    assert len(replays) == n + 1 and torch.equal(kc, written), "a refused step wrote into the cache"


def test_split_partials_are_per_stream_and_capped(monkeypatch):
    """``decode.split_partials``: a split launch's partials buffer is its stream's own, reused by
    later launches on that stream, another stream gets another buffer, every call on either stream
    matches the reference, and past ``PARTIALS_STREAMS`` streams the kept buffers are dropped."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tileflash.ops.triton import decode

    monkeypatch.setattr(decode, "_PARTIALS", {})
    dev, dt = torch.device("cuda", torch.cuda.current_device()), torch.float16
    g = torch.Generator().manual_seed(41)
    kc, vc = (torch.randn(2, 4096, 2, 64, generator=g).to(dev, dt) for _ in range(2))
    sl = torch.tensor([4000, 3001], dtype=torch.int32, device=dev)

    def step(q):
        out = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, num_splits=8)
        for b, n in enumerate((4000, 3001)):
            _assert_matches(out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], 0)

    step(torch.randn(2, 1, 4, 64, generator=g).to(dev, dt))
    assert len(decode._PARTIALS) == 1
    first = next(iter(decode._PARTIALS.values()))
    step(torch.randn(2, 1, 4, 64, generator=g).to(dev, dt))
    assert len(decode._PARTIALS) == 1 and next(iter(decode._PARTIALS.values())) is first, "reused on its stream"
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        q = torch.randn(2, 1, 4, 64, generator=g).to(dev, dt)
        step(q)
    torch.cuda.synchronize()
    assert len(decode._PARTIALS) == 2, "another stream, another buffer"
    monkeypatch.setattr(decode, "PARTIALS_STREAMS", 2)
    with torch.cuda.stream(torch.cuda.Stream()):
        step(torch.randn(2, 1, 4, 64, generator=g).to(dev, dt))
    torch.cuda.synchronize()
    assert len(decode._PARTIALS) == 1, "past the cap the kept buffers are dropped"


def test_append_does_not_sync_and_captures():
    """On CUDA a decode step with an append reads no value on the host (torch's sync debug mode
    would raise), and append + attention captured in a CUDA graph and replayed give the eager
    results, the cache included."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev, dt = "cuda", torch.float16
    kc, vc, table, g = _setup(dev, 2, True, 16, seed=22)
    q = torch.randn(B, 1, H, D, generator=g).to(dev, dt)
    k, v = torch.randn(B, 1, 2, D, generator=g).to(dev, dt), torch.randn(B, 1, 2, D, generator=g).to(dev, dt)
    seqlens = torch.tensor([5, 17, 30], dtype=torch.int32, device=dev)
    kw = dict(cache_seqlens=seqlens, block_table=table, causal=True)
    kc_e, vc_e = kc.clone(), vc.clone()
    ref = tileflash.flash_attn_with_kvcache(q, kc_e, vc_e, k, v, **kw)  # eager (also compiles the kernels)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        tileflash.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), k, v, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            out = tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    assert torch.equal(kc, kc_e) and torch.equal(vc, vc_e)


def test_compiled_decode_step_reduce_overhead():
    """torch.compile(mode="reduce-overhead") (CUDA graphs) of a decode step that appends to a
    cache held as module buffers: three steps, each equal to the eager step, caches included."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    dev, dt = "cuda", torch.float16

    class Step(torch.nn.Module):
        def __init__(self, kc, vc):
            super().__init__()
            self.register_buffer("kc", kc)
            self.register_buffer("vc", vc)

        def forward(self, q, k, v, seqlens):
            return tileflash.flash_attn_with_kvcache(q, self.kc, self.vc, k, v, cache_seqlens=seqlens, causal=True)

    kc, vc, _, g = _setup(dev, 2, False, 16, seed=23)
    eager, compiled = Step(kc.clone(), vc.clone()), Step(kc.clone(), vc.clone())
    torch._dynamo.reset()
    step = torch.compile(compiled, mode="reduce-overhead")
    for i in range(3):
        q = torch.randn(B, 1, H, D, generator=g).to(dev, dt)
        k, v = torch.randn(B, 1, 2, D, generator=g).to(dev, dt), torch.randn(B, 1, 2, D, generator=g).to(dev, dt)
        seqlens = torch.tensor([5 + i, 17 + i, 30 + i], dtype=torch.int32, device=dev)
        ref = eager(q, k, v, seqlens)
        out = step(q, k, v, seqlens).clone()
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
        assert torch.equal(compiled.kc, eager.kc) and torch.equal(compiled.vc, eager.vc)


def test_compiled_append_functionalizes_on_cpu():
    """The append is the mutating custom op tileflash::kvcache_append under torch.compile: with
    aot_eager (functionalization) the compiled step writes the same cache and output as eager."""
    kc, vc, _, g = _setup("cpu", 2, False, 16, seed=24)
    q = torch.randn(B, 1, H, D, generator=g)
    k, v = torch.randn(B, 1, 2, D, generator=g), torch.randn(B, 1, 2, D, generator=g)
    kc2, vc2 = kc.clone(), vc.clone()
    ref = tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=7, causal=True)
    torch._dynamo.reset()
    fn = torch.compile(lambda q, kc, vc, k, v: tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=7,
                                                                                 causal=True),
                       backend="aot_eager")  # (CPU checks values: a graph break before the append)
    out = fn(q, kc2, vc2, k, v)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


@pytest.mark.parametrize("bad", ["overflow", "table_range"])
def test_compiled_append_is_checked(bad):
    """Under torch.compile the value checks run as a graph break: a bad append still raises
    ValueError and leaves the cache untouched (it must not write through a wrapped index)."""
    kc, vc, table, g = _setup("cpu", 2, True, 16, seed=13)
    q = torch.randn(B, 1, H, D, generator=g)
    k, v = torch.randn(B, 1, 2, D, generator=g), torch.randn(B, 1, 2, D, generator=g)
    seqlens = torch.tensor([3, 4, 5], dtype=torch.int32)
    if bad == "overflow":
        seqlens[1] = CAP
    else:
        table[1, 0] = -1
    kc0, vc0 = kc.clone(), vc.clone()
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: tileflash.flash_attn_with_kvcache(*a, cache_seqlens=seqlens, block_table=table),
                       backend="eager")
    with pytest.raises(ValueError, match="cache overflow" if bad == "overflow" else "block_table entries"):
        fn(q, kc, vc, k, v)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)


def test_compiled_call_does_not_recompile_per_new_token_count():
    """Under torch.compile (dynamic shapes) the host-side checks must not guard on the exact
    number of new tokens: once the shapes are dynamic, new seqlen_q values reuse the compiled
    frames (a power of two of seqlen_q in the grid check guarded on each value, a recompile per
    new length, until dynamo's limit sends the call to eager)."""
    from torch._dynamo.testing import CompileCounter

    kc, vc, _, g = _setup("cpu", 2, False, 16, seed=16)
    seqlens = torch.tensor([3, 20, 40], dtype=torch.int32)
    torch._dynamo.reset()
    counter = CompileCounter()
    fn = torch.compile(lambda q: tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens),
                       backend=counter, dynamic=True)
    for t in (3, 5):
        fn(torch.randn(B, t, H, D, generator=g))
    frames = counter.frame_count
    for t in (6, 7, 9, 11):
        q = torch.randn(B, t, H, D, generator=g)
        torch.testing.assert_close(fn(q), tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens),
                                   rtol=0, atol=0)
    assert counter.frame_count == frames, f"{counter.frame_count - frames} recompiles for new seqlen_q values"


def test_kernel_clamps_contiguous(backend):
    """Contiguous cache, called below the interface: cache_batch_idx out of range both ways and a
    length past the capacity (50, not a multiple of any block size) are clamped: row 1 reads cache
    row 3 (the last), row 2 reads cache row 0 over all 50 keys."""
    if backend == "tiled":
        pytest.skip("the clamping is in the Triton kernel")
    from tileflash.ops.triton.decode import decode_forward

    dev = backend_device(backend)
    dt = _dtype(dev)
    g = torch.Generator().manual_seed(14)
    cap = 50
    kc = torch.randn(B + 1, cap, 2, D, generator=g).to(dev, dt)
    vc = torch.randn(B + 1, cap, 2, D, generator=g).to(dev, dt)
    q = torch.randn(B, 1, H, D, generator=g).to(dev, dt)
    seqlens = torch.tensor([30, 20, 10 ** 6], dtype=torch.int32, device=dev)
    idx = torch.tensor([0, 10 ** 6, -3], dtype=torch.int32, device=dev)
    out, _ = decode_forward(q, kc, vc, seqlens, D ** -0.5, False, cache_batch_idx=idx)
    assert torch.isfinite(out).all()
    _assert_matches(out[:1], q[:1], kc[0:1, :30], vc[0:1, :30], 2e-5)
    _assert_matches(out[1:2], q[1:2], kc[3:4, :20], vc[3:4, :20], 2e-5)
    _assert_matches(out[2:3], q[2:3], kc[0:1, :cap], vc[0:1, :cap], 2e-5)


def test_compiled_read_only_fullgraph():
    """A read-only decode step compiles without a graph break (no value read on the host; the op
    tileflash::kvcache_fwd is opaque to the compiler) and matches the eager call."""
    kc, vc, table, g = _setup("cpu", 2, True, 16, seed=15)
    q = torch.randn(B, 1, H, D, generator=g)
    seqlens = torch.tensor([3, 20, 40], dtype=torch.int32)
    eager = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table)
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: tileflash.flash_attn_with_kvcache(*a, cache_seqlens=seqlens, block_table=table),
                       backend="eager", fullgraph=True)
    torch.testing.assert_close(fn(q, kc, vc), eager, rtol=0, atol=0)


@pytest.mark.parametrize("sq,sk,causal,window", [(1, 300, True, (-1, -1)), (4, 97, False, (20, 3)),
                                                 (16, 16, True, (-1, -1)), (17, 64, True, (-1, -1))])
def test_decode_shaped_forward_runs_decode_kernel(backend, monkeypatch, sq, sk, causal, window):
    """flash_attn_func with a few query tokens (decode_shaped) runs the split-KV decode kernel,
    with the forward's results (out and lse against fp64) and a backward through them; more query
    tokens than DECODE_MAX_Q keep the prefill kernels."""
    if backend == "tiled":
        pytest.skip("the tiled CPU path has no decode kernel")
    from tileflash.ops import route

    dev = backend_device(backend)
    dt = _dtype(dev)
    calls = []
    real = route.tr_dec.decode_forward
    monkeypatch.setattr(route.tr_dec, "decode_forward", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    g = torch.Generator().manual_seed(25)
    q = torch.randn(2, sq, H, D, generator=g).to(dev, dt).requires_grad_()
    k = torch.randn(2, sk, 2, D, generator=g).to(dev, dt).requires_grad_()
    v = torch.randn(2, sk, 2, D, generator=g).to(dev, dt).requires_grad_()
    out, lse, _ = tileflash.flash_attn_func(q, k, v, causal=causal, window_size=window, return_attn_probs=True)
    assert bool(calls) == (sq <= route.DECODE_MAX_Q)
    _assert_matches(out.detach(), q.detach(), k.detach(), v.detach(), 3e-5, causal=causal, window_size=window)
    _, ref_lse = attention_ref(q.detach().cpu().double(), k.detach().cpu().double(), v.detach().cpu().double(),
                               causal=causal, window_size=window)
    assert (lse.cpu().double() - ref_lse).abs().max().item() < (1e-5 if dt == torch.float32 else 2e-2)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))


def test_decode_outputs_are_contiguous(backend):
    """The decode kernel's output is contiguous whatever q's strides (a transposed q, as
    transformers passes it), as the custom ops' fake outputs are: torch.compile checks the
    strides of what an op returns against its fake."""
    if backend == "tiled":
        pytest.skip("the tiled CPU path has no decode kernel")
    dev = backend_device(backend)
    dt = _dtype(dev)
    g = torch.Generator().manual_seed(26)
    q = torch.randn(2, H, 3, D, generator=g).to(dev, dt).transpose(1, 2)          # (2, 3, H, D), head-major
    kc, vc = (torch.randn(2, 40, 2, D, generator=g).to(dev, dt) for _ in range(2))
    contiguous = torch.empty(q.shape, device="meta").stride()
    out = tileflash.flash_attn_func(q, kc, vc, causal=True)                       # decode-shaped
    assert out.stride() == contiguous
    out2 = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([40, 17], dtype=torch.int32,
                                                                                      device=dev), causal=True)
    assert out2.stride() == contiguous
    _assert_matches(out, q, kc, vc, 3e-5, causal=True)


def test_int_lengths_check_rotary_without_value_checks(monkeypatch):
    """With cache_seqlens a Python int the rotary table's length is checked even where tensor
    values are not read (CUDA's default, forced here on CPU): a short table raises, untouched cache."""
    import tileflash.interface as interface

    monkeypatch.setattr(interface, "_kvcache_checks_values", lambda *a: False)
    kc, vc, _, g = _setup("cpu", 2, False, 16, seed=27)
    q = torch.randn(B, 1, H, D, generator=g)
    k, v = torch.randn(B, 1, 2, D, generator=g), torch.randn(B, 1, 2, D, generator=g)
    cos, sin = _rotary_tables(4, 16, "cpu")
    kc0 = kc.clone()
    with pytest.raises(ValueError, match="rotary_cos has 4 positions"):
        tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=5)
    assert torch.equal(kc, kc0)


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_without_lse_writes_it_to_the_scratch(backend, splits):
    """A decode step that does not return its LSE (return_softmax_lse=False) writes it into the
    shared scratch buffer (``utils.lse_scratch``) rather than a fresh allocation: the output is the
    same as with return_softmax_lse=True and meets the error rule, and the scratch holds the bits of
    that call's LSE (the kernel, split or not, wrote it there)."""
    if backend == "tiled":
        pytest.skip("the scratch takes the decode kernel's LSE; the tiled path returns its own")
    from tileflash.ops import utils

    dev = backend_device(backend)
    kc, vc, _, g = _setup(dev, 2, False, 16, seed=41)
    q = torch.randn(B, 1, H, D, generator=g).to(dev, kc.dtype)
    sl = torch.tensor([7, 29, 48], dtype=torch.int32, device=dev)
    want_out, want_lse = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, num_splits=splits,
                                                           return_softmax_lse=True)
    n = want_lse.numel()
    scratch = utils.lse_scratch(n, q.device)
    scratch[:n].fill_(float("nan"))
    out = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, num_splits=splits)
    assert torch.equal(out, want_out)
    assert torch.equal(scratch[:n].view_as(want_lse), want_lse), "the scratch must hold the step's LSE"
    for b, n_b in enumerate(sl.tolist()):
        _assert_matches(out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n_b], vc[b:b + 1, :n_b], 3e-5)


def test_growing_dense_cache_shares_a_decode_plan(backend):
    """Decode-shaped flash_attn_func calls whose keys grow step by step, as transformers passes
    them (a (B, H, L, D) cache grown by torch.cat and seen as (B, L, H, D): its batch and head
    strides change with L), share a decode plan per LENGTH_BUCKET keys and per class of what triton
    specializes on (decode._int_class: a capacity that is a multiple of 16 is another class), the
    strides and capacity passed per call (decode._cache_layout). Every step matches the reference;
    lengths 250-255 make one plan, 257-258 (the next bucket) a second, 272 (a multiple of 16) a third."""
    if backend == "tiled":
        pytest.skip("the plans are the decode kernel's launches")
    from tileflash.ops.triton import decode as dec

    assert dec.LENGTH_BUCKET == 256, "the lengths below assume 256-key buckets"
    dev = backend_device(backend)
    dt = _dtype(dev)
    g = torch.Generator().manual_seed(83)
    kc, vc = (torch.randn(2, 2, 249, 32, generator=g).to(dev, dt) for _ in range(2))  # (B, Hk, L, D)
    dec._DECODE_PLANS.clear()
    plans = []
    for grow in (1, 1, 1, 1, 1, 1, 2, 1, 14):  # L = 250 ... 255, 257, 258, 272
        kc, vc = (torch.cat([c, torch.randn(2, 2, grow, 32, generator=g).to(dev, dt)], dim=2) for c in (kc, vc))
        q = torch.randn(2, 1, 4, 32, generator=g).to(dev, dt)
        k, v = kc.transpose(1, 2), vc.transpose(1, 2)                                    # (B, L, Hk, D) views
        out = tileflash.flash_attn_func(q, k, v, causal=True)
        _assert_matches(out, q, k, v, 3e-5, causal=True)
        plans.append(len(dec._DECODE_PLANS))
    assert plans == [1] * 6 + [2, 2, 3], plans
    assert dec._int_class(1) == (True, False, True) and dec._int_class(32) == (False, True, True)
    assert dec._int_class(2 ** 31) == (False, True, False)


def test_kvcache_fast_signature_replays_only_its_own(monkeypatch):
    """flash_attn_with_kvcache's kept launches (``interface._KV_FAST``), with stand-ins for the
    route's kept launches on CPU tensors (``_PREPARE_CPU``): after a step with a length tensor, the
    same signature replays them (``route.replay_kvcache``, with seqlen_add and the LSE request) and
    runs no other layer (the cache is not written again); int lengths, a read-only call, another
    causal flag, q with other strides, an int64 length tensor (refused), a changed debug switch and
    TILEFLASH_CHECK_INPUTS=1 take the full path, whose results match the reference; so does a
    replay that declines (None)."""
    from tileflash import interface

    replays, declined = [], []

    def planned(q, k_cache, v_cache, k, v, seqlens, scale, causal, window, softcap, cbi, table, splits, leftpad, add,
                options, max_seqlen_k=-1):
        return ("plan", k is not None, causal)

    def replay(kept, q, k_cache, v_cache, k, v, seqlens, cbi, table, leftpad, add, need_lse, append_at=0):
        replays.append((kept, add, need_lse))
        if declined:
            return None
        return torch.full_like(q, 7.0), (torch.zeros(1) if need_lse else None)

    _kv_fast_standins(monkeypatch, planned, replay)
    dev = "cpu"
    kc, vc, _, g = _setup(dev, 2, False, 16, seed=43)
    dt = kc.dtype
    pos = [5, 17, 30]
    sl = torch.tensor(pos, dtype=torch.int32)
    q = torch.randn(B, 1, H, D, generator=g).to(dt)
    k, v = (torch.randn(B, 1, 2, D, generator=g).to(dt) for _ in range(2))

    def full_path_ok(out, q, n_new, causal=True):
        for b in range(B):
            n = pos[b] + n_new
            _assert_matches(out[b:b + 1], q[b:b + 1], kc[b:b + 1, :n], vc[b:b + 1, :n], 1e-5, causal=causal)

    out = tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=sl, causal=True)
    full_path_ok(out, q, 1)
    assert not replays and len(interface._KV_FAST) == 1
    written = kc.clone()
    k2 = torch.randn_like(k)
    out = tileflash.flash_attn_with_kvcache(q, kc, vc, k2, v, cache_seqlens=sl, causal=True)
    assert replays == [(("plan", True, True), 1, False)] and torch.equal(out, torch.full_like(q, 7.0))
    assert torch.equal(kc, written), "a replayed step runs nothing but the kept launches"
    out, lse = tileflash.flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=sl, causal=True,
                                                 return_softmax_lse=True)
    assert replays[-1][2] is True and lse is not None

    qt = torch.zeros(B, 1, H + 1, D, dtype=dt)[:, :, :H]  # same shape and unit last stride, other strides
    qt.copy_(q)
    n = len(replays)
    for name, call in (
        ("int lengths", lambda: tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=pos[0], causal=True)),
        ("read-only", lambda: tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)),
        ("not causal", lambda: tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=False)),
        ("q strides", lambda: tileflash.flash_attn_with_kvcache(qt, kc, vc, cache_seqlens=sl, causal=True)),
    ):
        got = call()
        assert len(replays) == n, f"{name}: another signature must not replay"
        if name == "int lengths":
            for b in range(B):
                _assert_matches(got[b:b + 1], q[b:b + 1], kc[b:b + 1, :pos[0]], vc[b:b + 1, :pos[0]], 1e-5,
                                causal=True)
        else:
            full_path_ok(got, q, 0, causal=name != "not causal")
    with pytest.raises(TypeError, match="int32"):
        tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl.long(), causal=True)
    assert len(replays) == n
    # the read-only signature now has kept launches too: it replays
    tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)
    assert replays[-1] == (("plan", False, True), 0, False)
    n = len(replays)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DEBUG, "pdl", 0 if DEBUG.pdl else 1)
        full_path_ok(tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True), q, 0)
    monkeypatch.setenv("TILEFLASH_CHECK_INPUTS", "1")
    full_path_ok(tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True), q, 0)
    assert len(replays) == n, "a changed debug switch or TILEFLASH_CHECK_INPUTS=1 must not replay"
    monkeypatch.delenv("TILEFLASH_CHECK_INPUTS")
    # (the step under the other switch kept its launches with that switch: one full step again)
    tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)
    assert len(replays) == n
    declined.append(True)
    full_path_ok(tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True), q, 0)
    assert len(replays) == n + 1


def test_kvcache_op_output_strides_match_its_fake(backend):
    """``tileflash::kvcache_fwd`` on a q of (b, h, s, d) memory (a transposed view): the output is
    contiguous on every path as its fake says (``torch.library.opcheck`` compares the real and fake
    strides; the tiled CPU path used to return q's memory order), with the values of a contiguous q."""
    from tileflash.ops.attention import kvcache_fwd

    dev = backend_device(backend)
    torch.manual_seed(3)
    q = torch.randn(2, 4, 3, 16, device=dev).transpose(1, 2)  # (b, s=3, h=4, d) view of (b, h, s, d) memory
    kc, vc = torch.randn(2, 20, 2, 16, device=dev), torch.randn(2, 20, 2, 16, device=dev)
    seqlens = torch.tensor([9, 20], dtype=torch.int32, device=dev)
    torch.library.opcheck(kvcache_fwd, (q, kc, vc, seqlens, 0.25, True))
    out, _ = kvcache_fwd(q, kc, vc, seqlens, 0.25, True)
    assert out.is_contiguous()
    dense, _ = kvcache_fwd(q.contiguous(), kc, vc, seqlens, 0.25, True)
    assert torch.equal(out, dense)
