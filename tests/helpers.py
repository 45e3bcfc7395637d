"""Helpers shared by the test modules (conftest.py keeps the fixtures and the set-up).

Nothing here imports a kernel module at import time: conftest.py imports this module before it
has chosen where the Triton kernels run (TRITON_INTERPRET), and Triton decides that when a kernel
is decorated. The Gluon kernel modules are reached through :func:`gluon_modules`.

Accuracy rule (flash-attn's): a kernel's max error against an fp64 reference is at most ``factor``
times the error of plain PyTorch attention in the same precision against the same reference, plus
a tiny atol (``rounding_atol``: twice the rounding error of the reference in the tested dtype). The
baseline is measured on this machine, so the bound follows the CPU's (or GPU's) own rounding.
"""

import torch

from tileflash.reference import attention_ref

HAS_CUDA = torch.cuda.is_available()
IS_SM90 = HAS_CUDA and torch.cuda.get_device_capability()[0] == 9


def backend_device(backend):
    """The torch device of a ``backend`` fixture value ("tiled", "interpret", "cuda")."""
    return "cuda" if backend == "cuda" else "cpu"


def gluon_modules():
    """(Gluon forward module, Gluon backward module), or None where this triton has no Gluon."""
    from tileflash.ops.route import gluon_modules as modules

    return modules()


def count_calls(monkeypatch, module, name):
    """Replace module.<name> by a wrapper that records the positional arguments of each call that
    returned something other than None (the Gluon launchers return None when their kernel did
    not compile and the Triton kernel ran instead); returns the list of records, which tests
    assert is non-empty, i.e. that the kernel really ran."""
    calls = []
    real = getattr(module, name)

    def counting(*args, **kwargs):
        res = real(*args, **kwargs)
        if res is not None:
            calls.append(args)
        return res

    monkeypatch.setattr(module, name, counting)
    return calls


def _flags(**over):
    """The launchers' feature flags (``tileflash.ops.utils.feature_args``): all off, then ``over``."""
    f = dict(HAS_LEFT=False, HAS_RIGHT=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False)
    f.update(over)
    return f


def _rand(shape, dtype, device, gen_seed):
    """Standard normal values from their own generator (the same on every device and run)."""
    g = torch.Generator().manual_seed(gen_seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(device=device, dtype=dtype)


def make_qkv(b, sq, sk, h, hk, d, dtype, device, seed=0):
    if device == "cuda" and dtype == torch.float32:
        dtype = torch.bfloat16  # the GPU kernels take fp16/bf16; fp32 cases run in bf16 there
    q = _rand((b, sq, h, d), dtype, device, seed)
    k = _rand((b, sk, hk, d), dtype, device, seed + 1)
    v = _rand((b, sk, hk, d), dtype, device, seed + 2)
    return q, k, v


def rounding_atol(ref, dtype):
    """Twice the rounding error of arithmetic on `ref` in `dtype` (flash-attn's fwd_atol)."""
    r = ref.to(dtype)
    return 2 * (r + 0.3 - 0.3 - r).abs().max().item() if r.numel() else 0.0


def max_err(a, b) -> float:
    """max |a - b| in fp64 on the CPU (0 for empty tensors; NaN if either holds a NaN)."""
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return (a - b).abs().max().item() if a.numel() else 0.0


def assert_error_rule(name, got, ref, base_err, factor, atol):
    """flash-attn's accuracy rule: max |got - ref| <= factor * base_err + atol, where ``base_err``
    is the max error of plain PyTorch attention in the same precision against ``ref``. A failure
    names the max error, the bound and how many elements exceed it."""
    diff = (got.detach().cpu().double() - ref.detach().cpu().double()).abs()
    err = diff.max().item() if diff.numel() else 0.0
    allowed = factor * base_err + atol
    if not err <= allowed:  # (NaN fails too)
        over = int((diff > allowed).sum().item() + diff.isnan().sum().item())
        raise AssertionError(
            f"{name}: max error {err:.4g} > allowed {allowed:.4g} (= {factor} x the same-precision "
            f"baseline's error {base_err:.4g} + atol {atol:.4g}); {over} of {diff.numel()} elements over")


def check_out(out, q, k, v, causal, scale=None):
    """flash-attn's rule against fp64 with an eager same-dtype baseline; returns (ref, ref_lse)."""
    ref, ref_lse = attention_ref(q.double().cpu(), k.double().cpu(), v.double().cpu(),
                                 softmax_scale=scale, causal=causal)
    eager, _ = attention_ref(q, k, v, softmax_scale=scale, causal=causal, upcast=False)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert not torch.isnan(out).any(), "NaN in output"
    assert_error_rule("out", out, ref, max_err(eager, ref), 2, rounding_atol(ref, q.dtype))
    return ref, ref_lse


def check_lse(lse, ref_lse, dtype):
    assert lse.dtype == torch.float32 and lse.shape == ref_lse.shape
    on_cpu = lse.device.type == "cpu"
    lse, ref_lse = lse.cpu().double(), ref_lse.double()
    inf = torch.isinf(ref_lse)
    assert torch.equal(torch.isinf(lse), inf), "LSE -inf pattern differs from the reference"
    assert (lse[inf] < 0).all()
    # same (upcast) inputs on both sides: only fp32 accumulation order differs (measured ~6e-7 on
    # the CPU paths). The CUDA bound was not re-measured after tightening the CPU one.
    tol = 1e-5 if on_cpu else 2e-3
    if (~inf).any():
        err = (lse[~inf] - ref_lse[~inf]).abs().max().item()
        assert err <= tol, f"lse: max error {err:.4g} > {tol:.4g}"


def check_cuda_out(out, lse, q, k, v, causal):
    """GPU outputs (NaN-poisoned before the call) against an fp32 reference on the GPU (fp64 is too
    slow at 8k): flash-attn's rule with an eager same-dtype baseline, and the LSE to 2e-3."""
    assert not torch.isnan(out).any() and not torch.isnan(lse).any(), "unwritten output (NaN poison)"
    ref, ref_lse = attention_ref(q, k, v, causal=causal, upcast=True)
    eager, _ = attention_ref(q, k, v, causal=causal, upcast=False)
    err = (out.float() - ref).abs().max().item()
    eager_err = (eager.float() - ref).abs().max().item()
    atol = rounding_atol(ref, q.dtype)
    assert err <= 2 * eager_err + atol, f"err {err:.3g} > 2 * eager {eager_err:.3g} + {atol:.3g}"
    fin = torch.isfinite(ref_lse)
    lse_err = (lse[fin] - ref_lse[fin].float()).abs().max().item()
    assert lse_err <= 2e-3, f"lse: max error {lse_err:.3g} > 2e-3"


def ref_grads(q, k, v, do, causal, upcast, scale=None, **features):
    """Gradients of attention_ref: in fp64 on the CPU (upcast=True) or eager in q's dtype.
    ``features``: attention_ref's keyword arguments (window_size, softcap, alibi_slopes)."""
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    if upcast:
        qs, ks, vs = (t.detach().cpu().double().requires_grad_() for t in (q, k, v))
        do = do.cpu().double()
        features = {n: (x.cpu() if isinstance(x, torch.Tensor) else x) for n, x in features.items()}
    out, _ = attention_ref(qs, ks, vs, softmax_scale=scale, causal=causal, upcast=upcast, **features)
    return torch.autograd.grad(out.to(do.dtype), (qs, ks, vs), do)
