"""Forward pass: tileflash against an fp64 reference, on every backend this machine has.

Accuracy rule (flash-attn's): max |out - ref64| <= 2 * max |eager_same_dtype - ref64| + atol,
where atol is twice the rounding error of the reference in the tested dtype (helpers.py).
"""


import pytest
import torch

import tileflash
from tileflash.ops import route
from tileflash.ops.triton import forward as fwd_mod

from helpers import HAS_CUDA, _rand, backend_device, check_cuda_out, check_lse, check_out, make_qkv, rounding_atol

SEQLENS = [1, 17, 63, 65, 113, 203]


def ids(**kw):
    return "-".join(f"{k}{v}" for k, v in kw.items())


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", [(a, b) for a in SEQLENS for b in SEQLENS if a <= b],
                         ids=lambda x: str(x))
def test_seqlens(backend, sq, sk, causal):
    """Odd lengths in both orders (Sq<=Sk here, Sq>=Sk below), GQA, head dim 40."""
    dev = backend_device(backend)
    for a, b in {(sq, sk), (sk, sq)}:
        q, k, v = make_qkv(1, a, b, 4, 2, 40, torch.float32, dev, seed=a * 1000 + b)
        out, lse, _ = tileflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        _, ref_lse = check_out(out, q, k, v, causal)
        check_lse(lse, ref_lse, q.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [16, 40, 64, 72, 128, 256])
def test_head_dims(backend, d, causal, dtype):
    dev = backend_device(backend)
    q, k, v = make_qkv(1, 65, 113, 2, 1, d, dtype, dev, seed=d)
    out, lse, _ = tileflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    _, ref_lse = check_out(out, q, k, v, causal)
    check_lse(lse, ref_lse, dtype)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("h,hk", [(6, 6), (6, 2), (6, 1)], ids=["mha", "gqa", "mqa"])
