"""Tests of the tiled CPU path (tileflash.cpu) against the eager reference."""

import itertools
import math

import pytest
import torch

from tileflash.cpu import attention_backward_cpu, attention_forward_cpu
from tileflash.reference import attention_ref

SEQLEN_PAIRS = [(1, 1), (1, 17), (17, 1), (63, 65), (65, 63), (113, 17), (17, 113), (113, 113)]
HEADS = [(4, 4), (4, 2), (3, 1)]  # MHA, GQA, MQA
HEADDIMS = [16, 40, 72]
# small blocks so that most shapes have ragged tail blocks and several Q/K chunks
BLOCKS = dict(block_m=32, block_n=16)

CASES = [
    (sq, sk, h, hk, HEADDIMS[i % len(HEADDIMS)], causal)
    for i, ((sq, sk), (h, hk), causal) in enumerate(
        itertools.product(SEQLEN_PAIRS, HEADS, [False, True])
    )
]


def _inputs(b, sq, sk, h, hk, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g, dtype=dtype)
    k = torch.randn(b, sk, hk, d, generator=g, dtype=dtype)
    v = torch.randn(b, sk, hk, d, generator=g, dtype=dtype)
    return q, k, v


def _ref_with_grads(q, k, v, dout, scale, causal):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = attention_ref(q64, k64, v64, softmax_scale=scale, causal=causal)
    dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    return out.detach(), lse.detach(), dq, dk, dv


def _assert_close(actual, expected, tol, name):
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    err = (actual.double() - expected).abs().max().item() if actual.numel() else 0.0
    bound = tol * max(1.0, expected.abs().max().item() if expected.numel() else 0.0)
    assert err <= bound, f"{name}: max abs err {err:.3e} > {bound:.3e}"


@pytest.mark.parametrize("sq,sk,h,hk,d,causal", CASES)
def test_forward_backward_vs_reference(sq, sk, h, hk, d, causal):
    b = 2
    q, k, v = _inputs(b, sq, sk, h, hk, d, seed=sq * 7 + sk + d)
    dout = torch.randn(b, sq, h, d, generator=torch.Generator().manual_seed(1))
    scale = 1.0 / math.sqrt(d)

    out, lse = attention_forward_cpu(q, k, v, scale, causal, **BLOCKS)
    assert out.dtype == torch.float32 and out.shape == q.shape and out.is_contiguous()
    assert lse.dtype == torch.float32 and lse.shape == (b, h, sq)
    r_out, r_lse, r_dq, r_dk, r_dv = _ref_with_grads(q, k, v, dout, scale, causal)
    _assert_close(out, r_out, 1e-5, "out")
    finite = torch.isfinite(r_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    torch.testing.assert_close(lse.double()[finite], r_lse[finite], rtol=1e-5, atol=1e-5)

    dq, dk, dv = attention_backward_cpu(dout, q, k, v, out, lse, scale, causal, **BLOCKS)
    for t, ref in ((dq, q), (dk, k), (dv, v)):
        assert t.dtype == ref.dtype and t.shape == ref.shape and t.is_contiguous()
    _assert_close(dq, r_dq, 5e-5, "dq")
    _assert_close(dk, r_dk, 5e-5, "dk")
    _assert_close(dv, r_dv, 5e-5, "dv")


@pytest.mark.parametrize("block_m,block_n", [(1, 1), (7, 5), (256, 256), (16, 64)])
def test_block_sizes_do_not_change_result(block_m, block_n):
    q, k, v = _inputs(1, 37, 29, 4, 2, 16, dtype=torch.float64, seed=3)
    dout = torch.randn_like(q)
    for causal in (False, True):
        r_out, r_lse, r_dq, r_dk, r_dv = _ref_with_grads(q, k, v, dout, 0.25, causal)
        out, lse = attention_forward_cpu(q, k, v, 0.25, causal, block_m, block_n)
        assert out.dtype == torch.float64 and lse.dtype == torch.float64
        torch.testing.assert_close(out, r_out, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(lse, r_lse, rtol=1e-10, atol=1e-10)
        grads = attention_backward_cpu(dout, q, k, v, out, lse, 0.25, causal, block_m, block_n)
        for g, r in zip(grads, (r_dq, r_dk, r_dv)):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


class _CPUAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, block_m, block_n):
        out, lse = attention_forward_cpu(q, k, v, scale, causal, block_m, block_n)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, causal, block_m, block_n)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, block_m, block_n = ctx.args
        dq, dk, dv = attention_backward_cpu(dout, q, k, v, out, lse, scale, causal, block_m, block_n)
        return dq, dk, dv, None, None, None, None


@pytest.mark.parametrize(
    "sq,sk,h,hk,causal",
    [(3, 5, 2, 2, False), (5, 3, 2, 1, True), (4, 4, 4, 2, True), (1, 6, 2, 1, True)],
)
def test_gradcheck_float64(sq, sk, h, hk, causal):
    q, k, v = _inputs(1, sq, sk, h, hk, 4, dtype=torch.float64, seed=sq + 10 * sk)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    fn = lambda q, k, v: _CPUAttention.apply(q, k, v, 0.7, causal, 2, 2)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("h,hk", [(2, 2), (4, 1)])
