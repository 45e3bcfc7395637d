"""flash-attn 2 extras (sliding window, softcap, ALiBi) in the reference and the tiled CPU path."""

import math
from unittest import mock

import pytest
import torch

from tileflash import cpu
from tileflash.cpu import attention_backward_cpu, attention_forward_cpu
from tileflash.reference import attention_ref, causal_visible_mask, visible_mask

BLOCKS = dict(block_m=16, block_n=8)  # several Q/K chunks with ragged tails


def _inputs(b, sq, sk, h, hk, d, dtype=torch.float32, seed=0, q_gain=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, sq, h, d, generator=g, dtype=dtype) * q_gain
    k = torch.randn(b, sk, hk, d, generator=g, dtype=dtype)
    v = torch.randn(b, sk, hk, d, generator=g, dtype=dtype)
    dout = torch.randn(b, sq, h, d, generator=g, dtype=dtype)
    return q, k, v, dout


def _slopes(kind, b, h, seed=0):
    """fp32 slopes like flash-attn's: (nheads,) or (batch, nheads)."""
    if kind is None:
        return None
    g = torch.Generator().manual_seed(seed + 100)
    shape = (h,) if kind == "h" else (b, h)
    return (torch.rand(shape, generator=g) * 0.6 + 0.05).float()


def _ref_with_grads(q, k, v, dout, scale, causal, **kw):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = attention_ref(q64, k64, v64, softmax_scale=scale, causal=causal, **kw)
    dq, dk, dv = torch.autograd.grad(out, (q64, k64, v64), dout.double())
    return out.detach(), lse.detach(), dq, dk, dv


def _assert_close(actual, expected, tol, name):
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    err = (actual.double() - expected).abs().max().item() if actual.numel() else 0.0
    bound = tol * max(1.0, expected.abs().max().item() if expected.numel() else 0.0)
    assert err <= bound, f"{name}: max abs err {err:.3e} > {bound:.3e}"