def test_gqa(backend, h, hk, causal):
    dev = backend_device(backend)
    q, k, v = make_qkv(2, 63, 65, h, hk, 32, torch.float32, dev, seed=h + hk)
    out = tileflash.flash_attn_func(q, k, v, causal=causal)
    check_out(out, q, k, v, causal)
    # the mapping is h -> h // (H / Hk): compare each query head against its own kv head
    g = h // hk
    for head in range(h):
        o1 = tileflash.flash_attn_func(q[:, :, head:head + 1], k[:, :, head // g:head // g + 1],
                                       v[:, :, head // g:head // g + 1], causal=causal)
        torch.testing.assert_close(o1, out[:, :, head:head + 1], rtol=1e-5, atol=1e-5)


def test_fully_masked_rows(backend):
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see no key."""
    dev = backend_device(backend)
    q, k, v = make_qkv(2, 50, 20, 2, 2, 32, torch.float32, dev, seed=5)
    out, lse, _ = tileflash.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out[:, :30].cpu(), torch.zeros_like(out[:, :30]).cpu())
    assert torch.isneginf(lse[:, :, :30]).all()
    assert torch.isfinite(lse[:, :, 30:]).all()
    check_out(out, q, k, v, True)


def test_seqlen_k_zero_and_q_zero(backend, monkeypatch):
    dev = backend_device(backend)

    def no_launch(*a, **kw):
        raise AssertionError("a kernel was launched for an empty problem")

    monkeypatch.setattr(fwd_mod, "_attn_fwd", type("X", (), {"__getitem__": lambda s, g: no_launch})())
    monkeypatch.setattr(fwd_mod, "_attn_fwd_tuned", type("X", (), {"__getitem__": lambda s, g: no_launch})())
    q, k, v = make_qkv(2, 0, 7, 2, 2, 16, torch.float32, dev)
    out = tileflash.flash_attn_func(q, k, v)
    assert out.shape == (2, 0, 2, 16)
    q, k, v = make_qkv(2, 5, 0, 2, 2, 16, torch.float32, dev)
    out, lse, _ = tileflash.flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(out.cpu(), torch.zeros(2, 5, 2, 16)) and torch.isneginf(lse).all()


def test_noncontiguous_no_copy(backend, monkeypatch):
    """Strided views (a packed qkv buffer, an SDPA-layout transpose) are read in place."""
    dev = backend_device(backend)
    b, s, h, d = 2, 37, 3, 24
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    qkv = _rand((b, s, 3, h, d + 8), dt, dev, 9)[..., :d]   # (b, s, 3, h, d), padded rows
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    from tileflash import interface
    assert interface._unit_last_stride(q) is q
    out = tileflash.flash_attn_func(q, k, v, causal=True)
    check_out(out, q.contiguous(), k.contiguous(), v.contiguous(), True)
    qt = _rand((b, h, s, d), dt, dev, 10).transpose(1, 2)   # (b, s, h, d) view
    out = tileflash.flash_attn_func(qt, k, v)
    check_out(out, qt.contiguous(), k.contiguous(), v.contiguous(), False)


@pytest.mark.parametrize("scale", [0.37, -0.37, 0.0], ids=["pos", "neg", "zero"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softmax_scale(backend, scale, causal):
    """A negative or zero scale takes the guarded max (the unmasked blocks' raw-max FMA shortcut
    assumes scale > 0); 65 keys span unmasked and masked blocks on every backend's tiles."""
    dev = backend_device(backend)
    q, k, v = make_qkv(1, 33, 65, 2, 2, 16, torch.float32, dev, seed=3)
    out = tileflash.flash_attn_func(q, k, v, softmax_scale=scale, causal=causal)
    check_out(out, q, k, v, causal, scale=scale)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk", [(17, 17), (17, 40), (40, 17)])
def test_sdpa_matches_torch(backend, sq, sk, causal):
    """Drop-in for torch SDPA, including its top-left causal alignment and enable_gqa."""
    dev = backend_device(backend)
    q, k, v = (t.transpose(1, 2) for t in make_qkv(2, sq, sk, 4, 2, 32, torch.float32, dev, seed=sq + sk))
    out = tileflash.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    ref = sdpa(q.cpu().double(), k.cpu().double(), v.cpu().double(), is_causal=causal, enable_gqa=True)
    eager = sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    err = (out.cpu().double() - ref).abs().max().item()
    eager_err = (eager.cpu().double() - ref).abs().max().item()
    assert err <= 2 * eager_err + rounding_atol(ref, q.dtype)


def test_kernel_writes_every_element(backend):
    """NaN-poisoned out/lse buffers: the kernel must overwrite every element."""
    if backend == "tiled":
        pytest.skip("the tiled path allocates its own outputs; this checks the Triton kernel")
    dev = backend_device(backend)
    for (sq, sk, causal) in [(113, 203, False), (203, 113, True), (65, 65, True)]:
        q, k, v = make_qkv(2, sq, sk, 2, 1, 40, torch.float32, dev, seed=sq)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((2, 2, sq), float("nan"), device=dev)
        fwd_mod.flash_attn_forward(q, k, v, 40 ** -0.5, causal, out=out, lse=lse)
        assert not torch.isnan(out).any() and not torch.isnan(lse).any()
        check_out(out, q, k, v, causal)


# ---------------------------------------------------------------------------------------------
# GPU-only: fp16/bf16 up to 8k (skipped without CUDA).
# ---------------------------------------------------------------------------------------------

@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("sq,sk,d", [(1023, 1025, 64), (1025, 1023, 128), (4096, 4096, 128),
                                      (8192, 8192, 64), (2048, 8192, 128), (113, 203, 256),
                                      (1024, 1024, 111)])
def test_cuda_long(sq, sk, d, causal, dtype):
    q, k, v = make_qkv(2, sq, sk, 4, 2, d, dtype, "cuda", seed=sq + d)
    out = torch.full((2, sq, 4, d), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((2, 4, sq), float("nan"), device="cuda")
    # the router (as the public functions): the Gluon kernels on Hopper where they take the call
    route.forward(q, k, v, d ** -0.5, causal, out=out, lse=lse)
    check_cuda_out(out, lse, q, k, v, causal)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_cuda_sdpa_bf16(causal):
    q, k, v = make_qkv(2, 777, 1500, 8, 8, 128, torch.bfloat16, "cuda", seed=7)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out = tileflash.scaled_dot_product_attention(q, k, v, is_causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    eager = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    err = (out.float() - ref).abs().max().item()
    assert err <= 2 * (eager.float() - ref).abs().max().item() + rounding_atol(ref, torch.bfloat16)
