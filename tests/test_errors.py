"""Bad input gets a ValueError/TypeError naming the argument and saying what to do."""

import pytest
import torch

import tileflash
from tileflash.interface import flash_attn_func, scaled_dot_product_attention


def qkv(b=2, sq=8, sk=8, h=4, hk=4, d=16, dtype=torch.float32):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype))


def test_wrong_ndim():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"q must be 4-D"):
        flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match=r"value must be 4-D"):
        scaled_dot_product_attention(q, k, v[0])


def test_not_a_tensor():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"k must be a torch.Tensor"):
        flash_attn_func(q, k.numpy(), v)


def test_batch_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"batch size mismatch"):
        flash_attn_func(q, k[:1], v[:1])


def test_headdim_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"head dim mismatch"):
        flash_attn_func(q, k[..., :8], v[..., :8])


def test_kv_seqlen_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k and v must have the same seqlen"):
        flash_attn_func(q, k, v[:, :5])


def test_kv_heads_mismatch():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"k and v must have the same number of heads"):
        flash_attn_func(q, k, v[:, :, :2])


def test_heads_not_multiple():
    q, k, v = qkv(h=6, hk=4)
    with pytest.raises(ValueError, match=r"k has 4 heads but q has 6.*multiple"):
        flash_attn_func(q, k, v)


def test_sdpa_gqa_needs_flag():
    q, k, v = (t.transpose(1, 2) for t in qkv(h=4, hk=2))
    with pytest.raises(ValueError, match=r"enable_gqa=True"):
        scaled_dot_product_attention(q, k, v)


def test_headdim_too_large():
    q, k, v = qkv(d=257)
    with pytest.raises(ValueError, match=r"head dim is 257.*1 to 256"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64])
def test_unsupported_dtype(dtype):
    q, k, v = (t.to(dtype) for t in qkv())
    with pytest.raises(TypeError, match=r"q has dtype .* not supported.*use one of"):
        flash_attn_func(q, k, v)


def test_float64_rejected_by_kernels(monkeypatch):
    # float64 exists only on the tiled CPU path; the Triton kernels (interpreter/GPU) reject it
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from tileflash.ops import route
    if not route._KERNELS_INTERPRETED:
        pytest.skip("kernels built for the GPU: the interpreter path is not available")
    q, k, v = qkv(dtype=torch.float64)
    with pytest.raises(TypeError, match=r"float64 is supported on the tiled CPU path only"):
        flash_attn_func(q, k, v)


def test_mixed_dtypes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"same dtype"):
        flash_attn_func(q, k.half(), v)


def test_different_devices():
    q, k, v = qkv()
    meta = k.to("meta")
    with pytest.raises(ValueError, match=r"same device"):
        flash_attn_func(q, meta, v)


def test_bad_scale_and_flags():
    q, k, v = qkv()
    with pytest.raises(TypeError, match=r"softmax_scale"):
        flash_attn_func(q, k, v, softmax_scale="0.1")
    with pytest.raises(ValueError, match=r"softmax_scale must be finite"):
        flash_attn_func(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(TypeError, match=r"causal must be a bool"):
        flash_attn_func(q, k, v, causal=1)


def test_sdpa_unsupported_features():
    q, k, v = (t.transpose(1, 2) for t in qkv())
    with pytest.raises(NotImplementedError, match=r"attn_mask"):
        scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match=r"dropout"):
        scaled_dot_product_attention(q, k, v, dropout_p=0.1)


def test_public_names():
    assert set(tileflash.__all__) == {
        "Options", "flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func", "flash_attn_varlen_func",
        "flash_attn_varlen_kvpacked_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache",
        "scaled_dot_product_attention",
        "__version__"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_float32_on_gpu_recommends_bf16():
    q, k, v = (t.cuda() for t in qkv())
    with pytest.raises(TypeError, match=r"float32 on the GPU is not supported.*bfloat16"):
        flash_attn_func(q, k, v)


def test_interpret_set_after_import_is_explained(monkeypatch):
    """Kernels built for the GPU cannot serve CPU tensors: say how to fix it instead of crashing."""
    from tileflash.ops import route
    monkeypatch.setattr(route, "_KERNELS_INTERPRETED", False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match=r"TRITON_INTERPRET=1 was set after tileflash"):
        flash_attn_func(q, k, v)
