"""Tests of the plain references in tileflash.reference."""

import math

import numpy as np
import pytest
import torch

from tileflash.reference import (
    attention_ref,
    causal_visible_mask,
    online_softmax_attention_numpy,
    online_softmax_merge,
    two_pass_softmax_attention_numpy,
)


# ---------------------------------------------------------------------------
# NumPy online softmax vs two-pass
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 1), (7, 50), (33, 17), (64, 64)])
@pytest.mark.parametrize("block_n", [1, 3, 7, 16, 64, 100])
def test_online_matches_two_pass(seqlen_q, seqlen_k, block_n):
    rng = np.random.default_rng(seqlen_q * 1000 + seqlen_k * 10 + block_n)
    d, dv = 24, 20
    q = rng.standard_normal((seqlen_q, d))
    k = rng.standard_normal((seqlen_k, d))
    v = rng.standard_normal((seqlen_k, dv))
    # large scale spreads the scores so the running max changes often
    for scale in (None, 3.0):
        out, lse = online_softmax_attention_numpy(q, k, v, block_n, scale, return_lse=True)
        ref, ref_lse = two_pass_softmax_attention_numpy(q, k, v, scale, return_lse=True)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lse, ref_lse, rtol=1e-12, atol=1e-12)


def _softmax_direct(s, v):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)) @ v


@pytest.mark.parametrize("block_n", [1, 4, 5, 13, 40])
def test_online_with_masked_columns_and_rows(block_n):
    rng = np.random.default_rng(block_n)
    sq, sk, d = 12, 37, 8
    q = rng.standard_normal((sq, d))
    k = rng.standard_normal((sk, d))
    v = rng.standard_normal((sk, d))
    mask = rng.random((sq, sk)) > 0.4
    mask[:, :9] = False  # leading masked columns: first blocks are all -inf for every row
    mask[:, 20] = False  # a masked column in the middle
    mask[3] = False  # fully masked rows
    mask[7] = False
    mask[5, :] = False
    mask[5, -1] = True  # only the very last key is visible
    with np.errstate(all="raise"):  # no invalid operation (NaN) allowed anywhere
        out, lse = online_softmax_attention_numpy(q, k, v, block_n, mask=mask, return_lse=True)
        ref, ref_lse = two_pass_softmax_attention_numpy(q, k, v, mask=mask, return_lse=True)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(out[3], 0.0)
    np.testing.assert_array_equal(out[7], 0.0)
    assert np.isneginf(lse[3]) and np.isneginf(lse[7])
    np.testing.assert_allclose(lse[np.isfinite(ref_lse)], ref_lse[np.isfinite(ref_lse)], rtol=1e-12)
    np.testing.assert_allclose(out[5], v[-1], rtol=1e-12)
    # independent check of the visible rows against a direct softmax
    s = np.where(mask, (q @ k.T) / math.sqrt(d), -np.inf)
    rows = mask.any(axis=1)
    np.testing.assert_allclose(out[rows], _softmax_direct(s[rows], v), rtol=1e-12, atol=1e-12)


def test_merge_from_empty_state_with_all_inf_block():
    rows, d = 3, 4
    m = np.full(rows, -np.inf)
    l = np.zeros(rows)
    o = np.zeros((rows, d))
    s = np.full((rows, 5), -np.inf)
    v = np.ones((5, d))
    with np.errstate(all="raise"):
        m1, l1, o1 = online_softmax_merge(m, l, o, s, v)
    assert np.all(np.isneginf(m1)) and np.all(l1 == 0) and np.all(o1 == 0)
    # inputs untouched
    assert np.all(np.isneginf(m)) and np.all(l == 0)
    # a later finite block takes over exactly
    s2 = np.array([[0.0, 1.0], [2.0, -np.inf], [-np.inf, -np.inf]])
    v2 = np.arange(2 * d, dtype=float).reshape(2, d)
    with np.errstate(all="raise"):
        m2, l2, o2 = online_softmax_merge(m1, l1, o1, s2, v2)
    np.testing.assert_array_equal(m2[:2], [1.0, 2.0])
    assert np.isneginf(m2[2]) and l2[2] == 0
    np.testing.assert_allclose(o2[0] / l2[0], _softmax_direct(s2[:1], v2)[0])
    np.testing.assert_allclose(o2[1] / l2[1], v2[0])