def _check_vs_ref(sq, sk, h, hk, d, causal, window, softcap, alibi, seed, b=2, causal_shift=None, q_gain=1.0):
    q, k, v, dout = _inputs(b, sq, sk, h, hk, d, seed=seed, q_gain=q_gain)
    slopes = _slopes(alibi, b, h, seed)
    kw = dict(causal_shift=causal_shift, window_size=window, softcap=softcap, alibi_slopes=slopes)
    scale = 1.0 / math.sqrt(d)
    out, lse = attention_forward_cpu(q, k, v, scale, causal, **BLOCKS, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.shape == (b, h, sq)
    r_out, r_lse, r_dq, r_dk, r_dv = _ref_with_grads(q, k, v, dout, scale, causal, **kw)
    _assert_close(out, r_out, 1e-5, "out")
    finite = torch.isfinite(r_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.all(torch.isneginf(lse[~finite]))
    torch.testing.assert_close(lse.double()[finite], r_lse[finite], rtol=1e-5, atol=1e-5)
    dq, dk, dv = attention_backward_cpu(dout, q, k, v, out, lse, scale, causal, **BLOCKS, **kw)
    _assert_close(dq, r_dq, 5e-5, "dq")
    _assert_close(dk, r_dk, 5e-5, "dk")
    _assert_close(dv, r_dv, 5e-5, "dv")
    # rows without any visible key: zero output and zero dq
    empty = ~visible_mask(sq, sk, causal, window, causal_shift).any(dim=-1)
    assert torch.all(out[:, empty] == 0) and torch.all(dq[:, empty] == 0)
    return empty


WINDOWS = [(3, 5), (0, 0), (-1, 4), (7, -1)]
SEQLENS = [(37, 37), (29, 45), (45, 29), (1, 1), (1, 17), (17, 1)]
HEADS = [(4, 4), (4, 2), (3, 1)]  # MHA, GQA, MQA


def _cases():
    cases = []
    i = 0
    # window alone (non-causal), every seqlen pair, rotating over head layouts
    for window in WINDOWS:
        for sq, sk in SEQLENS:
            h, hk = HEADS[i % len(HEADS)]
            cases.append((sq, sk, h, hk, False, window, 0.0, None))
            i += 1
    # window + causal (right is forced to 0: (4, 3) behaves as (4, 0))
    for window in [(5, 0), (0, 0), (4, 3), (-1, -1), (-1, 0)]:
        for sq, sk in [(37, 37), (29, 45), (45, 29), (1, 17)]:
            h, hk = HEADS[i % len(HEADS)]
            cases.append((sq, sk, h, hk, True, window, 0.0, None))
            i += 1
    # softcap alone, alibi alone (both slope shapes), and combinations
    for causal, window, softcap, alibi in [
        (False, (-1, -1), 1.5, None),
        (True, (-1, -1), 1.5, None),
        (False, (-1, -1), 0.0, "h"),
        (False, (-1, -1), 0.0, "bh"),
        (True, (-1, -1), 0.0, "bh"),
        (True, (-1, -1), 2.0, "h"),
        (True, (-1, -1), 2.0, "bh"),
        (False, (3, 5), 2.0, "bh"),
        (True, (6, 0), 1.0, "h"),
        (False, (-1, 4), 3.0, "h"),
    ]:
        for sq, sk in [(37, 37), (29, 45), (45, 29), (1, 1), (17, 1)]:
            for h, hk in HEADS:
                cases.append((sq, sk, h, hk, causal, window, softcap, alibi))
    return cases


CASES = _cases()


@pytest.mark.parametrize("sq,sk,h,hk,causal,window,softcap,alibi", CASES)
def test_tiled_vs_reference(sq, sk, h, hk, causal, window, softcap, alibi):
    d = 16 if (sq + sk) % 2 else 24
    _check_vs_ref(sq, sk, h, hk, d, causal, window, softcap, alibi, seed=sq * 7 + sk + h + hk)


@pytest.mark.parametrize("shift", [0, -4, 6])
@pytest.mark.parametrize("window", [(2, 3), (-1, 1), (4, -1)])
def test_explicit_causal_shift_with_window_alibi(shift, window):
    """causal_shift moves the window and the ALiBi distance too."""
    _check_vs_ref(21, 30, 4, 2, 16, False, window, 2.5, "bh", seed=shift + 50, causal_shift=shift)
    _check_vs_ref(21, 30, 4, 2, 16, True, window, 0.0, "h", seed=shift + 51, causal_shift=shift)


def test_large_scores_softcap():
    """Scores far beyond the cap (tanh saturates): still exact, no NaN."""
    _check_vs_ref(33, 41, 4, 2, 16, True, (-1, -1), 5.0, "h", seed=9, q_gain=8.0)
    _check_vs_ref(33, 41, 4, 4, 16, False, (9, 2), 0.5, None, seed=10, q_gain=8.0)


def test_rows_without_keys():
    # sq > sk, bottom-right alignment: window (0, 0) leaves rows 0..5 without a key
    empty = _check_vs_ref(10, 4, 2, 1, 8, False, (0, 0), 1.0, "bh", seed=3)
    assert empty.tolist() == [True] * 6 + [False] * 4
    # a window pushed off the key range entirely by the shift: every row empty
    empty = _check_vs_ref(5, 6, 2, 2, 8, False, (1, 1), 0.0, "h", seed=4, causal_shift=20)
    assert empty.all()
    # rows in the middle of a chunk seeing nothing only through the left bound
    empty = _check_vs_ref(9, 3, 2, 2, 8, False, (0, -1), 0.0, None, seed=5, causal_shift=0)
    assert empty.tolist() == [False] * 3 + [True] * 6


@pytest.mark.parametrize("block_m,block_n", [(1, 1), (7, 5), (256, 256), (16, 64)])
def test_block_sizes_float64(block_m, block_n):
    b, sq, sk, h, hk = 2, 37, 29, 4, 2
    q, k, v, dout = _inputs(b, sq, sk, h, hk, 16, dtype=torch.float64, seed=3)
    slopes = _slopes("bh", b, h)
    for causal, window in [(False, (4, 6)), (True, (9, 0)), (False, (-1, -1))]:
        kw = dict(window_size=window, softcap=1.7, alibi_slopes=slopes)
        r_out, r_lse, *r_grads = _ref_with_grads(q, k, v, dout, 0.25, causal, **kw)
        out, lse = attention_forward_cpu(q, k, v, 0.25, causal, block_m, block_n, **kw)
        assert out.dtype == torch.float64 and lse.dtype == torch.float64
        torch.testing.assert_close(out, r_out, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(lse, r_lse, rtol=1e-10, atol=1e-10)
        grads = attention_backward_cpu(dout, q, k, v, out, lse, 0.25, causal, block_m, block_n, **kw)
        for g, r in zip(grads, r_grads):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs(dtype):
    q, k, v, dout = _inputs(1, 50, 70, 4, 2, 32, dtype=dtype, seed=11)
    kw = dict(window_size=(12, 3), softcap=2.0, alibi_slopes=_slopes("h", 1, 4))
    out, lse = attention_forward_cpu(q, k, v, 0.2, False, block_m=16, block_n=32, **kw)
    assert out.dtype == dtype and lse.dtype == torch.float32
    grads = attention_backward_cpu(dout, q, k, v, out, lse, 0.2, False, block_m=16, block_n=32, **kw)
    r_out, _, *r_grads = _ref_with_grads(q, k, v, dout, 0.2, False, **kw)
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    _assert_close(out, r_out, tol, "out")
    for g, r, name in zip(grads, r_grads, ("dq", "dk", "dv")):
        assert g.dtype == dtype
        _assert_close(g, r, 2 * tol, name)


def test_defaults_unchanged():
    """Passing the neutral values is bitwise the same as not passing them."""
    q, k, v, dout = _inputs(2, 23, 31, 4, 2, 16, seed=1)
    for causal in (False, True):
        a = attention_forward_cpu(q, k, v, 0.3, causal, 8, 8)
        b = attention_forward_cpu(q, k, v, 0.3, causal, 8, 8, window_size=(-1, -1), softcap=0.0, alibi_slopes=None)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
        ga = attention_backward_cpu(dout, q, k, v, *a, 0.3, causal, 8, 8)
        gb = attention_backward_cpu(dout, q, k, v, *a, 0.3, causal, 8, 8, window_size=(-1, -1), softcap=0.0)
        assert all(torch.equal(x, y) for x, y in zip(ga, gb))
        r1 = attention_ref(q, k, v, 0.3, causal)
        r2 = attention_ref(q, k, v, 0.3, causal, window_size=(-1, -1), softcap=0.0, alibi_slopes=None)
        assert all(torch.equal(x, y) for x, y in zip(r1, r2))


# ---------------------------------------------------------------------------
# The reference against brute force
# ---------------------------------------------------------------------------


def _brute_visible(i, j, sq, sk, causal, window, shift):
    shift = sk - sq if shift is None else shift
    left, right = window
    if causal:
        right = 0
    if left >= 0 and j < i + shift - left:
        return False
    if right >= 0 and j > i + shift + right:
        return False
    return True


@pytest.mark.parametrize("sq,sk", [(4, 7), (7, 4), (5, 5), (1, 3)])
@pytest.mark.parametrize("shift", [None, 0, 2])
def test_visible_mask_brute_force(sq, sk, shift):
    for causal in (False, True):
        for window in [(-1, -1), (0, 0), (1, 2), (-1, 1), (2, -1), (3, 3)]:
            m = visible_mask(sq, sk, causal, window, shift)
            want = [[_brute_visible(i, j, sq, sk, causal, window, shift) for j in range(sk)] for i in range(sq)]
            assert m.tolist() == want, (causal, window)
            if causal and window == (-1, -1):
                assert m.tolist() == causal_visible_mask(sq, sk, causal_shift=shift).tolist()


def test_visible_mask_literal():
    # sq=3, sk=5, shift=2, window (1, 1): row i sees j in [i+1, i+3]
    assert visible_mask(3, 5, window_size=(1, 1)).int().tolist() == [
        [0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 0, 0, 1, 1],
    ]


@pytest.mark.parametrize("sq,sk,causal,window,shift", [
    (4, 6, False, (1, 2), None),
    (6, 4, True, (2, -1), None),
    (5, 5, False, (-1, 0), 1),
    (3, 2, False, (0, 0), None),  # row 0 sees nothing
])
@pytest.mark.parametrize("alibi", ["h", "bh"])
def test_reference_brute_force(sq, sk, causal, window, shift, alibi):
    """attention_ref against scalar Python loops (window + softcap + ALiBi)."""
    b, h, hk, d, scale, cap = 2, 4, 2, 3, 0.6, 1.3
    q, k, v, _ = _inputs(b, sq, sk, h, hk, d, dtype=torch.float64, seed=sq + sk, q_gain=2.0)
    slopes = _slopes(alibi, b, h)
    out, lse = attention_ref(q, k, v, scale, causal, causal_shift=shift, window_size=window,
                             softcap=cap, alibi_slopes=slopes)
    sh = sk - sq if shift is None else shift
    for bi in range(b):
        for hi in range(h):
            kv = hi // (h // hk)
            slope = float(slopes[hi] if slopes.dim() == 1 else slopes[bi, hi])
            for i in range(sq):
                scores, vals = [], []
                for j in range(sk):
                    if not _brute_visible(i, j, sq, sk, causal, window, shift):
                        continue
                    s = scale * sum(float(q[bi, i, hi, c]) * float(k[bi, j, kv, c]) for c in range(d))
                    s = cap * math.tanh(s / cap) - slope * abs(i + sh - j)
                    scores.append(s)
                    vals.append([float(x) for x in v[bi, j, kv]])
                if not scores:
                    assert torch.all(out[bi, i, hi] == 0) and math.isinf(lse[bi, hi, i]) and lse[bi, hi, i] < 0
                    continue
                mx = max(scores)
                w = [math.exp(s - mx) for s in scores]
                tot = sum(w)
                o = [sum(wj * vj[c] for wj, vj in zip(w, vals)) / tot for c in range(d)]
                assert lse[bi, hi, i].item() == pytest.approx(mx + math.log(tot), rel=1e-12, abs=1e-12)
                assert out[bi, i, hi].tolist() == pytest.approx(o, rel=1e-12, abs=1e-12)


def test_reference_gradcheck_softcap():
    q, k, v, _ = _inputs(1, 4, 5, 2, 1, 3, dtype=torch.float64, seed=2, q_gain=2.0)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    slopes = _slopes("h", 1, 2)

    def fn(q, k, v):
        return attention_ref(q, k, v, 0.7, False, window_size=(1, 2), softcap=0.8, alibi_slopes=slopes)

    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


# ---------------------------------------------------------------------------
# Tiled path: gradcheck, chunk skipping, fast path, errors
# ---------------------------------------------------------------------------


class _CPUAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, causal, kw):
        out, lse = attention_forward_cpu(q, k, v, scale, causal, 2, 3, **kw)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (scale, causal, kw)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        scale, causal, kw = ctx.args
        dq, dk, dv = attention_backward_cpu(dout, q, k, v, out, lse, scale, causal, 2, 3, **kw)
        return dq, dk, dv, None, None, None


@pytest.mark.parametrize("sq,sk,h,hk,causal,window,alibi", [
    (5, 6, 2, 1, False, (1, 2), "h"),
    (6, 4, 4, 2, True, (2, 0), "bh"),
    (3, 7, 2, 2, False, (-1, 1), "bh"),
])
def test_gradcheck_float64(sq, sk, h, hk, causal, window, alibi):
    q, k, v, _ = _inputs(1, sq, sk, h, hk, 4, dtype=torch.float64, seed=sq + 10 * sk, q_gain=2.0)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    kw = dict(window_size=window, softcap=0.9, alibi_slopes=_slopes(alibi, 1, h))
    fn = lambda q, k, v: _CPUAttention.apply(q, k, v, 0.7, causal, kw)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


def _count_key_chunks(fn):
    """Widths of the K chunks visited: one entry per ``q @ k^T`` matmul (two per
    chunk in the backward, which also does ``dO @ v^T``)."""
    calls = []
    real = torch.matmul

    def counting(a, b, *args, **kwargs):
        if b.dim() == 4 and a.shape[-1] == b.shape[-2] == 24:
            calls.append(b.shape[-1])  # q @ k^T (and dO @ v^T in the backward): contraction over headdim 24
        return real(a, b, *args, **kwargs)

    with mock.patch.object(cpu.torch, "matmul", counting):
        fn()
    return calls


@pytest.mark.parametrize("causal,window", [(False, (8, 8)), (True, (16, 0)), (False, (0, 0))])
def test_sliding_window_skips_chunks(causal, window):
    """Cost grows with the window: only K chunks overlapping a Q chunk's window are visited."""
    sq = sk = 512
    q, k, v, dout = _inputs(1, sq, sk, 1, 1, 24, seed=0)
    bm = bn = 16
    out, lse = attention_forward_cpu(q, k, v, 0.3, causal, bm, bn, window_size=window)
    fwd = _count_key_chunks(lambda: attention_forward_cpu(q, k, v, 0.3, causal, bm, bn, window_size=window))
    bwd = _count_key_chunks(
        lambda: attention_backward_cpu(dout, q, k, v, out, lse, 0.3, causal, bm, bn, window_size=window)
    )
    left, right = window[0], 0 if causal else window[1]
    # keys a Q chunk can see: bm + left + right  ->  at most ceil(that / bn) chunks per Q chunk
    per_chunk = -(-(bm + left + right) // bn)
    n_q_chunks = sq // bm
    assert len(fwd) <= n_q_chunks * per_chunk, len(fwd)
    assert len(bwd) == 2 * len(fwd)
    assert sum(fwd) <= n_q_chunks * (bm + left + right)  # keys actually touched
    assert len(fwd) < (sq // bm) * (sk // bn) // 4  # far fewer than the dense sweep


def test_mask_fast_path():
    def mod(causal, window, sq=64, sk=64, shift=None):
        q = torch.zeros(1, sq, 1, 4)
        return cpu._ScoreMod(q, sq, sk, 1, causal, shift, window, 0.0, None, torch.float32)

    full = mod(False, (-1, -1))
    assert full.key_range(0, 16) == (0, 64)
    assert all(full.mask(a, a + 16, b, b + 16, "cpu") is None for a in range(0, 64, 16) for b in range(0, 64, 16))
    causal = mod(True, (-1, -1))
    assert causal.mask(16, 32, 0, 16, "cpu") is None  # strictly below the diagonal
    assert causal.mask(16, 32, 16, 32, "cpu") is not None  # on the diagonal
    win = mod(False, (40, 40))
    assert win.key_range(16, 32) == (0, 64)
    assert win.mask(16, 32, 0, 16, "cpu") is None  # all within 40 of every query
    assert win.mask(0, 16, 40, 56, "cpu") is not None
    assert mod(False, (2, 3)).key_range(16, 32) == (14, 35)
    assert mod(False, (2, 3), sq=10, sk=4).key_range(0, 5) == (0, 2)  # shift -6: keys up to 4 - 6 + 3


def test_invalid_arguments():
    q, k, v, dout = _inputs(2, 5, 6, 4, 2, 8, seed=0)
    bad = [
        dict(alibi_slopes=torch.ones(3)),
        dict(alibi_slopes=torch.ones(4, 2)),
        dict(alibi_slopes=torch.ones(2, 4, 1)),
        dict(alibi_slopes=torch.ones(4, dtype=torch.int32)),
        dict(softcap=-1.0),
        dict(window_size=(1, 2, 3)),
    ]
    for kw in bad:
        with pytest.raises(ValueError):
            attention_forward_cpu(q, k, v, 0.3, False, **kw)
        with pytest.raises(ValueError):
            attention_ref(q, k, v, 0.3, False, **kw)
        with pytest.raises(ValueError):
            attention_backward_cpu(dout, q, k, v, dout, torch.zeros(2, 4, 5), 0.3, False, **kw)
