"""Calls with more batch·heads than a CUDA grid's y axis holds (65535).

The kernels then take a flat grid (``utils.block_grid`` / ``triton.common.block_ids``; decode puts batch·kv
heads on axis 0). On the CPU the limit is lowered to 2, so that the interpreter runs the flat
indexing on tiny shapes and must give the same bits as the 2-D grid; on a GPU the real limit is
crossed (batch·heads = 65552) and the outputs and gradients of the first and last batch entries are
checked against fp32 SDPA.
"""

import pytest
import torch
import torch.nn.functional as F

import tileflash
from tileflash.ops import utils
from tileflash.ops.triton import backward as bwd_mod
from tileflash.ops.triton import decode
from tileflash.ops.triton import forward as fwd_mod
from tileflash.ops.utils import block_grid
from tileflash.options import DEBUG
from tileflash.reference import attention_ref

from helpers import HAS_CUDA, rounding_atol


def test_block_grid_is_2d_up_to_the_limit_then_flat():
    assert block_grid(7, 65535) == ((7, 65535), False)
    assert block_grid(7, 65536) == ((7 * 65536,), True)
    assert block_grid(1, 1) == ((1, 1), False)
    with pytest.raises(ValueError, match=r"exceed CUDA's grid limit of 2\*\*31 - 1; split the batch"):
        block_grid(2 ** 16, 2 ** 16)


def _flat_spy(monkeypatch):
    """Lower the limit to 2 and record, per launch through block_grid, whether it went flat (so a
    test can tell that the flat path really ran)."""
    went_flat = []

    def spy(n_blocks, batch_heads):
        grid, flat = block_grid(n_blocks, batch_heads)
        went_flat.append(flat)
        return grid, flat
    monkeypatch.setattr(utils, "GRID_YZ_MAX", 2)
    monkeypatch.setattr(fwd_mod, "block_grid", spy)
    monkeypatch.setattr(bwd_mod, "block_grid", spy)
    return went_flat


def _run(q, k, v, causal, do, options=None):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = tileflash.flash_attn_func(*leaves, causal=causal, options=options)
    return (out, *torch.autograd.grad(out, leaves, do))


