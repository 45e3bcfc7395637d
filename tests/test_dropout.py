"""Attention dropout: reproducibility, keep rate, unbiasedness, and exact gradients for the mask.

The keep mask depends only on (seed, batch, head, i, j), never on q/k/v. So a call with q = 0
(uniform P = 1/Sk) and V = identity (headdim = Sk) prints the mask into the output:
out[b, i, h, j] = keep[b, h, i, j] / ((1 - p) Sk). The same seed then replays that mask on real
inputs, and the result can be checked against a reference that applies it explicitly.
"""

import pytest
import torch

import tileflash

from helpers import backend_device, make_qkv, rounding_atol

B, SQ, SK, H, HK = 2, 40, 32, 4, 2
D = SK  # identity V needs headdim = seqlen_k


def _mask(dev, p, seed, causal=False):
    torch.manual_seed(seed)
    k = make_qkv(B, SQ, SK, H, HK, D, torch.float32, dev, seed=1)[1]  # bf16 on CUDA
    q = torch.zeros(B, SQ, H, D, device=dev, dtype=k.dtype)
    v = torch.eye(SK, D, device=dev, dtype=k.dtype).expand(B, HK, SK, D).permute(0, 2, 1, 3).contiguous()
    out = tileflash.flash_attn_func(q, k, v, dropout_p=p, causal=causal)
    z = (out.float() * SK * (1 - p)).permute(0, 2, 1, 3)  # (B, H, SQ, SK)
    return z > 0.5


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_keep_rate_and_reproducibility(backend, p):
    dev = backend_device(backend)
    m1, m2, m3 = _mask(dev, p, 0), _mask(dev, p, 0), _mask(dev, p, 1)
    assert torch.equal(m1, m2), "the same torch seed must give the same mask"
    assert not torch.equal(m1, m3), "another seed must give another mask"
    n = m1.numel()
    std = (p * (1 - p) / n) ** 0.5
    assert abs(m1.float().mean().item() - (1 - p)) < 5 * std, (m1.float().mean().item(), 1 - p)
    # masks of different heads and batches are not copies of each other, nor are rows shifted copies
    assert not torch.equal(m1[0, 0], m1[0, 1]) and not torch.equal(m1[0, 0], m1[1, 0])
    assert not torch.equal(m1[0, 0, 1:], m1[0, 0, :-1])
    assert not torch.equal(m1[0, 0, 1:, :-1], m1[0, 0, :-1, 1:]) and not torch.equal(m1[0, 0, 1:, 1:], m1[0, 0, :-1, :-1])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gradients_match_explicit_mask(backend, causal):
    dev = backend_device(backend)
    p = 0.25
    keep = _mask(dev, p, 7).cpu()
    q, k, v = make_qkv(B, SQ, SK, H, HK, D, torch.float32, dev, seed=3)
    do = make_qkv(B, SQ, SK, H, HK, D, torch.float32, dev, seed=4)[0]
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(7)  # same seed -> same mask as extracted above
    out = tileflash.flash_attn_func(*leaves, dropout_p=p, causal=causal)
    grads = torch.autograd.grad(out, leaves, do)

    def ref(dtype):
        qs, ks, vs = (t.detach().cpu().to(dtype).requires_grad_() for t in (q, k, v))
        kk, vv = ks.repeat_interleave(H // HK, 2), vs.repeat_interleave(H // HK, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", qs, kk) * D ** -0.5
        if causal:
            i, j = torch.arange(SQ)[:, None], torch.arange(SK)[None, :]
            s = s.masked_fill(j > i + SK - SQ, float("-inf"))
        probs = torch.softmax(s, -1).nan_to_num(0.0)
        o = torch.einsum("bhqk,bkhd->bqhd", probs * keep / (1 - p), vv)
        return o, torch.autograd.grad(o, (qs, ks, vs), do.cpu().to(dtype))

    ref_o, ref_g = ref(torch.float64)
    eager_o, eager_g = ref(q.dtype)  # eager in the dtype under test (bf16 on CUDA)
    for name, got, r, e, factor in [("out", out, ref_o, eager_o, 2)] + [
            (n, g, rg, eg, 3) for n, g, rg, eg in zip(("dq", "dk", "dv"), grads, ref_g, eager_g)]:
        got, r, e = got.detach().cpu().double(), r.detach(), e.detach().double()
        err, eager_err = (got - r).abs().max().item(), (e - r).abs().max().item()
        assert err <= factor * eager_err + rounding_atol(r, q.dtype), f"{name}: {err:.3g} vs {eager_err:.3g}"


def test_unbiased_mean_over_seeds(backend):
    """E[dropout attention] = attention: the mean over many seeds approaches the p = 0 output."""
    dev = backend_device(backend)
    q, k, v = make_qkv(1, 16, 16, 2, 2, 16, torch.float32, dev, seed=5)
    ref = tileflash.flash_attn_func(q, k, v).double()
    n = 64 if backend == "interpret" else 400
    outs = []
    for s in range(n):
        torch.manual_seed(100 + s)
        outs.append(tileflash.flash_attn_func(q, k, v, dropout_p=0.3).double())
    outs = torch.stack(outs)
    mean, std = outs.mean(0), outs.std(0)
    # 6 standard errors, elementwise: a biased estimator (e.g. a missing 1/(1-p)) is off by ~30%
    assert ((mean - ref).abs() <= 6 * std / n ** 0.5 + 1e-6).all()
    assert (mean - ref).abs().max() < 0.1 * ref.abs().max()


def test_zero_dropout_is_exact(backend):
    dev = backend_device(backend)
    q, k, v = make_qkv(1, 20, 20, 2, 2, 16, torch.float32, dev, seed=6)
    assert torch.equal(tileflash.flash_attn_func(q, k, v, dropout_p=0.0), tileflash.flash_attn_func(q, k, v))


def test_varlen_sequences_get_their_own_masks(backend):
    """Two sequences of equal length in one varlen batch must not share a dropout mask."""
    dev = backend_device(backend)
    p, n = 0.5, 16
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    cu = torch.tensor([0, n, 2 * n, 3 * n], dtype=torch.int32, device=dev)
    q = torch.zeros(3 * n, 2, n, device=dev, dtype=dt)
    k = torch.randn(3 * n, 2, n, device=dev).to(dt)
    v = torch.eye(n, device=dev, dtype=dt).repeat(3, 1)[:, None, :].expand(3 * n, 2, n).contiguous()
    torch.manual_seed(3)
    out = tileflash.flash_attn_varlen_func(q, k, v, cu, cu, n, n, dropout_p=p)
    masks = (out.float() * n * (1 - p) > 0.5).view(3, n, 2, n)
    assert not torch.equal(masks[0], masks[1]) and not torch.equal(masks[1], masks[2])
    frac = masks.float().mean().item()
    assert abs(frac - (1 - p)) < 5 * (p * (1 - p) / masks.numel()) ** 0.5
