"""The tensor-descriptor (TMA) forward path (the default on sm90+ GPUs): same results as the pointer path.

The interpreter emulates descriptors (zero fill past the bounds on load, clipping on store), so
these run in CPU CI; on a GPU they run the real copy engine (sm90+). Outputs are NaN-poisoned so
that a row the clipped stores miss would show.

How close the two paths must be (:func:`_assert_same_path`): they run the same tiles and the same
arithmetic; only the summation order inside a dot may differ (a tile arrives transposed through
the descriptor, and the interpreter's numpy matmul picks its BLAS kernel by layout and by CPU:
OpenBLAS's AVX-512 kernels sum in another order than its Haswell ones, and a fixed 2e-6 failed
on an AVX-512 CPU). So the bound follows flash-attn's accuracy rule, measured on this machine:
each path may be off the fp64 reference by ``factor`` (2 for outputs, 3 for gradients, as in the
reference checks) times the error of plain PyTorch attention in fp32 (the precision both paths
accumulate in; the same-dtype baseline for fp32 inputs), so the two may differ by twice that,
plus the rounding atol of the output dtype:

    max |TMA - pointer| <= 2 * factor * max |torch_fp32 - ref64| + atol.

(On this repository's 2-core AVX-512 CI machine, the largest difference over 4 dO draws x 10
backward cases was 0.76 of that bound, 0.51 for the forward's LSE.)
"""

import pytest
import torch

import tileflash
from tileflash.ops.triton.forward import flash_attn_forward, tma_requested, tma_supported
from tileflash.reference import attention_ref

from helpers import (assert_error_rule, backend_device, check_lse, check_out, make_qkv, max_err, ref_grads,
                     rounding_atol)


def _assert_same_path(name, got, ptr, ref, base_err, factor, atol=None):
    """The descriptor path's ``got`` against the pointer path's ``ptr`` (see the module docstring):
    max |got - ptr| <= 2 * factor * base_err + atol, where ``base_err`` is the max error of plain
    PyTorch attention in fp32 against ``ref`` (fp64) and ``atol`` defaults to the rounding atol of
    ``ref`` in ``got``'s dtype."""
    atol = rounding_atol(ref.double(), got.dtype) if atol is None else atol
    assert_error_rule(f"{name} (TMA vs pointer path)", got, ptr, base_err, 2 * factor, atol)


def _fwd_refs(q, k, v, causal, scale=None, **features):
    """fp64 reference (out, lse) and the fp32 baseline's max errors (out, finite lse) against it."""
    ref, ref_lse = attention_ref(q.cpu().double(), k.cpu().double(), v.cpu().double(), softmax_scale=scale,
                                 causal=causal, **{n: (x.cpu().double() if isinstance(x, torch.Tensor) else x)
                                                   for n, x in features.items()})
    base, base_lse = attention_ref(q.cpu().float(), k.cpu().float(), v.cpu().float(), softmax_scale=scale,
                                   causal=causal, upcast=False,
                                   **{n: (x.cpu() if isinstance(x, torch.Tensor) else x) for n, x in features.items()})
    fin = torch.isfinite(ref_lse)
    return ref, ref_lse, max_err(base, ref), max_err(base_lse[fin], ref_lse[fin])


def _assert_same_fwd(out_t, lse_t, out_p, lse_p, ref, ref_lse, base_err, base_lse_err):
    _assert_same_path("out", out_t, out_p, ref, base_err, 2)
    fin = torch.isfinite(ref_lse).to(lse_t.device)
    assert torch.equal(torch.isinf(lse_t), torch.isinf(lse_p)), "lse: the -inf rows differ between the paths"
    # the LSE is fp32 whatever the inputs: its atol is one fp32 rounding of the largest LSE for fp32
    # inputs; for fp16/bf16 inputs (the GPU) 1e-4, the bound these tests have always held there
    ref_fin = ref_lse[fin.cpu()].double()
    eps = torch.finfo(torch.float32).eps
    atol = (eps * ref_fin.abs().max().item() if ref_fin.numel() else 0.0) if out_t.dtype == torch.float32 else 1e-4
    _assert_same_path("lse", lse_t[fin], lse_p[fin], ref_fin, base_lse_err, 2, atol)


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
    _assert_same_fwd(out_t, lse_t, out_p, lse_p, *_fwd_refs(q, k, v, causal))