@pytest.mark.parametrize("delta", ["in-dq", "kernel"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("hk", [3, 1], ids=["mha", "gqa"])
def test_flat_grid_gives_the_2d_grids_bits(backend, monkeypatch, causal, hk, delta):
    """delta "in-dq": the default backward (the dQ kernel computes delta, then dK/dV); "kernel":
    the debug switch dq_delta=0 (the delta kernel, dK/dV, then dQ), so that the delta kernel's flat
    grid runs too."""
    if backend != "interpret":
        pytest.skip("the CPU interpreter with the grid limit lowered; the GPU test below crosses the real one")
    monkeypatch.setattr(DEBUG, "dq_delta", delta == "in-dq")
    g = torch.Generator().manual_seed(3)
    b, sq, sk, h, d = 2, 33, 47, 3, 16
    q = torch.randn(b, sq, h, d, generator=g)
    k, v = (torch.randn(b, sk, hk, d, generator=g) for _ in range(2))
    do = torch.randn(b, sq, h, d, generator=g)
    ref = _run(q, k, v, causal, do)
    bwd_mod._PRE_LAUNCHES.clear()  # the delta kernel's launch is kept per layout: rebuild it flat
    went_flat = _flat_spy(monkeypatch)  # batch·heads 6 (kv: 6 or 2) > 2
    flat = _run(q, k, v, causal, do)
    bwd_mod._PRE_LAUNCHES.clear()
    # the forward (its flag, then its grid), delta and dQ flat; dK/dV when its batch·kv heads exceed 2
    if delta == "in-dq":  # dQ (computing delta) first, then dK/dV
        assert went_flat == [True, True, True, hk > 1], went_flat
    else:  # the delta kernel, dK/dV, dQ
        assert went_flat == [True, True, True, hk > 1, True], went_flat
    for name, a, r in zip(("out", "dq", "dk", "dv"), flat, ref):
        assert not a.isnan().any(), name
        assert torch.equal(a, r), f"{name}: flat grid differs by {(a - r).abs().max().item():.3e}"


@pytest.mark.parametrize("delta", ["in-dq", "kernel"])
def test_flat_grid_varlen_gives_the_2d_grids_bits(backend, monkeypatch, delta):
    if backend != "interpret":
        pytest.skip("the CPU interpreter with the grid limit lowered")
    monkeypatch.setattr(DEBUG, "dq_delta", delta == "in-dq")
    g = torch.Generator().manual_seed(4)
    lens_q, lens_k, h, d = [5, 17, 1], [9, 3, 20], 2, 16
    cu_q = torch.tensor([0, 5, 22, 23], dtype=torch.int32)
    cu_k = torch.tensor([0, 9, 12, 32], dtype=torch.int32)
    q = torch.randn(sum(lens_q), h, d, generator=g)
    k, v = (torch.randn(sum(lens_k), h, d, generator=g) for _ in range(2))

    do = torch.randn(sum(lens_q), h, d, generator=g)

    def run():
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = tileflash.flash_attn_varlen_func(*leaves, cu_q, cu_k, max(lens_q), max(lens_k), causal=True)
        return (out, *torch.autograd.grad(out, leaves, do))
    ref = run()
    bwd_mod._PRE_LAUNCHES.clear()
    went_flat = _flat_spy(monkeypatch)  # 3 sequences x 2 heads = 6 > 2
    flat = run()
    bwd_mod._PRE_LAUNCHES.clear()
    if delta == "in-dq":  # the forward (flag, grid), dQ computing delta, dK/dV: all flat
        assert went_flat == [True, True, True, True], went_flat
    else:  # all but the delta kernel, which sees the packed rows as one batch entry (1 x 2 heads)
        assert went_flat == [True, True, False, True, True], went_flat
    for name, a, r in zip(("out", "dq", "dk", "dv"), flat, ref):
        assert torch.equal(a, r), f"{name}: flat grid differs by {(a - r).abs().max().item():.3e}"


def test_decode_with_batch_heads_on_axis_0_gives_the_same_bits(backend, monkeypatch):
    if backend != "interpret":
        pytest.skip("the CPU interpreter with the grid limit lowered")
    g = torch.Generator().manual_seed(5)
    b, h, hk, d, cap = 3, 4, 2, 16, 96
    q = torch.randn(b, 1, h, d, generator=g)
    kc, vc = (torch.randn(b, cap, hk, d, generator=g) for _ in range(2))
    lens = torch.tensor([96, 90, 0], dtype=torch.int32)  # several tiles per split: the rotation uses n_bh
    outs = []
    for limit in (65535, 5):  # 6 batch·kv heads > 5; 3 splits fit axis 1
        monkeypatch.setattr(decode, "GRID_YZ_MAX", limit)
        for splits in (1, 3):
            outs.append(tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits))
    assert torch.equal(outs[0], outs[2]) and torch.equal(outs[1], outs[3])


@pytest.mark.parametrize("limit", ["rows", "tickets"])
def test_decode_grid_past_the_limits_raises_before_the_append(backend, monkeypatch, limit):
    """A decode grid past CUDA's limits (row blocks past an axis' limit, or more ticket counters
    than the kernel's int32 index holds) raises ValueError before k/v are appended: the cache is
    left untouched. Both limits are lowered so that the check runs at a small shape."""
    if backend != "interpret":
        pytest.skip("the CPU interpreter with the grid limits lowered")
    g = torch.Generator().manual_seed(6)
    b, h, hk, d, cap, t = 2, 4, 1, 16, 64, 20     # 4 query heads x 20 new tokens = 80 rows: 2 blocks of 64
    q = torch.randn(b, t, h, d, generator=g)
    kc, vc = (torch.randn(b, cap, hk, d, generator=g) for _ in range(2))
    kn, vn = (torch.randn(b, t, hk, d, generator=g) for _ in range(2))
    lens = torch.tensor([5, 30], dtype=torch.int32)
    before = (kc.clone(), vc.clone())
    assert decode.row_blocks(h // hk, t) == (64, 2)
    # within the limits the call appends and runs
    k2, v2 = kc.clone(), vc.clone()
    tileflash.flash_attn_with_kvcache(q, k2, v2, kn, vn, cache_seqlens=lens.clone())
    assert not torch.equal(k2, kc)
    if limit == "rows":
        monkeypatch.setattr(decode, "GRID_YZ_MAX", 1)      # 2 row blocks > 1
    else:
        monkeypatch.setattr(decode, "TICKETS_MAX", b * hk * 2)  # 2 batch·kv heads x 2 row blocks = 4 counters
    with pytest.raises(ValueError, match="exceed CUDA's grid limits"):
        tileflash.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens.clone())
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_check_grid_bounds():
    for g in range(1, 65):
        for t in range(0, 300):
            assert decode.row_block_count(g, t) == decode.row_blocks(g, t)[1]
    assert decode.check_grid(65535, 65535 // 2 - 1) is False             # 2**31 - 1 counters would not fit: fewer do
    assert decode.check_grid(65536, 1, num_splits=65535)         # batch·kv heads on axis 0
    decode.check_grid(2 ** 31 - 1, 1)
    for args in ((65536, 1, 65536), (2, 65536, 1), (2 ** 31, 1, 1), (2 ** 16, 2 ** 15, 1)):
        with pytest.raises(ValueError, match="grid limits"):
            decode.check_grid(*args)


def test_cpu_path_takes_more_batch_heads_than_a_grid_axis(backend):
    """The public API no longer refuses batch·heads > 65535 (it did before the flat grid)."""
    if backend != "tiled":
        pytest.skip("the tiled CPU path; the interpreter would run 69632 programs one by one")
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(4096, 2, 17, 8, generator=g) for _ in range(3))  # 69632 (batch, head) pairs
    out = tileflash.flash_attn_func(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(*(t.double().transpose(1, 2) for t in (q, k, v)), is_causal=True)
    assert (out.double() - ref.transpose(1, 2)).abs().max().item() < 1e-5


def _ref(q, k, v, causal, do, upcast):
    """attention_ref's output and gradients: fp32 (upcast) or eager in the inputs' dtype."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, _ = attention_ref(*leaves, causal=causal, upcast=upcast)
    return (out, *torch.autograd.grad(out.to(do.dtype), leaves, do))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("backend_option", ["auto", "triton"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("b,n,h,hk,d,dtype", [(4097, 64, 16, 16, 64, torch.float16),
                                              (4097, 128, 16, 4, 128, torch.bfloat16),
                                              (65537, 17, 1, 1, 40, torch.float16)])
def test_gpu_batch_heads_past_the_grid_limit(backend_option, causal, b, n, h, hk, d, dtype):
    """Forward and backward at batch·heads > 65535 (the first two shapes take the Gluon kernels
    where they can with Options(backend="auto"); "triton" keeps the Triton kernels), against
    attention_ref on the first, a middle and the last batch entries: flash-attn's rule (at most 2x
    the eager same-dtype error, plus rounding). The caching allocator's blocks are NaN-filled
    first, so an unwritten output would show as NaN."""
    options = tileflash.Options(backend=backend_option)
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(b, n, h, d, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(b, n, hk, d, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    do = torch.randn(b, n, h, d, device="cuda", dtype=dtype, generator=g)
    torch.empty(8 * q.numel(), device="cuda", dtype=dtype).fill_(float("nan"))  # poison, then free
    got = _run(q, k, v, causal, do, options)
    idx = [0, b // 2, b - 1]
    ref = _ref(q[idx].float(), k[idx].float(), v[idx].float(), causal, do[idx].float(), True)
    eager = _ref(q[idx], k[idx], v[idx], causal, do[idx], False)
    for name, a, r, e in zip(("out", "dq", "dk", "dv"), got, ref, eager):
        a = a[idx]
        assert not a.isnan().any(), f"{name}: NaN (an unwritten tile)"
        err, eager_err = (a.float() - r).abs().max().item(), (e.float() - r).abs().max().item()
        atol = rounding_atol(r, dtype)
        assert err <= 2 * eager_err + atol, f"{name}: err {err:.3g} > 2 * eager {eager_err:.3g} + {atol:.3g}"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("splits", [1, 0])
def test_gpu_decode_batch_kv_heads_past_the_grid_limit(splits):
    """Decode at batch·kv heads = 65544 (> 65535): one split and the automatic split count, against
    attention_ref on four batch entries, one of them with an empty cache (output 0)."""
    g = torch.Generator(device="cuda").manual_seed(8)
    b, hk, h, d, cap = 8193, 8, 32, 64, 256
    q = torch.randn(b, 1, h, d, device="cuda", dtype=torch.bfloat16, generator=g)
    kc, vc = (torch.randn(b, cap, hk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    lens = torch.randint(1, cap + 1, (b,), device="cuda", dtype=torch.int32, generator=g)
    lens[0], lens[-1] = 0, cap
    out = tileflash.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits)
    assert torch.equal(out[0], torch.zeros_like(out[0])), "an empty cache gives 0"
    for i in (1, b // 2, b - 1):
        n = int(lens[i])
        qi, ki, vi = q[i:i + 1], kc[i:i + 1, :n], vc[i:i + 1, :n]
        ref, _ = attention_ref(qi.float(), ki.float(), vi.float(), upcast=True)
        eager, _ = attention_ref(qi, ki, vi, upcast=False)
        err, eager_err = (out[i:i + 1].float() - ref).abs().max().item(), (eager.float() - ref).abs().max().item()
        atol = rounding_atol(ref, torch.bfloat16)
        assert err <= 2 * eager_err + atol, f"entry {i}: err {err:.3g} > 2 * eager {eager_err:.3g} + {atol:.3g}"