def test_merge_order_of_blocks_irrelevant():
    rng = np.random.default_rng(0)
    s = rng.standard_normal((4, 30)) * 5
    v = rng.standard_normal((30, 6))
    blocks = [(0, 7), (7, 19), (19, 30)]
    results = []
    for order in ([0, 1, 2], [2, 0, 1], [1, 2, 0]):
        m, l, o = np.full(4, -np.inf), np.zeros(4), np.zeros((4, 6))
        for b in order:
            a, e = blocks[b]
            m, l, o = online_softmax_merge(m, l, o, s[:, a:e], v[a:e])
        results.append(o / l[:, None])
    for r in results:
        np.testing.assert_allclose(r, _softmax_direct(s, v), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------
# attention_ref
# ---------------------------------------------------------------------------


def _direct(q, k, v, scale, causal):
    """Per-head loop with torch.softmax; q (B,Sq,H,D), k/v (B,Sk,Hk,D)."""
    b, sq, h, d = q.shape
    sk, hk = k.shape[1], k.shape[2]
    out = torch.zeros(b, sq, h, v.shape[-1], dtype=q.dtype)
    lse = torch.full((b, h, sq), float("-inf"), dtype=q.dtype)
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            s = q[bi, :, hi] @ k[bi, :, kv].T * scale
            for i in range(sq):
                vis = torch.arange(sk) <= i + sk - sq if causal else torch.ones(sk, dtype=torch.bool)
                if not vis.any():
                    continue
                row = s[i][vis]
                out[bi, i, hi] = torch.softmax(row, 0) @ v[bi, :, kv][vis]
                lse[bi, hi, i] = torch.logsumexp(row, 0)
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sq,sk", [(5, 5), (3, 9), (9, 3), (1, 6)])
@pytest.mark.parametrize("h,hk", [(4, 4), (4, 2), (6, 1)])
def test_attention_ref_vs_direct(causal, sq, sk, h, hk):
    q = torch.randn(2, sq, h, 16, dtype=torch.float64)
    k = torch.randn(2, sk, hk, 16, dtype=torch.float64)
    v = torch.randn(2, sk, hk, 16, dtype=torch.float64)
    out, lse = attention_ref(q, k, v, causal=causal)
    assert out.dtype == torch.float64 and lse.dtype == torch.float64
    assert out.shape == q.shape and lse.shape == (2, h, sq)
    ref_out, ref_lse = _direct(q, k, v, 1 / math.sqrt(16), causal)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_attention_ref_dtypes_and_scale():
    q = torch.randn(1, 8, 2, 32, dtype=torch.float16)
    k = torch.randn(1, 8, 2, 32, dtype=torch.float16)
    v = torch.randn(1, 8, 2, 32, dtype=torch.float16)
    out, lse = attention_ref(q, k, v, softmax_scale=0.3)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    ref, ref_lse = _direct(q.double(), k.double(), v.double(), 0.3, False)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=1e-5, atol=1e-5)
    out16, lse16 = attention_ref(q, k, v, softmax_scale=0.3, upcast=False)
    assert out16.dtype == torch.float16 and lse16.dtype == torch.float32
    torch.testing.assert_close(out16.double(), ref, rtol=2e-2, atol=2e-2)


def test_attention_ref_fully_masked_rows():
    sq, sk = 7, 3  # causal, seqlen_q > seqlen_k: rows 0..3 see nothing
    q = torch.randn(2, sq, 2, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, sk, 2, 8, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, sk, 2, 8, dtype=torch.float64, requires_grad=True)
    for upcast in (True, False):
        out, lse = attention_ref(q, k, v, causal=True, upcast=upcast)
        assert not torch.isnan(out).any()
        assert torch.all(out[:, : sq - sk] == 0)
        assert torch.all(torch.isneginf(lse[:, :, : sq - sk]))
        assert torch.all(torch.isfinite(lse[:, :, sq - sk :]))
    out, _ = attention_ref(q, k, v, causal=True)
    out.sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()
    assert torch.all(q.grad[:, : sq - sk] == 0)
    # the causal mask itself
    m = causal_visible_mask(2, 5)
    assert m.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]


def test_attention_ref_gqa_mapping():
    """Query head h must use kv head h // (nheads // nheads_k)."""
    b, s, h, hk, d = 2, 6, 6, 2, 8
    q = torch.randn(b, s, h, d, dtype=torch.float64)
    k = torch.randn(b, s, hk, d, dtype=torch.float64)
    v = torch.randn(b, s, hk, d, dtype=torch.float64)
    out, lse = attention_ref(q, k, v)
    g = h // hk
    for hi in range(h):
        o1, l1 = attention_ref(q[:, :, hi : hi + 1], k[:, :, hi // g : hi // g + 1], v[:, :, hi // g : hi // g + 1])
        torch.testing.assert_close(out[:, :, hi : hi + 1], o1)
        torch.testing.assert_close(lse[:, hi : hi + 1], l1)
    # making kv head 1 different must change exactly query heads 3..5
    k2 = k.clone()
    k2[:, :, 1] += torch.randn(b, s, d, dtype=torch.float64)  # not a per-row constant shift
    out2, _ = attention_ref(q, k2, v)
    torch.testing.assert_close(out2[:, :, :g], out[:, :, :g])
    assert (out2[:, :, g:] - out[:, :, g:]).abs().amax() > 1e-3
    # identical to explicitly repeating k/v
    out3, _ = attention_ref(q, k.repeat_interleave(g, 2), v.repeat_interleave(g, 2))
    torch.testing.assert_close(out3, out)


@pytest.mark.parametrize("sq,sk", [(4, 9), (9, 4), (6, 6)])
def test_attention_ref_top_left_matches_sdpa(sq, sk):
    """causal_shift=0 is torch's top-left causal (SDPA is_causal=True)."""
    q = torch.randn(2, sq, 3, 8, dtype=torch.float64)
    k = torch.randn(2, sk, 3, 8, dtype=torch.float64)
    v = torch.randn(2, sk, 3, 8, dtype=torch.float64)
    out, _ = attention_ref(q, k, v, causal=True, causal_shift=0)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    ).transpose(1, 2)
    torch.testing.assert_close(out, sdpa)
    assert causal_visible_mask(2, 5, causal_shift=0).tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
    ]
