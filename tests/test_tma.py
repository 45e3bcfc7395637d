"""The tensor-descriptor (TMA) forward path (the default on sm90+ GPUs): same results as the pointer path.

The interpreter emulates descriptors (zero fill past the bounds on load, clipping on store), so
these run in CPU CI; on a GPU they run the real copy engine (sm90+). Outputs are NaN-poisoned so
that a row the clipped stores miss would show.
"""

import pytest
import torch

from tileflash.ops.forward import flash_attn_forward, tma_requested, tma_supported

from conftest import backend_device
from test_forward import check_lse, check_out, make_qkv, rounding_atol


def _path_atol(ref):
    """How far the descriptor path may be from the pointer path: same tiles, same arithmetic, only
    the summation order inside a dot may differ (a tile arrives transposed through the descriptor,
    and the interpreter's numpy matmul picks its BLAS kernel by layout and CPU). fp32: 2e-6 of the
    tensor's largest magnitude (at least 2e-6); with OpenBLAS 0.3.31's AVX-512 kernels a dV whose
    entries reach 5.1 differed by 2.4e-6, 5 ulps, where its Haswell kernels stay within 2e-6.
    fp16/bf16: 2 ulps of the output."""
    if ref.dtype == torch.float32:
        return 2e-6 * max(1.0, ref.abs().max().item())
    return rounding_atol(ref.double(), ref.dtype)


def _assert_same_path(out_t, lse_t, out_p, lse_p):
    """Same tiles, same arithmetic; only the summation order inside a dot may differ (see
    _path_atol)."""
    torch.testing.assert_close(out_t, out_p, rtol=0, atol=_path_atol(out_p))
    torch.testing.assert_close(lse_t, lse_p, rtol=0, atol=2e-6 if out_p.dtype == torch.float32 else 1e-4)


def _run(q, k, v, causal, use_tma, default_config=False, tiles=None, **kw):
    """default_config: the head dim's real launch config (GPU); tiles: these BLOCK_M/BLOCK_N/warps/
    stages; else small 32x16 tiles."""
    out = torch.full_like(q, float("nan"))
    lse_shape = (q.shape[0], q.shape[2], q.shape[1]) if q.dim() == 4 else (q.shape[1], q.shape[0])
    lse = torch.full(lse_shape, float("nan"), device=q.device)
    cfg = {"USE_TMA": use_tma} if default_config else \
        {**(tiles or {"BLOCK_M": 32, "BLOCK_N": 16}), "USE_TMA": use_tma}
    expect_tma = kw.pop("expect_tma", True)
    if use_tma and q.is_cuda and expect_tma:
        assert tma_supported(q, k, v, out), "the test must exercise the TMA path, not the fallback"
    return flash_attn_forward(q, k, v, q.shape[-1] ** -0.5, causal, config=cfg, out=out, lse=lse, **kw)


@pytest.fixture
def gpu_or_interpreter(backend):
    if backend == "tiled":
        pytest.skip("TMA is a Triton kernel path")
    if backend == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need sm90+")
    return backend


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk,d,hk", [(1, 17, 64, 2), (17, 63, 40, 1), (65, 113, 64, 4), (113, 65, 32, 2),
                                        (203, 203, 128, 4)], ids=lambda x: str(x))
def test_tma_matches_reference_and_pointer_path(gpu_or_interpreter, sq, sk, d, hk, causal):
    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    q, k, v = make_qkv(2, sq, sk, 4, hk, d, dt, dev, seed=sq + sk)
    out_t, lse_t = _run(q, k, v, causal, True)
    out_p, lse_p = _run(q, k, v, causal, False)
    _, ref_lse = check_out(out_t, q, k, v, causal)
    check_lse(lse_t, ref_lse, q.dtype)
    _assert_same_path(out_t, lse_t, out_p, lse_p)