def _varlen_refs(q, k, v, cu_q, cu_k, causal, scale, do=None, **features):
    """Per-sequence fp64 references of a varlen call, packed like its outputs: (out, lse (H, total_q),
    fp32 baseline's errors of out and lse) and, with ``do``, the gradients' (refs, baseline errors)."""
    cq, ck = cu_q.tolist(), cu_k.tolist()
    ref = torch.zeros(q.shape, dtype=torch.float64)
    base = torch.zeros(q.shape, dtype=torch.float64)
    ref_lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=torch.float64)
    base_lse = ref_lse.clone()
    grads = [torch.zeros(t.shape, dtype=torch.float64) for t in (q, k, v) for _ in range(2)]
    for b in range(len(cq) - 1):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        one = [t[None, s].cpu() for t, s in ((q, sq), (k, sk), (v, sk))]
        f64 = {n: x.cpu().double() if isinstance(x, torch.Tensor) else x for n, x in features.items()}
        f32 = {n: x.cpu() if isinstance(x, torch.Tensor) else x for n, x in features.items()}
        o, l_ = attention_ref(*(t.double() for t in one), softmax_scale=scale, causal=causal, **f64)
        ref[sq], ref_lse[:, sq] = o[0], l_[0]
        o, l_ = attention_ref(*(t.float() for t in one), softmax_scale=scale, causal=causal, upcast=False, **f32)
        base[sq], base_lse[:, sq] = o[0].double(), l_[0].double()
        if do is not None:
            for i, upcast in ((0, True), (1, False)):
                g = ref_grads(*(t.float() for t in one), do[None, sq].cpu().float(), causal, upcast=upcast,
                              scale=scale, **f32)
                grads[i][sq], grads[2 + i][sk], grads[4 + i][sk] = (x[0].double().cpu() for x in g)
    fin = torch.isfinite(ref_lse)
    res = (ref, ref_lse, max_err(base, ref), max_err(base_lse[fin], ref_lse[fin]))
    if do is None:
        return res
    return res, [(grads[2 * i], max_err(grads[2 * i + 1], grads[2 * i])) for i in range(3)]


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
    _assert_same_fwd(out_t, lse_t, out_p, lse_p, *_varlen_refs(q, k, v, cu_q, cu_k, False, 64 ** -0.5,
                                                               window_size=(7, 3), softcap=5.0, alibi_slopes=slopes))


def test_tma_request_policy():
    """On by default for compiled kernels on Hopper only; off in the interpreter, without a device
    and on CPU tensors; ``use_tma`` (Options.use_tma) overrides the default, and the config's
    USE_TMA overrides both."""
    from tileflash.ops.triton.forward import interpreting

    assert not tma_requested(None) and not tma_requested(None, torch.device("cpu"))
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        assert tma_requested(None, dev) == (not interpreting() and torch.cuda.get_device_capability(dev)[0] == 9)
    assert tma_requested({"USE_TMA": True}) and not tma_requested({"USE_TMA": False})
    assert tma_requested(None, use_tma=True) and tma_requested(None, torch.device("cpu"), use_tma=True)
    assert not tma_requested({"USE_TMA": False}, use_tma=True)
    assert not tma_requested(None, use_tma=False) and tma_requested({"USE_TMA": True}, use_tma=False)
    assert tma_requested({"BLOCK_M": 32}, use_tma=True)  # a config without USE_TMA leaves it to use_tma


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("d", [64, 128])
def test_pointer_path_default_configs_cuda(backend, dtype, d):
    """Options(use_tma=False): the Triton pointer path with its own default tiles (what GPUs before
    sm90 run), through the public call, against the reference."""
    if backend != "cuda":
        pytest.skip("the interpreter runs the pointer path by default (every other test here)")
    dt = getattr(torch, dtype)
    options = tileflash.Options(backend="triton", use_tma=False)
    for causal in (False, True):
        q, k, v = make_qkv(2, 1000, 1100, 8, 2, d, dt, "cuda", seed=d + 1)
        check_out(tileflash.flash_attn_func(q, k, v, causal=causal, options=options), q, k, v, causal)