def test_fully_masked_rows(h, hk):
    sq, sk = 40, 9  # causal, bottom-right: the first 31 query rows see no key
    q, k, v = _inputs(2, sq, sk, h, hk, 16, seed=5)
    dout = torch.randn_like(q)
    out, lse = attention_forward_cpu(q, k, v, 0.25, True, block_m=8, block_n=4)
    n_empty = sq - sk
    assert torch.all(out[:, :n_empty] == 0)
    assert torch.all(torch.isneginf(lse[:, :, :n_empty]))
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, n_empty:]).all()
    dq, dk, dv = attention_backward_cpu(dout, q, k, v, out, lse, 0.25, True, block_m=8, block_n=4)
    assert torch.all(dq[:, :n_empty] == 0)
    for t in (dq, dk, dv):
        assert torch.isfinite(t).all()
    r_out, _, r_dq, r_dk, r_dv = _ref_with_grads(q, k, v, dout, 0.25, True)
    _assert_close(out, r_out, 1e-5, "out")
    _assert_close(dq, r_dq, 5e-5, "dq")
    _assert_close(dk, r_dk, 5e-5, "dk")
    _assert_close(dv, r_dv, 5e-5, "dv")


@pytest.mark.parametrize("causal", [False, True])
def test_non_contiguous_inputs(causal):
    b, h, hk, sq, sk, d = 2, 4, 2, 33, 47, 24
    g = torch.Generator().manual_seed(7)
    # (B, H, S, D) storage, transposed to the (B, S, H, D) layout -> non-contiguous views
    q = torch.randn(b, h, sq, d, generator=g).transpose(1, 2)
    k = torch.randn(b, hk, sk, d, generator=g).transpose(1, 2)
    v = torch.randn(b, hk, sk, 2 * d, generator=g)[..., ::2].transpose(1, 2)  # strided last dim too
    dout = torch.randn(b, h, sq, d, generator=g).transpose(1, 2)
    assert not any(t.is_contiguous() for t in (q, k, v, dout))
    originals = [t.clone() for t in (q, k, v, dout)]

    out, lse = attention_forward_cpu(q, k, v, 0.2, causal, block_m=16, block_n=16)
    dq, dk, dv = attention_backward_cpu(dout, q, k, v, out, lse, 0.2, causal, block_m=16, block_n=16)
    out_c, lse_c = attention_forward_cpu(*(t.contiguous() for t in (q, k, v)), 0.2, causal, 16, 16)
    grads_c = attention_backward_cpu(
        dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), out_c, lse_c, 0.2, causal, 16, 16
    )
    torch.testing.assert_close(out, out_c)
    torch.testing.assert_close(lse, lse_c)
    for a, c in zip((dq, dk, dv), grads_c):
        torch.testing.assert_close(a, c)
    r_out, _, r_dq, r_dk, r_dv = _ref_with_grads(q, k, v, dout, 0.2, causal)
    _assert_close(out, r_out, 1e-5, "out")
    _assert_close(dq, r_dq, 5e-5, "dq")
    _assert_close(dk, r_dk, 5e-5, "dk")
    _assert_close(dv, r_dv, 5e-5, "dv")
    for t, o in zip((q, k, v, dout), originals):  # inputs untouched
        assert torch.equal(t, o)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    q, k, v = _inputs(1, 50, 70, 4, 2, 32, dtype=dtype, seed=11)
    dout = torch.randn_like(q)
    out, lse = attention_forward_cpu(q, k, v, 0.2, True, block_m=16, block_n=32)
    assert out.dtype == dtype and lse.dtype == torch.float32
    dq, dk, dv = attention_backward_cpu(dout, q, k, v, out, lse, 0.2, True, block_m=16, block_n=32)
    assert (dq.dtype, dk.dtype, dv.dtype) == (dtype,) * 3
    r_out, r_lse, r_dq, r_dk, r_dv = _ref_with_grads(q, k, v, dout, 0.2, True)
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    _assert_close(out, r_out, tol, "out")
    _assert_close(dq, r_dq, 2 * tol, "dq")
    _assert_close(dk, r_dk, 2 * tol, "dk")
    _assert_close(dv, r_dv, 2 * tol, "dv")


@pytest.mark.parametrize("shift", [0, -3, 5, -40, 100])
def test_causal_shift(shift):
    """Explicit causal_shift (0 = top-left); also shifts that hide or show everything."""
    q, k, v = _inputs(1, 21, 30, 4, 2, 16, dtype=torch.float64, seed=13)
    dout = torch.randn_like(q)
    q64, k64, v64 = (t.clone().requires_grad_() for t in (q, k, v))
    r_out, r_lse = attention_ref(q64, k64, v64, 0.3, causal=True, causal_shift=shift)
    r_grads = torch.autograd.grad(r_out, (q64, k64, v64), dout)
    out, lse = attention_forward_cpu(q, k, v, 0.3, True, 8, 8, causal_shift=shift)
    torch.testing.assert_close(out, r_out, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(lse, r_lse, rtol=1e-10, atol=1e-10)
    grads = attention_backward_cpu(dout, q, k, v, out, lse, 0.3, True, 8, 8, causal_shift=shift)
    for g, r in zip(grads, r_grads):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)