def test_tma_varlen_window_softcap_alibi(gpu_or_interpreter):
    """Per-sequence descriptors: rows of the next sequence must not leak into a tail tile."""
    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    g = torch.Generator().manual_seed(3)
    lens_q, lens_k = [5, 40, 1, 33], [9, 40, 17, 20]
    cu_q = torch.tensor([0] + torch.tensor(lens_q).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    cu_k = torch.tensor([0] + torch.tensor(lens_k).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    q = torch.randn(sum(lens_q), 4, 64, generator=g).to(dev, dt)
    k = torch.randn(sum(lens_k), 2, 64, generator=g).to(dev, dt)
    v = torch.randn(sum(lens_k), 2, 64, generator=g).to(dev, dt)
    slopes = torch.rand(4, generator=g).to(dev)
    kw = dict(window=(7, 3), softcap=5.0, alibi_slopes=slopes, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
              max_seqlen_q=max(lens_q), max_seqlen_k=max(lens_k))
    out_t, lse_t = _run(q, k, v, False, True, **kw)
    out_p, lse_p = _run(q, k, v, False, False, **kw)
    assert not torch.isnan(out_t).any() and not torch.isnan(lse_t).any()
    _assert_same_path(out_t, lse_t, out_p, lse_p)


def test_tma_request_policy(monkeypatch):
    """On by default for compiled kernels on Hopper only; off in the interpreter, without a device
    and on CPU tensors; config and env override."""
    from tileflash.ops.forward import interpreting

    monkeypatch.delenv("TILEFLASH_TMA", raising=False)
    assert not tma_requested(None) and not tma_requested(None, torch.device("cpu"))
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        assert tma_requested(None, dev) == (not interpreting() and torch.cuda.get_device_capability(dev)[0] == 9)
    assert tma_requested({"USE_TMA": True}) and not tma_requested({"USE_TMA": False})
    monkeypatch.setenv("TILEFLASH_TMA", "1")
    assert tma_requested(None) and not tma_requested({"USE_TMA": False})
    monkeypatch.setenv("TILEFLASH_TMA", "0")
    assert not tma_requested(None) and tma_requested({"USE_TMA": True})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
def test_pointer_path_default_configs_cuda(backend, dtype, d, monkeypatch):
    """TILEFLASH_TMA=0: the pointer path with its own default tiles (what GPUs before sm90 run),
    through the public call, against the reference."""
    import tileflash

    if backend != "cuda":
        pytest.skip("the interpreter runs the pointer path by default (every other test here)")
    monkeypatch.setenv("TILEFLASH_TMA", "0")
    dt = getattr(torch, dtype)
    for causal in (False, True):
        q, k, v = make_qkv(2, 1000, 1100, 8, 2, d, dt, "cuda", seed=d + 1)
        check_out(tileflash.flash_attn_func(q, k, v, causal=causal), q, k, v, causal)


def test_default_config_table():
    """The TMA path has its own swept tiles; without TMA the pointer-path table is unchanged."""
    from tileflash.ops.forward import default_config

    assert default_config(128, causal=False, tma=True)["BLOCK_N"] == 128
    assert default_config(128, causal=True, tma=True)["BLOCK_M"] == 64
    assert default_config(128) == dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    assert default_config(256, tma=True) == default_config(256)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tma_unsupported_layouts_fall_back():
    """Strides that are not 16-byte multiples cannot be described: the pointer path is used."""
    q = torch.randn(1, 8, 2, 72, device="cuda", dtype=torch.float16)[..., :36]  # strides 2304/288/144 B: all 16-byte multiples
    assert tma_supported(q) == (torch.cuda.get_device_capability()[0] >= 9)
    odd = torch.randn(1, 8, 3, 12, device="cuda", dtype=torch.float16)[..., :4]  # head stride 24 B
    assert not tma_supported(odd)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_tma_default_configs_cuda(backend, dtype, d):
    """The launch configs users get on the TMA path (e.g. 128x128 tiles, 8 warps, 3 stages at D=128
    non-causal), fp16 and bf16: against the reference, and against pointers with the same tiles."""
    from tileflash.ops.forward import default_config

    if backend != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an sm90+ GPU (the interpreter runs bf16 as fp32 and small tiles)")
    dt = getattr(torch, dtype)
    for causal in (False, True):
        q, k, v = make_qkv(2, 1000, 1100, 8, 2, d, dt, "cuda", seed=d)
        out_t, lse_t = _run(q, k, v, causal, True, default_config=True)
        out_p, lse_p = _run(q, k, v, causal, False, tiles=default_config(d, causal, tma=True))
        check_out(out_t, q, k, v, causal)
        _assert_same_path(out_t, lse_t, out_p, lse_p)


def test_tma_dropout(gpu_or_interpreter):
    """Dropout's mask depends only on (seed, b·h, i, j): the same on both paths."""
    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    q, k, v = make_qkv(2, 45, 70, 4, 2, 64, dt, dev, seed=21)
    seed = torch.tensor([1234], dtype=torch.int64, device=dev)
    out_t, lse_t = _run(q, k, v, True, True, dropout_p=0.3, seed=seed)
    out_p, lse_p = _run(q, k, v, True, False, dropout_p=0.3, seed=seed)
    _assert_same_path(out_t, lse_t, out_p, lse_p)


def test_tma_unaligned_layout_falls_back(gpu_or_interpreter):
    """Head dim 6 in fp32 (24-byte rows) cannot be described: USE_TMA falls back to pointers
    (the interpreter enforces the same 16-byte rules as the hardware)."""
    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    d = 6 if dt == torch.float32 else 4  # 24 or 8 bytes per row: not a 16-byte multiple
    q, k, v = make_qkv(1, 20, 30, 2, 2, d, dt, dev, seed=5)
    assert not tma_supported(q, k, v)
    out, lse = _run(q, k, v, False, True, expect_tma=False)
    _, ref_lse = check_out(out, q, k, v, False)


def _bwd(q, k, v, do, out, lse, causal, use_tma, **kw):
    """The backward with NaN-poisoned gradient buffers, forcing the descriptor or the pointer path
    (the head dim's real tiles on the GPU, the interpreter's small ones on CPU)."""
    from tileflash.ops.backward import flash_attn_backward

    bufs = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    if use_tma:
        assert tma_supported(q, k, v, do), "the test must exercise the TMA path, not the fallback"
    return flash_attn_backward(do, q, k, v, out, lse, q.shape[-1] ** -0.5, causal, config={"USE_TMA": use_tma},
                               dq=bufs[0], dk=bufs[1], dv=bufs[2], **kw)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk,d,hk", [(17, 63, 40, 1), (65, 113, 64, 4), (113, 65, 32, 2), (203, 203, 128, 4),
                                         (129, 203, 256, 2)],
                         ids=lambda x: str(x))