def test_default_config_table():
    """The TMA path has its own swept tiles; without TMA the pointer-path table is unchanged."""
    from tileflash.ops.triton.forward import default_config

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
    from tileflash.ops.triton.forward import default_config

    if backend != "cuda" or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an sm90+ GPU (the interpreter runs bf16 as fp32 and small tiles)")
    dt = getattr(torch, dtype)
    for causal in (False, True):
        q, k, v = make_qkv(2, 1000, 1100, 8, 2, d, dt, "cuda", seed=d)
        out_t, lse_t = _run(q, k, v, causal, True, default_config=True)
        out_p, lse_p = _run(q, k, v, causal, False, tiles=default_config(d, causal, tma=True))
        check_out(out_t, q, k, v, causal)
        _assert_same_fwd(out_t, lse_t, out_p, lse_p, *_fwd_refs(q, k, v, causal))


def _dropout_keep(q, k, p, causal, seed):
    """The kernel's dropout keep mask (B, H, Sq, Sk) for this seed: it depends on (seed, b, h, i, j)
    and the lengths only, so a call with q = 0 (uniform probabilities over each row's visible keys)
    and V = the identity (head dim Sk) prints it into the output (as in test_dropout)."""
    b, sq, h, _ = q.shape
    sk, hk = k.shape[1], k.shape[2]
    q0 = torch.zeros(b, sq, h, sk, dtype=q.dtype, device=q.device)
    k0 = torch.zeros(b, sk, hk, sk, dtype=q.dtype, device=q.device)
    eye = torch.eye(sk, dtype=q.dtype, device=q.device)[None, :, None, :].expand(b, sk, hk, sk).contiguous()
    out, _ = flash_attn_forward(q0, k0, eye, 1.0, causal, dropout_p=p, seed=seed, config={"USE_TMA": False})
    rows = torch.arange(sq)[:, None]
    visible = (torch.arange(sk)[None, :] <= rows + sk - sq) if causal else torch.ones(sq, sk, dtype=torch.bool)
    n_vis = visible.sum(1).clamp(min=1).to(torch.float64)  # (Sq,)
    keep = out.cpu().double().permute(0, 2, 1, 3) * n_vis[:, None] * (1 - p) > 0.5  # (B, H, Sq, Sk)
    return keep & visible


def _dropout_ref(q, k, v, keep, p, causal, dtype):
    """Attention with an explicit keep mask (scaled by 1 / (1 - p)), computed in ``dtype`` on the CPU."""
    h, hk = q.shape[2], k.shape[2]
    qs, ks, vs = (t.cpu().to(dtype) for t in (q, k, v))
    ks, vs = ks.repeat_interleave(h // hk, 2), vs.repeat_interleave(h // hk, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", qs, ks) * q.shape[-1] ** -0.5
    if causal:
        i, j = torch.arange(q.shape[1])[:, None], torch.arange(k.shape[1])[None, :]
        s = s.masked_fill(j > i + k.shape[1] - q.shape[1], float("-inf"))
    probs = torch.softmax(s, -1) * keep.to(dtype) / (1 - p)
    return torch.einsum("bhqk,bkhd->bqhd", probs, vs)


def test_tma_dropout(gpu_or_interpreter):
    """Dropout's mask depends only on (seed, b·h, i, j): the same on both paths, which agree (and
    meet flash-attn's rule against an fp64 reference with the kernel's own mask)."""
    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    q, k, v = make_qkv(2, 45, 70, 4, 2, 64, dt, dev, seed=21)
    seed = torch.tensor([1234], dtype=torch.int64, device=dev)
    out_t, lse_t = _run(q, k, v, True, True, dropout_p=0.3, seed=seed)
    out_p, lse_p = _run(q, k, v, True, False, dropout_p=0.3, seed=seed)
    keep = _dropout_keep(q, k, 0.3, True, seed)
    assert 0.6 < keep.double().sum().item() / (2 * 4 * sum(min(70, i + 26) for i in range(45))) < 0.8  # a real mask
    ref = _dropout_ref(q, k, v, keep, 0.3, True, torch.float64)
    base_err = max_err(_dropout_ref(q, k, v, keep, 0.3, True, torch.float32), ref)
    eager_err = max_err(_dropout_ref(q, k, v, keep, 0.3, True, dt), ref)
    assert_error_rule("out (TMA path) vs fp64 with the kernel's mask", out_t, ref, eager_err, 2, rounding_atol(ref, dt))
    _, ref_lse, _, base_lse_err = _fwd_refs(q, k, v, True)  # the LSE is that of the scores: no dropout in it
    _assert_same_fwd(out_t, lse_t, out_p, lse_p, ref, ref_lse, base_err, base_lse_err)


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
    from tileflash.ops.triton.backward import flash_attn_backward

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
    dev = backend_device(gpu_or_interpreter)
    dt = torch.float16 if dev == "cuda" else torch.float32
    q, k, v = make_qkv(2, sq, sk, 4, hk, d, dt, dev, seed=sq * 3 + sk)
    do = make_qkv(2, sq, sk, 4, hk, d, dt, dev, seed=sq * 3 + sk + 10)[0]
    out, lse = flash_attn_forward(q, k, v, d ** -0.5, causal)
    got = _bwd(q, k, v, do, out, lse, causal, True)
    ptr = _bwd(q, k, v, do, out, lse, causal, False)
    ref = ref_grads(q, k, v, do, causal, upcast=True)
    eager = ref_grads(q, k, v, do, causal, upcast=False)
    # the baseline of the path comparison: plain PyTorch in fp32, the precision both paths accumulate in
    base = eager if dt == torch.float32 else ref_grads(q.float(), k.float(), v.float(), do.float(), causal,
                                                        upcast=False)
    for name, g, p, r, e, b in zip("qkv", got, ptr, ref, eager, base):
        assert not torch.isnan(g).any(), f"d{name}: an unwritten gradient row"
        _assert_same_path(f"d{name}", g, p, r, max_err(b, r), 3)
        assert_error_rule(f"d{name} (TMA path) vs fp64", g, r, max_err(e, r), 3, rounding_atol(r, dt))


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
    _, grad_refs = _varlen_refs(q, k, v, cu, cu, True, 0.125, do=do, window_size=(9, 0), softcap=5.0,
                                alibi_slopes=slopes)
    for name, a, b, (r, base_err) in zip("qkv", got, ptr, grad_refs):
        assert not torch.isnan(a).any(), f"d{name}: an unwritten gradient row"
        _assert_same_path(f"d{name}", a, b, r, base_err, 3)


def test_bwd_tma_request_policy(monkeypatch):
    """The backward takes descriptors when its config or ``use_tma`` (Options.use_tma) asks; by
    default only for BWD_TMA_HEAD_DIMS (D = 128 and 256, measured faster) and where the forward
    would use them."""
    from tileflash.ops.triton import backward as B

    assert B.bwd_tma_requested({"USE_TMA": True}) and not B.bwd_tma_requested({"USE_TMA": False})
    assert B.bwd_tma_requested(None, torch.device("cpu"), use_tma=True)
    assert not B.bwd_tma_requested(None, torch.device("cpu"), use_tma=False)
    assert not B.bwd_tma_requested({"USE_TMA": False}, torch.device("cpu"), use_tma=True)  # the config wins
    assert B.bwd_tma_requested({"USE_TMA": True}, torch.device("cpu"), use_tma=False)
    assert not B.bwd_tma_requested(None, torch.device("cpu"))  # CPU: the forward's rule says no
    assert 128 in B.BWD_TMA_HEAD_DIMS and 256 in B.BWD_TMA_HEAD_DIMS  # the head dims measured faster
    assert 64 not in B.BWD_TMA_HEAD_DIMS and 96 not in B.BWD_TMA_HEAD_DIMS and 192 not in B.BWD_TMA_HEAD_DIMS
    monkeypatch.setattr(B, "tma_requested", lambda config, device: True)  # as on Hopper
    assert B.bwd_tma_requested(None, None, 128) and not B.bwd_tma_requested(None, None, 64)
    assert B.bwd_tma_requested(None, None, 64, use_tma=True) and not B.bwd_tma_requested(None, None, 128, use_tma=False)