def test_tma_backward_matches_pointer_path_and_reference(gpu_or_interpreter, sq, sk, d, hk, causal):
    """The backward's descriptor loads (Q/dO in dK/dV, K/V in dQ) against its pointer loads, on
    ragged lengths, a head dim below its tile (40 -> 64), GQA and MQA; and against fp64 autograd
    with flash-attn's rule (3x eager's error + rounding)."""
    from test_backward import ref_grads

    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    q, k, v = make_qkv(2, sq, sk, 4, hk, d, dt, dev, seed=sq * 3 + sk)
    do = torch.randn_like(q)
    out, lse = flash_attn_forward(q, k, v, d ** -0.5, causal)
    got = _bwd(q, k, v, do, out, lse, causal, True)
    ptr = _bwd(q, k, v, do, out, lse, causal, False)
    ref = ref_grads(q, k, v, do, causal, upcast=True)
    eager = ref_grads(q, k, v, do, causal, upcast=False)
    for name, g, p, r, e in zip("qkv", got, ptr, ref, eager):
        assert not torch.isnan(g).any(), f"d{name}: an unwritten gradient row"
        torch.testing.assert_close(g, p, rtol=0, atol=_path_atol(p), msg=f"d{name}: TMA vs pointer path")
        err = (g.cpu().double() - r).abs().max().item()
        eager_err = (e.cpu().double() - r).abs().max().item()
        assert err <= 3 * eager_err + rounding_atol(r, dt), f"d{name}: {err:.3g} vs eager {eager_err:.3g}"


def test_tma_backward_varlen_features(gpu_or_interpreter):
    """Varlen (descriptors per sequence), a causal sliding window, softcap and ALiBi, through the
    descriptor backward against the pointer one. The packed tensors are views of buffers whose
    rows past the last sequence are NaN: a descriptor reaching past its sequence reads them."""
    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    lens = [37, 64, 5]
    cu = torch.tensor([0, 37, 101, 106], dtype=torch.int32, device=dev)
    g = torch.Generator().manual_seed(4)

    def packed(h):
        buf = torch.full((106 + 64, h, 64), float("nan"), dtype=dt, device=dev)
        buf[:106] = torch.randn(106, h, 64, generator=g).to(dev, dt)
        return buf[:106]
    q, k, v, do = packed(4), packed(2), packed(2), packed(4)
    slopes = torch.rand(4, generator=g).to(dev)
    kw = dict(window=(9, 0), softcap=5.0, alibi_slopes=slopes, cu_seqlens_q=cu, cu_seqlens_k=cu,
              max_seqlen_q=max(lens), max_seqlen_k=max(lens))
    out, lse = flash_attn_forward(q, k, v, 0.125, True, **kw)
    got = _bwd(q, k, v, do, out, lse, True, True, **kw)
    ptr = _bwd(q, k, v, do, out, lse, True, False, **kw)
    for name, a, b in zip("qkv", got, ptr):
        assert not torch.isnan(a).any(), f"d{name}: an unwritten gradient row"
        torch.testing.assert_close(a, b, rtol=0, atol=_path_atol(b), msg=f"d{name}: TMA vs pointer path")


def test_bwd_tma_request_policy(monkeypatch):
    """The backward takes descriptors when its config or TILEFLASH_TMA asks; by default only for
    BWD_TMA_HEAD_DIMS (D = 128 and 256, measured faster) and where the forward would use them."""
    from tileflash.ops import backward as B

    monkeypatch.delenv("TILEFLASH_TMA", raising=False)
    assert B.bwd_tma_requested({"USE_TMA": True}) and not B.bwd_tma_requested({"USE_TMA": False})
    monkeypatch.setenv("TILEFLASH_TMA", "1")
    assert B.bwd_tma_requested(None, torch.device("cpu"))
    monkeypatch.setenv("TILEFLASH_TMA", "0")
    assert not B.bwd_tma_requested(None, torch.device("cpu"))
    monkeypatch.delenv("TILEFLASH_TMA")
    assert not B.bwd_tma_requested(None, torch.device("cpu"))  # CPU: the forward's rule says no
    assert 128 in B.BWD_TMA_HEAD_DIMS and 256 in B.BWD_TMA_HEAD_DIMS  # the head dims measured faster
    assert 64 not in B.BWD_TMA_HEAD_DIMS and 96 not in B.BWD_TMA_HEAD_DIMS and 192 not in B.BWD_TMA_HEAD_DIMS
    monkeypatch.setattr(B, "tma_requested", lambda config, device: True)  # as on Hopper
    assert B.bwd_tma_requested(None, None, 128) and not B.bwd_tma_requested(None, None, 64)
