"""tileflash.Options (how a call runs), tileflash.options.Debug (developers' A/B switches), the lazy
``import tileflash``, and the router's handling of Options on CUDA tensors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tileflash
from tileflash.ops import route
from tileflash.ops.triton import backward as bwd_mod
from tileflash.ops.triton import forward as fwd_mod
from tileflash.options import DEFAULT, Debug, Options, resolve
from tileflash.reference import attention_ref

from helpers import (HAS_CUDA, IS_SM90, assert_error_rule, check_out, count_calls, gluon_modules,
                     make_qkv, max_err, ref_grads, rounding_atol)

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(backend="cuda"), r"Options.backend must be one of \('auto', 'triton', 'gluon'\), got 'cuda'"),
    (dict(backend=None), r"Options.backend must be one of .* got None"),
    (dict(backend="Triton"), r"Options.backend must be one of .* got 'Triton'"),
    (dict(use_tma="yes"), r"Options.use_tma must be None, True or False, got 'yes'"),
    (dict(use_tma=2), r"Options.use_tma must be None, True or False, got 2"),
    (dict(use_tma=1), r"Options.use_tma must be None, True or False, got 1"),
    (dict(autotune=1), r"Options.autotune must be a bool, got 1"),
    (dict(autotune="true"), r"Options.autotune must be a bool, got 'true'"),
    (dict(autotune=None), r"Options.autotune must be a bool, got None"),
    (dict(like_inputs=1), r"Options.like_inputs must be a bool, got 1"),
    (dict(pad_head_dim=0), r"Options.pad_head_dim must be a bool, got 0"),
])
def test_options_validation(kwargs, match):
    """A bad value raises ValueError naming the field, the allowed values and what was given."""
    with pytest.raises(ValueError, match=match):
        Options(**kwargs)


def test_options_defaults_and_frozen():
    o = Options()
    assert (o.backend, o.use_tma, o.autotune, o.pad_head_dim) == ("auto", None, False, True)
    assert o == DEFAULT and hash(o) == hash(DEFAULT)
    with pytest.raises(Exception):  # dataclasses.FrozenInstanceError
        o.backend = "triton"
    assert tileflash.Options is Options


@pytest.mark.parametrize("opts", [
    Options(),
    Options(backend="triton"),
    Options(backend="gluon", use_tma=True),
    Options(use_tma=False, autotune=True),
    Options(backend="triton", use_tma=True, autotune=True, pad_head_dim=False),
    Options(pad_head_dim=False),
    Options(like_inputs=True),
    Options(backend="gluon", use_tma=False, like_inputs=True),
], ids=lambda o: o.encode())
def test_options_encode_decode_round_trip(opts):
    """The custom ops carry options as one string: decode(encode(o)) == o, field by field."""
    text = opts.encode()
    assert isinstance(text, str) and text
    back = Options.decode(text)
    assert back == opts
    assert (back.backend, back.use_tma, back.autotune, back.pad_head_dim, back.like_inputs) == \
        (opts.backend, opts.use_tma, opts.autotune, opts.pad_head_dim, opts.like_inputs)


def test_options_decode_reads_the_four_field_strings_of_earlier_releases():
    """An option string made before ``like_inputs`` existed (four fields, e.g. in a saved graph)
    still decodes, with ``like_inputs`` off."""
    assert Options.decode("triton,0,1,0") == Options(backend="triton", use_tma=False, autotune=True,
                                                     pad_head_dim=False)
    assert Options.decode("auto,-1,0,1") == DEFAULT


def test_fit_puts_an_output_in_the_query_memory_order():
    """``route._fit``: an output written into the caller's buffer if one is given; else, with
    ``Options.like_inputs``, in the memory order ``torch.empty_like(q)`` gives (the op's fake): the
    result itself where it already is, a view where only dims of size 1 differ, else a copy; without
    the option the result as it is."""
    like = Options(like_inputs=True)
    q = torch.empty(2, 4, 3, 8).transpose(1, 2)            # (b, h, s, d) memory seen as (b, s, h, d)
    res = torch.randn(2, 3, 4, 8)                           # contiguous (b, s, h, d)
    assert route._fit(res, None, q, DEFAULT) is res
    got = route._fit(res, None, q, like)
    assert got.stride() == q.stride() and torch.equal(got, res) and got.data_ptr() != res.data_ptr()
    same = torch.randn(2, 4, 3, 8).transpose(1, 2)
    assert route._fit(same, None, q, like) is same
    q1 = torch.empty(2, 4, 1, 8).transpose(1, 2)            # one query token: only a size-1 dim differs
    res1 = torch.randn(2, 1, 4, 8)
    got1 = route._fit(res1, None, q1, like)
    assert got1.stride() == q1.stride() and got1.data_ptr() == res1.data_ptr() and torch.equal(got1, res1)
    buf = torch.empty(2, 3, 4, 8)
    assert route._fit(res, buf, q, like) is buf and torch.equal(buf, res)
    packed = torch.empty(2, 3, 3, 4, 8)[:, :, 0]            # not dense: empty_like infers dense strides
    assert route._fit(res, None, packed, like) is res


def test_options_encodings_are_distinct():
    every = [Options(b, t, a, p, o) for b in ("auto", "triton", "gluon") for t in (None, False, True)
             for a in (False, True) for p in (False, True) for o in (False, True)]
    assert len({o.encode() for o in every}) == len(every) == 72
    assert Options.decode("") == DEFAULT  # the ops' default argument


def test_resolve():
    assert resolve(None) is DEFAULT
    o = Options(backend="triton")
    assert resolve(o) is o
    assert resolve({"backend": "triton", "use_tma": True}) == Options(backend="triton", use_tma=True)
    assert resolve({}) == DEFAULT
    with pytest.raises(ValueError, match="Options.backend"):
        resolve({"backend": "nope"})  # a dict is validated like the constructor's arguments
    with pytest.raises(TypeError):
        resolve({"no_such_field": 1})
    for wrong in ("triton", 1, ["triton"], ("auto", None, False, True)):
        with pytest.raises(TypeError, match=r"options must be a tileflash.Options, a dict of its fields or None, "
                                            rf"got {type(wrong).__name__}"):
            resolve(wrong)


def test_public_functions_reject_bad_options():
    q, k, v = make_qkv(1, 8, 8, 2, 2, 16, torch.float32, "cpu")
    with pytest.raises(TypeError, match="options must be a tileflash.Options"):
        tileflash.flash_attn_func(q, k, v, options="triton")
    with pytest.raises(ValueError, match="Options.backend"):
        tileflash.flash_attn_func(q, k, v, options={"backend": "cuda"})
    with pytest.raises(TypeError, match="options must be a tileflash.Options"):
        tileflash.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), options=3)


def _spy(monkeypatch, module, name):
    """Record the keyword arguments of every call of module.<name> (which still runs)."""
    seen = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, spy)
    return seen


def test_options_on_the_interpreter(backend, monkeypatch):
    """The public call with options=Options(backend="triton") and options={"use_tma": True} against
    the default, forward and backward, on the Triton interpreter (CPU tensors run the Triton kernels
    whatever the backend option). The backend option changes nothing there: the same bits. use_tma
    reaches the launchers (which then move tiles through the interpreter's descriptor emulation):
    the same result to the summation order inside a dot (test_tma's rule: twice flash-attn's
    allowance over plain fp32 attention), and right against fp64."""
    if backend != "interpret":
        pytest.skip("the Triton interpreter (the tiled path ignores the kernel options; CUDA: the tests below)")
    fwd_seen = _spy(monkeypatch, fwd_mod, "flash_attn_forward")
    bwd_seen = _spy(monkeypatch, bwd_mod, "flash_attn_backward")
    q, k, v = make_qkv(2, 45, 70, 4, 2, 64, torch.float32, "cpu", seed=31)
    do = make_qkv(2, 45, 70, 4, 2, 64, torch.float32, "cpu", seed=32)[0]

    def run(options):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = tileflash.flash_attn_func(*leaves, causal=True, options=options)
        return (out, *torch.autograd.grad(out, leaves, do))

    default = run(None)
    assert fwd_seen[-1]["use_tma"] is None and bwd_seen[-1]["use_tma"] is None
    for options in (Options(backend="triton"), Options(backend="gluon"), {"backend": "triton"}):
        for a, b in zip(run(options), default):
            assert torch.equal(a, b), options
    tma = run({"use_tma": True})
    assert fwd_seen[-1]["use_tma"] is True and bwd_seen[-1]["use_tma"] is True, "use_tma did not reach the launchers"
    assert run(Options(autotune=True)) is not None and fwd_seen[-1]["autotune"] is True
    check_out(tma[0], q, k, v, True)
    ref = ref_grads(q, k, v, do, True, upcast=True)
    eager = ref_grads(q, k, v, do, True, upcast=False)
    ref_out, _ = attention_ref(q.double(), k.double(), v.double(), causal=True)
    eager_out, _ = attention_ref(q, k, v, causal=True, upcast=False)
    for name, a, b, r, e, factor in zip(("out", "dq", "dk", "dv"), tma, default, (ref_out, *ref), (eager_out, *eager),
                                        (2, 3, 3, 3)):
        assert_error_rule(f"{name}: use_tma=True vs the default", a, b, max_err(e, r), 2 * factor,
                          rounding_atol(r, torch.float32))
        if name != "out":
            assert_error_rule(f"{name}: use_tma=True vs fp64", a, r, max_err(e, r), 3, rounding_atol(r, torch.float32))


def test_options_on_the_tiled_path(backend):
    """The tiled CPU path accepts every option and computes the same bits (options pick kernels)."""
    if backend != "tiled":
        pytest.skip("the tiled CPU path")
    q, k, v = make_qkv(1, 33, 47, 4, 2, 32, torch.float32, "cpu", seed=3)
    want = tileflash.flash_attn_func(q, k, v, causal=True)
    for options in (Options(backend="triton", use_tma=True), Options(backend="gluon", autotune=True),
                    {"pad_head_dim": False}):
        assert torch.equal(tileflash.flash_attn_func(q, k, v, causal=True, options=options), want)


# ---------------------------------------------------------------------------------------------
# Debug (TILEFLASH_DEBUG)
# ---------------------------------------------------------------------------------------------

def test_debug_from_env_parses():
    d = Debug.from_env("gluon_fused=1,pdl=2")
    assert d.gluon_fused is True and d.pdl == 2
    # the rest keep their defaults
    assert (d.gluon_bwd, d.gluon_dq, d.dq_delta, d.desc_cache) == (True, True, True, True)
    assert Debug.from_env("") == Debug()
    assert Debug().pdl == -1 and Debug().gluon_fused is False and Debug().scale_cast is True
    assert Debug.from_env("scale_cast=0").scale_cast is False
    d = Debug.from_env(" gluon_bwd=0 , desc_cache=0,dq_delta=0,gluon_dq=0,pdl=-1,")  # spaces, a trailing comma
    assert (d.gluon_bwd, d.desc_cache, d.dq_delta, d.gluon_dq, d.pdl) == (False, False, False, False, -1)
    for pdl in ("-1", "0", "1", "2", "3"):
        assert Debug.from_env(f"pdl={pdl}").pdl == int(pdl)


def test_debug_from_env_reads_the_environment(monkeypatch):
    monkeypatch.setenv("TILEFLASH_DEBUG", "gluon_dq=0,pdl=1")
    d = Debug.from_env()
    assert d.gluon_dq is False and d.pdl == 1
    monkeypatch.delenv("TILEFLASH_DEBUG")
    assert Debug.from_env() == Debug()


@pytest.mark.parametrize("text,match", [
    ("nosuch=1", r"TILEFLASH_DEBUG: 'nosuch=1' is not name=value with a name among \['desc_cache', "
                 r"'dq_delta', 'gluon_bwd', 'gluon_dq', 'gluon_fused', 'pdl', 'ptr_ints', 'scale_cast'\]"),
    ("gluon_fused", r"'gluon_fused' is not name=value"),
    ("gluon_fused=yes", r"TILEFLASH_DEBUG: gluon_fused='yes': use 0 or 1"),
    ("gluon_fused=2", r"gluon_fused='2': use 0 or 1"),
    ("pdl=7", r"TILEFLASH_DEBUG: pdl='7': use -1 \(the config's\), 0 \(off\), 1, 2 or 3"),
    ("pdl=on", r"pdl='on'"),
])
def test_debug_from_env_rejects(text, match):
    with pytest.raises(ValueError, match=match):
        Debug.from_env(text)


def test_bad_debug_env_fails_the_import():
    """A typo in TILEFLASH_DEBUG is an error at import (not a switch silently ignored)."""
    env = dict(os.environ, TILEFLASH_DEBUG="gluon_fusd=1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    res = subprocess.run([sys.executable, "-c", "import tileflash"], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=300)
    assert res.returncode != 0 and "TILEFLASH_DEBUG: 'gluon_fusd=1' is not name=value" in res.stderr, res.stderr


# ---------------------------------------------------------------------------------------------
# Lazy import
# ---------------------------------------------------------------------------------------------

def test_import_is_lazy():
    """`import tileflash` imports neither the interface (kernel modules, torch.library ops) nor
    triton (nor torch); Options is there at once; the first public function imports the interface."""
    code = """
import sys
import tileflash
print('tileflash.interface' in sys.modules, 'triton' in sys.modules)
print('torch' in sys.modules, 'tileflash.ops.route' in sys.modules, tileflash.Options().backend)
assert 'flash_attn_func' in dir(tileflash)
f = tileflash.flash_attn_func
print('tileflash.interface' in sys.modules, 'triton' in sys.modules)
from tileflash.interface import flash_attn_func
print(f is flash_attn_func, tileflash.flash_attn_func is f)
try:
    tileflash.no_such_name
except AttributeError as e:
    print('AttributeError', e)
"""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("TILEFLASH_DEBUG", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert lines[0] == "False False", lines
    assert lines[1] == "False False auto", lines
    assert lines[2] == "True True", lines
    assert lines[3] == "True True", lines
    assert lines[4] == "AttributeError module 'tileflash' has no attribute 'no_such_name'", lines


# ---------------------------------------------------------------------------------------------
# The router and Options on CUDA tensors
# ---------------------------------------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="Options(backend=...) applies to CUDA tensors only (CPU "
                                                     "tensors take the tiled path or the interpreter): needs a GPU")


@needs_cuda
def test_backend_gluon_outside_its_scope_raises():
    """Options(backend="gluon") on a call the Gluon kernels cannot take (softcap, a window, ALiBi,
    dropout, varlen, KV-cache decode, lengths off its tiles, fp16 at head dim 40): ValueError naming
    the reason, before anything is written; backend="auto" runs the Triton kernels instead."""
    gluon = Options(backend="gluon")
    q, k, v = make_qkv(2, 256, 256, 4, 2, 128, torch.float16, "cuda", seed=1)
    for kw in (dict(softcap=5.0), dict(window_size=(32, 0)), dict(alibi_slopes=torch.rand(4, device="cuda")),
               dict(dropout_p=0.1)):
        with pytest.raises(ValueError, match=r"backend='gluon'.*cannot take this call"):
            tileflash.flash_attn_func(q, k, v, options=gluon, **kw)
        assert torch.isfinite(tileflash.flash_attn_func(q, k, v, **kw)).all()  # "auto": the Triton kernels
    out = torch.full_like(q, float("nan"))
    with pytest.raises(ValueError, match=r"backend='gluon'.*cannot take this call"):
        route.forward(q, k, v, 0.1, False, softcap=5.0, options=gluon, out=out)
    assert out.isnan().all(), "a refused call wrote its output"
    qs, ks, vs = make_qkv(2, 200, 200, 4, 2, 40, torch.float16, "cuda", seed=2)  # off its tiles and widths
    with pytest.raises(ValueError, match=r"backend='gluon'"):
        tileflash.flash_attn_func(qs, ks, vs, options=gluon)
    cu = torch.tensor([0, 256, 512], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match=r"backend='gluon'.*varlen"):
        tileflash.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 256, 256,
                                         options=gluon)
    with pytest.raises(ValueError, match=r"backend='gluon'.*no Gluon decode kernel"):
        tileflash.flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=100, options=gluon)
    # with an append: refused before the new keys are written into the cache
    k_cache, v_cache = k.clone(), v.clone()
    with pytest.raises(ValueError, match=r"backend='gluon'.*no Gluon decode kernel"):
        tileflash.flash_attn_with_kvcache(q[:, :1], k_cache, v_cache, k[:, :1] + 1, v[:, :1] + 1, cache_seqlens=100,
                                          options=gluon)
    assert torch.equal(k_cache, k) and torch.equal(v_cache, v), "a refused call appended to the cache"
    # the backward: softcap is outside the Gluon backward's scope too
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = tileflash.flash_attn_func(*leaves, softcap=5.0)
    with pytest.raises(ValueError, match=r"backend='gluon'.*Gluon backward cannot take this call"):
        route.backward(torch.randn_like(q), q, k, v, out.detach(), torch.zeros(2, 4, 256, device="cuda"), 0.1,
                       False, softcap=5.0, options=gluon)


@pytest.mark.skipif(not (IS_SM90 and gluon_modules() is not None), reason="needs a Hopper GPU and triton's Gluon")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backend_triton_and_default_match_the_reference_on_hopper(causal, monkeypatch):
    """A call the Gluon kernels take: by default (and with backend="gluon") the Gluon forward and
    backward run, with backend="triton" neither does; every one meets flash-attn's rule against the
    reference (out: 2x, gradients: 3x the eager same-dtype error + rounding)."""
    gf, gb = gluon_modules()
    fwd_calls = count_calls(monkeypatch, gf, "forward")
    bwd_calls = count_calls(monkeypatch, gb, "backward")
    q, k, v = make_qkv(2, 256, 384, 4, 2, 128, torch.bfloat16, "cuda", seed=7)
    do = make_qkv(2, 256, 384, 4, 2, 128, torch.bfloat16, "cuda", seed=8)[0]
    ref = ref_grads(q.float(), k.float(), v.float(), do.float(), causal, upcast=True)
    eager = ref_grads(q, k, v, do, causal, upcast=False)
    for options, gluon in ((None, True), (Options(backend="gluon"), True), (Options(backend="triton"), False),
                           ({"backend": "triton", "use_tma": False}, False)):
        n_fwd, n_bwd = len(fwd_calls), len(bwd_calls)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = tileflash.flash_attn_func(*leaves, causal=causal, options=options)
        grads = torch.autograd.grad(out, leaves, do)
        assert (len(fwd_calls) - n_fwd, len(bwd_calls) - n_bwd) == ((1, 1) if gluon else (0, 0)), options
        check_out(out, q, k, v, causal)
        for name, g, r, e in zip(("dq", "dk", "dv"), grads, ref, eager):
            assert_error_rule(f"{name} ({options})", g, r, max_err(e, r), 3, rounding_atol(r, q.dtype))


def test_legacy_environment_switches_warn():
    """An environment switch of earlier releases is no longer read: setting one warns, naming what
    replaces it; none set, no warning."""
    import warnings

    from tileflash.options import LEGACY_SWITCHES, warn_legacy_switches

    with pytest.warns(FutureWarning, match=r"TILEFLASH_GLUON is no longer read.*backend='triton'"):
        assert warn_legacy_switches({"TILEFLASH_GLUON": "0", "PATH": "/bin"}) == ["TILEFLASH_GLUON"]
    with pytest.warns(FutureWarning, match=r"TILEFLASH_PDL.*TILEFLASH_DEBUG=pdl"):
        assert warn_legacy_switches({"TILEFLASH_PDL": "2"}) == ["TILEFLASH_PDL"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_legacy_switches({"TILEFLASH_CHECK_INPUTS": "1", "TILEFLASH_DEBUG": ""}) == []
    assert "TILEFLASH_CHECK_INPUTS" not in LEGACY_SWITCHES and "TILEFLASH_DEBUG" not in LEGACY_SWITCHES


def test_submodules_load_on_attribute_access():
    """After a bare ``import tileflash``, ``tileflash.interface`` (and the other submodules) load on
    first attribute access, as before the import became lazy."""
    import subprocess
    import sys

    code = ("import sys, tileflash; assert 'tileflash.interface' not in sys.modules; "
            "m = tileflash.interface; print(m.__name__, callable(m.flash_attn_func), tileflash.cpu.__name__)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split() == ["tileflash.interface", "True", "tileflash.cpu"]
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        tileflash.nosuch  # noqa: B018


def test_split_scratch_is_the_streams_two_buffers(monkeypatch):
    """``decode.split_scratch``: the current stream's partials buffer and ticket counters, the very
    buffers ``split_partials`` and ``ticket_counters`` keep, found with one lookup once both exist
    (those two functions are then not called); a first call, a larger request, a graph capture or a
    device without its counter arena goes through the two functions. CUDA calls are stand-ins (CPU
    machine); on the GPU every split decode call takes it (test_kvcache)."""
    import types

    from tileflash.ops.triton import decode

    state = dict(stream=7, capturing=False)

    def make(fill):
        return lambda n, dtype, device: torch.full((n,), fill, dtype=dtype)

    fake = types.SimpleNamespace(
        empty=make(1), zeros=make(0), float32=torch.float32, int32=torch.int32,
        cuda=types.SimpleNamespace(is_current_stream_capturing=lambda: state["capturing"], current_device=lambda: 0),
        _C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: (index, state["stream"])))
    monkeypatch.setattr(decode, "torch", fake)
    for name in ("_PARTIALS", "_COUNTERS", "_ARENAS"):
        monkeypatch.setattr(decode, name, {})
    monkeypatch.setattr(decode, "PARTIALS_MAX", 1000)
    monkeypatch.setattr(decode, "ARENA_COUNTERS", 64)
    calls = []
    for name in ("split_partials", "ticket_counters"):
        real = getattr(decode, name)
        monkeypatch.setattr(decode, name, (lambda real, name: lambda *a: calls.append(name) or real(*a))(real, name))
    dev = types.SimpleNamespace(type="cuda", index=0)
    buf, counters = decode.split_scratch(100, 16, dev)
    assert calls == ["split_partials", "ticket_counters"], "the first call makes the buffers"
    key = (0, (0, 7))
    assert buf is decode._PARTIALS[key] and counters is decode._COUNTERS[key]
    calls.clear()
    again = decode.split_scratch(90, 16, dev)
    assert again[0] is buf and again[1] is counters and calls == [], "found with one lookup"
    grown = decode.split_scratch(300, 16, dev)
    assert grown[0].numel() >= 300 and grown[1] is counters and calls == ["split_partials", "ticket_counters"]
    calls.clear()
    state["stream"] = 8
    other = decode.split_scratch(10, 16, dev)
    assert other[0] is not buf and other[1] is not counters and len(calls) == 2, "another stream, its own"
    calls.clear()
    state["stream"] = 7
    decode._ARENAS.clear()
    decode.split_scratch(10, 16, dev)
    assert len(calls) == 2 and 0 in decode._ARENAS, "no arena: ticket_counters makes it"
    calls.clear()
    state["capturing"] = True
    captured = decode.split_scratch(10, 16, dev)
    assert len(calls) == 2 and captured[0] is not decode._PARTIALS[key], "during a capture: fresh buffers"


@pytest.mark.skipif(not (IS_SM90 and gluon_modules() is not None), reason="needs a Hopper GPU and triton's Gluon")
@pytest.mark.parametrize("causal", [False, True])
def test_repeated_calls_replay_their_launch_plans(causal):
    """A second call of one layout runs the launches recorded by the first (route._FWD_PLANS,
    _BWD_PLANS) on fresh tensors: the same bits as the first call for the same inputs, and the
    error rule against fp64 for new inputs (poisoned buffers would show unwritten tiles)."""
    route._FWD_PLANS.clear()
    route._BWD_PLANS.clear()
    q, k, v = make_qkv(2, 256, 256, 4, 2, 128, torch.float16, "cuda", seed=3)
    do = torch.randn_like(q)

    def run(q, k, v):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = tileflash.flash_attn_func(*leaves, causal=causal)
        out.backward(do)
        return out.detach(), *(t.grad for t in leaves)

    first = run(q, k, v)
    assert len(route._FWD_PLANS) == 1 and len(route._BWD_PLANS) == 1, "the first call records its plans"
    second = run(q, k, v)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    q2, k2, v2 = make_qkv(2, 256, 256, 4, 2, 128, torch.float16, "cuda", seed=4)
    got = run(q2, k2, v2)
    # a debug switch changed after the recording is seen: the Gluon backward is not replayed
    from tileflash.options import DEBUG

    gb = gluon_modules()[1]
    calls = []
    real = gb.backward_dq
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DEBUG, "gluon_bwd", False)
        mp.setattr(gb, "backward_dq", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        off = run(q2, k2, v2)
        plans_off = len(route._BWD_PLANS)
    assert not calls and plans_off == 1, "gluon_bwd=0 must not replay (nor record) a Gluon backward"
    ref = ref_grads(q2, k2, v2, do, causal, upcast=True)
    eager = ref_grads(q2, k2, v2, do, causal, upcast=False)
    for name, g, g_off, r, e in zip("qkv", got[1:], off[1:], ref, eager):
        for which, grad in (("replayed", g), ("gluon_bwd=0", g_off)):
            assert_error_rule(f"{which} d{name}", grad, r, max_err(e, r), 2, rounding_atol(r, torch.float16))
    ref = attention_ref(*(t.cpu().double() for t in (q2, k2, v2)), causal=causal)[0]
    plain = attention_ref(q2.cpu(), k2.cpu(), v2.cpu(), causal=causal, upcast=False)[0]
    base = (plain.double() - ref).abs().max().item()
    assert_error_rule("replayed forward", got[0], ref, base, 2, rounding_atol(ref, torch.float16))


def test_lse_scratch_grows_keeps_old_buffers_and_caps():
    """``utils.lse_scratch``: one buffer per device that only grows (at least doubling); every
    buffer made stays alive (a kernel on another stream may still write it); above LSE_SCRATCH_MAX
    floats, or where it would have to grow during a graph capture, the caller allocates (None)."""
    from tileflash.ops import utils

    dev = torch.device("cpu")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(utils, "_LSE_SCRATCH", {})
        mp.setattr(utils, "_KEPT", [])
        small = utils.lse_scratch(10, dev)
        assert small.dtype == torch.float32 and small.numel() >= 10
        assert utils.lse_scratch(small.numel(), dev) is small, "a fitting request reuses the buffer"
        big = utils.lse_scratch(small.numel() + 1, dev)
        assert big.numel() >= 2 * small.numel()
        assert len(utils._KEPT) == 2 and utils._KEPT[0] is small and utils._KEPT[1] is big
        assert utils.lse_scratch(5, dev) is big
        assert utils.lse_scratch(utils.LSE_SCRATCH_MAX + 1, dev) is None
        assert utils._LSE_SCRATCH[dev] is big
        # a planned forward's buffers (route.replay_forward): the scratch for an LSE nobody takes,
        # its own LSE when asked for it or where the scratch declines
        q = torch.empty(1, 20, 4, 16)
        out, lse, own = route._planned_buffers(q, (1, 4, 20), 80, False, False)
        assert out.shape == q.shape and lse is big and not own
        for need, numel in ((True, 80), (False, utils.LSE_SCRATCH_MAX + 1)):
            out, lse, own = route._planned_buffers(q, (1, 4, 20), numel, need, False)
            assert own and lse.shape == (1, 4, 20) and lse.dtype == torch.float32 and lse is not big
        # Options.like_inputs: the output in q's memory order (here (b, h, s, d) memory seen as (b, s, h, d))
        qt = torch.empty(1, 4, 20, 16).transpose(1, 2)
        for like_q in (False, True):
            out, _, _ = route._planned_buffers(qt, (1, 4, 20), 80, True, like_q)
            assert out.shape == qt.shape and (out.stride() == qt.stride()) == like_q and out.is_contiguous() != like_q


def test_split_partials_are_per_stream_grow_and_decline(monkeypatch):
    """``decode.split_partials``: one buffer per (device, current stream) that a later request on that
    stream reuses or replaces by a larger one (at least doubling, at most ``PARTIALS_MAX``); another
    stream or device gets its own; past ``PARTIALS_STREAMS`` kept buffers all are dropped; a fresh,
    unkept buffer for a request above the cap, during a graph capture, or off CUDA. The CUDA calls are
    stand-ins (CPU machine); the GPU test is test_kvcache's ``test_split_partials_are_per_stream_and_capped``."""
    import types

    from tileflash.ops.triton import decode

    state = dict(stream=7, capturing=False)
    made = []

    def empty(n, dtype, device):
        made.append(n)
        return torch.empty(n, dtype=dtype)

    fake = types.SimpleNamespace(
        empty=empty, float32=torch.float32,
        cuda=types.SimpleNamespace(is_current_stream_capturing=lambda: state["capturing"], current_device=lambda: 0),
        _C=types.SimpleNamespace(_cuda_getCurrentRawStream=lambda index: (index, state["stream"])))
    monkeypatch.setattr(decode, "torch", fake)
    monkeypatch.setattr(decode, "_PARTIALS", {})
    monkeypatch.setattr(decode, "PARTIALS_MAX", 1000)
    monkeypatch.setattr(decode, "PARTIALS_STREAMS", 3)
    dev0, dev1 = types.SimpleNamespace(type="cuda", index=0), types.SimpleNamespace(type="cuda", index=1)
    kept = decode._PARTIALS
    a = decode.split_partials(100, dev0)
    assert a.numel() == 100 and a.dtype == torch.float32 and made == [100]
    assert decode.split_partials(60, dev0) is a, "reused on its stream"
    b = decode.split_partials(101, dev0)
    assert b is not a and b.numel() == 200 and made == [100, 200], "grown by doubling"
    assert decode.split_partials(900, dev0).numel() == 900  # (max(n, 2 * 200))
    assert decode.split_partials(950, dev0).numel() == 1000, "capped"
    big = decode.split_partials(1001, dev0)
    assert big.numel() == 1001 and kept[(0, (0, 7))].numel() == 1000, "above the cap: fresh, not kept"
    state["stream"] = 8
    c = decode.split_partials(10, dev0)
    assert c.numel() == 10 and len(kept) == 2, "another stream, another buffer"
    assert decode.split_partials(10, dev1) is not c and len(kept) == 3
    state["stream"] = 9
    decode.split_partials(10, dev0)
    assert len(kept) == 1, "past PARTIALS_STREAMS the kept buffers are dropped"
    state["capturing"] = True
    d = decode.split_partials(10, dev0)
    assert d is not kept[(0, (0, 9))] and len(kept) == 1, "during a capture: fresh, not kept"
    state["capturing"] = False
    cpu = decode.split_partials(10, types.SimpleNamespace(type="cpu", index=None))
    assert cpu.numel() == 10 and len(kept) == 1


@pytest.mark.skipif(not (IS_SM90 and gluon_modules() is not None), reason="needs a Hopper GPU and triton's Gluon")
@pytest.mark.parametrize("causal", [False, True])
def test_forward_without_lse_writes_it_to_the_scratch(causal):
    """A forward whose LSE nobody takes (no gradient, return_attn_probs=False) writes it into the
    shared scratch buffer instead of a fresh allocation (``route.forward(need_lse=False)``): the
    output meets the error rule on fresh inputs, the scratch holds the same bits as the LSE of the
    same call with return_attn_probs=True (so the planned kernel did write it there), and
    route.forward returns None for it."""
    from tileflash import interface
    from tileflash.ops import utils

    route._FWD_PLANS.clear()
    # (and flash_attn_func's own replays, which an earlier test in this process may have kept for this
    # signature: they skip route.forward, so its plans would stay empty)
    interface._FAST_FWD.clear()
    q, k, v = make_qkv(2, 256, 256, 4, 2, 128, torch.float16, "cuda", seed=11)
    want_out, want_lse, _ = tileflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    n = want_lse.numel()
    scratch = utils.lse_scratch(n, q.device)
    scratch[:n].fill_(float("nan"))
    out = tileflash.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    assert len(route._FWD_PLANS) == 1, "both calls replay one plan"
    assert torch.equal(out, want_out)
    assert torch.equal(scratch[:n].view_as(want_lse), want_lse), "the scratch must hold the call's LSE"
    assert route.forward(q, k, v, 128 ** -0.5, causal, need_lse=False)[1] is None
    ref = attention_ref(*(t.cpu().double() for t in (q, k, v)), causal=causal)[0]
    plain = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=causal, upcast=False)[0]
    assert_error_rule("forward without LSE", out, ref, (plain.double() - ref).abs().max().item(), 2,
                      rounding_atol(ref, torch.float16))


def test_replayed_forward_puts_an_unwanted_lse_in_the_scratch():
    """``route._replay_forward`` (the planned Gluon forward; here with a stand-in kernel module on
    CPU tensors): with need_lse=False the launch gets the scratch buffer for its LSE and None comes
    back; with need_lse=True a fresh (batch, nheads, seqlen_q) LSE, as before; a launch that did not
    compile (None) drops the plan."""
    from tileflash.ops import utils

    seen = []

    class StandIn:
        ok = True

        @staticmethod
        def forward(q, k, v, out, lse, softmax_scale, causal, plan):
            seen.append(lse)
            out.fill_(1.0)
            lse.view(-1)[:6].fill_(2.0)
            return (out, lse) if StandIn.ok else None

    q = torch.randn(1, 3, 2, 8)
    plan = (StandIn, "gplan", (1, 2, 3), 6, False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(utils, "_LSE_SCRATCH", {})
        mp.setattr(route, "_FWD_PLANS", {"key": plan})
        out, lse = route._replay_forward(plan, "key", q, q, q, 1.0, False, need_lse=False)
        assert lse is None and torch.equal(out, torch.ones_like(q))
        assert seen[-1] is utils._LSE_SCRATCH[q.device] and torch.equal(seen[-1][:6], torch.full((6,), 2.0))
        out, lse = route._replay_forward(plan, "key", q, q, q, 1.0, False)
        assert lse is seen[-1] and lse.shape == (1, 2, 3) and torch.equal(lse, torch.full((1, 2, 3), 2.0))
        qt = torch.randn(1, 2, 3, 8).transpose(1, 2)  # a plan made with Options.like_inputs: q's memory order
        out, _ = route._replay_forward(plan[:4] + (True,), "key", qt, qt, qt, 1.0, False)
        assert out.stride() == qt.stride() and torch.equal(out, torch.ones_like(qt))
        StandIn.ok = False
        assert route._replay_forward(plan, "key", q, q, q, 1.0, False, need_lse=False) is None
        assert "key" not in route._FWD_PLANS


def test_prepared_signature_ignores_the_key_length(monkeypatch, backend):
    """flash_attn_func keeps one validated signature for calls whose keys differ only in length (a
    decoding loop whose keys grow every step), and sets the causal shift (seqlen_k - seqlen_q) per
    call: every length matches the reference (the bottom-right causal mask depends on it), and a
    call with k and v of different lengths is still refused. Runs the CUDA-only cache on CPU
    tensors (``interface._PREPARE_CPU``) where there is no GPU."""
    from tileflash import interface

    if backend == "tiled":
        pytest.skip("one CPU backend is enough for the host-side cache")
    dev = "cuda" if backend == "cuda" else "cpu"
    monkeypatch.setattr(interface, "_PREPARE_CPU", True)
    interface._PREPARED.clear()
    dtype = torch.float16 if dev == "cuda" else torch.float32
    for sk in (5, 9, 3, 40):  # (3 < seqlen_q: the first rows see no key)
        q, k, v = make_qkv(1, 4, sk, 4, 2, 16, dtype, dev, seed=sk)
        out = tileflash.flash_attn_func(q, k, v, causal=True)
        ref = attention_ref(*(t.cpu().double() for t in (q, k, v)), causal=True)[0]
        plain = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=True, upcast=False)[0]
        assert_error_rule(f"seqlen_k={sk}", out, ref, (plain.double() - ref).abs().max().item(), 2,
                          rounding_atol(ref, dtype))
    assert len(interface._PREPARED) == 1, "one signature for every key length"
    with pytest.raises(ValueError, match="same seqlen"):
        tileflash.flash_attn_func(q, k, v[:, :7], causal=True)


def test_fast_forward_replays_only_its_own_signature(monkeypatch):
    """flash_attn_func's one-key replay (``interface._FAST_FWD``, for more than DECODE_MAX_Q query
    tokens): after a validated call without
    autograd whose route planned a Gluon launch (here a stand-in plan, on CPU tensors through
    ``_PREPARE_CPU``), the same signature replays that plan directly (``route.replay_forward``) with
    the call's scale and LSE request; every change of layout, dtype, argument value or argument type,
    a call that needs a gradient, and a replay that declines (None) take the full path, whose
    output meets the error rule."""
    from tileflash import interface

    monkeypatch.setattr(interface, "_PREPARE_CPU", True)
    monkeypatch.setattr(interface, "_FAST_FWD", {})
    interface._PREPARED.clear()
    replays, declined = [], []

    def planned(q, k, v, scale, causal, shift, window, softcap, dropout_p, options):
        return ("plan", q.dtype, q.stride(), causal, window)

    def replay(plan, q, k, v, scale, need_lse=True):
        replays.append((plan, scale, need_lse))
        if declined:
            return None
        return torch.full_like(q, 7.0), (torch.zeros(1) if need_lse else None)

    monkeypatch.setattr(route, "planned_forward", planned)
    monkeypatch.setattr(route, "replay_forward", replay)
    q, k, v = (torch.randn(1, 20, 4, 16) for _ in range(3))

    def full_path_ok(out, q, k, v, causal=False, scale=None, window=(-1, -1), atol=1e-6):
        ref = attention_ref(q.double(), k.double(), v.double(), causal=causal, softmax_scale=scale,
                            window_size=window)[0]
        plain = attention_ref(q, k, v, causal=causal, softmax_scale=scale, window_size=window, upcast=False)[0]
        assert_error_rule("full path", out, ref, (plain.double() - ref).abs().max().item(), 2, atol)

    full_path_ok(tileflash.flash_attn_func(q, k, v), q, k, v)
    assert not replays and len(interface._FAST_FWD) == 1
    out = tileflash.flash_attn_func(q, k, v)
    assert replays == [(("plan", torch.float32, q.stride(), False, (-1, -1)), 16 ** -0.5, False)]
    assert torch.equal(out, torch.full_like(q, 7.0))
    out, lse, none = tileflash.flash_attn_func(q, k, v, return_attn_probs=True)
    assert replays[-1][2] is True and none is None and torch.equal(out, torch.full_like(q, 7.0))

    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides
    misses = [
        ("strides", (qt, k, v), {}),
        ("k strides", (q, k.transpose(1, 2).contiguous().transpose(1, 2), v), {}),
        ("v strides", (q, k, v.transpose(1, 2).contiguous().transpose(1, 2)), {}),
        ("dtype", (q.half(), k.half(), v.half()), {}),
        ("causal", (q, k, v), dict(causal=True)),
        ("scale", (q, k, v), dict(softmax_scale=0.3)),
        ("scale as int", (q, k, v), dict(softmax_scale=1)),
        ("window", (q, k, v), dict(window_size=(3, -1))),
        ("window as list", (q, k, v), dict(window_size=[-1, -1])),
        ("options", (q, k, v), dict(options=Options(autotune=True))),
        ("options as dict", (q, k, v), dict(options={})),
        ("deterministic", (q, k, v), dict(deterministic=True)),
    ]
    for name, tensors, kw in misses:
        n = len(replays)
        got = tileflash.flash_attn_func(*tensors, **kw)
        assert len(replays) == n, f"{name}: another signature must not replay the plan"
        scale = kw.get("softmax_scale")
        window = kw.get("window_size", (-1, -1))
        full_path_ok(got.float(), *(t.float() for t in tensors), causal=bool(kw.get("causal", False)),
                     scale=scale, window=tuple(window), atol=1e-3 if name == "dtype" else 1e-6)
    # an argument equal to a kept one but of a refused type is refused, not replayed (0 == False)
    n = len(replays)
    with pytest.raises(TypeError, match="causal must be a bool"):
        tileflash.flash_attn_func(q, k, v, causal=0)
    assert len(replays) == n
    # a call that needs a gradient replays the plan inside the autograd class, with the LSE (its
    # backward: test_fast_backward_replays_only_its_own_signature)
    qg = q.clone().requires_grad_()
    n = len(replays)
    out = tileflash.flash_attn_func(qg, k, v)
    assert len(replays) == n + 1 and replays[-1][2] is True and out.requires_grad
    assert torch.equal(out.detach(), torch.full_like(q, 7.0))
    with torch.no_grad():
        tileflash.flash_attn_func(qg, k, v)
    assert len(replays) == n + 2 and replays[-1][2] is False, "without grad mode the same signature replays"
    # a replay that declines (a misaligned pointer, another device): the full path's output
    declined.append(True)
    full_path_ok(tileflash.flash_attn_func(q, k, v), q, k, v)
    # a few query tokens (the decode kernel's calls, whose keys grow every step) keep no entry
    kept = len(interface._FAST_FWD)
    for _ in range(2):
        full_path_ok(tileflash.flash_attn_func(q[:, :1], k, v), q[:, :1], k, v)
    assert len(interface._FAST_FWD) == kept


def test_fast_backward_replays_only_its_own_signature(monkeypatch):
    """Under autograd a repeated ``flash_attn_func`` signature replays its planned forward inside
    the autograd class, and its backward replays the launches that the signature's first backward
    through the route recorded into its ``_FAST_FWD`` entry (``route.planned_backward`` /
    ``route.replay_backward``; stand-ins here, on CPU tensors through ``_PREPARE_CPU``). Another
    signature never gets them, a replay that declines (None) runs the route, and every gradient
    that the route computes meets the error rule."""
    from tileflash import interface

    monkeypatch.setattr(interface, "_PREPARE_CPU", True)
    monkeypatch.setattr(interface, "_FAST_FWD", {})
    interface._PREPARED.clear()
    fwd_replays, planned_bwd, bwd_replays, declined = [], [], [], []

    def planned(q, k, v, scale, causal, shift, window, softcap, dropout_p, options):
        return ("fplan", causal)

    def replay(plan, q, k, v, scale, need_lse=True):  # the route's own forward: right outputs and LSE
        fwd_replays.append((plan, need_lse))
        return route.forward(q, k, v, scale, plan[1], 0)

    def planned_backward(dout, q, k, v, out, lse, scale, causal, shift, window, softcap, dropout_p, options,
                         deterministic):
        planned_bwd.append((causal, window))
        return None if window != (-1, -1) else ("bplan", causal, dout.stride())

    def replay_backward(kept, dout, q_, k_, v_, out, lse, scale, deterministic):
        # the call passes the saved inputs and outputs, the scale and the deterministic flag
        assert torch.equal(q_, q) and torch.equal(k_, k) and torch.equal(v_, v) and torch.equal(dout, dout_seen[-1])
        assert out.shape == q.shape and lse.shape == (1, 4, 20) and scale == 0.25 and deterministic is False
        bwd_replays.append(kept)
        if declined:
            return None
        return torch.full_like(q, 3.0), torch.full_like(k, 4.0), torch.full_like(v, 5.0)

    monkeypatch.setattr(route, "planned_forward", planned)
    monkeypatch.setattr(route, "replay_forward", replay)
    monkeypatch.setattr(route, "planned_backward", planned_backward)
    monkeypatch.setattr(route, "replay_backward", replay_backward)
    q, k, v = (torch.randn(1, 20, 4, 16) for _ in range(3))
    dout = torch.randn(1, 20, 4, 16)
    dout_seen = [dout]

    def step(causal=False, window=(-1, -1), grad=dout):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = tileflash.flash_attn_func(qg, kg, vg, causal=causal, window_size=window)
        out.backward(grad)
        return out.detach(), qg.grad, kg.grad, vg.grad

    def route_ok(got, causal=False):
        qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
        ref = attention_ref(qd, kd, vd, causal=causal)[0]
        ref_grads = torch.autograd.grad(ref, (qd, kd, vd), dout.double())
        qp, kp, vp = (t.clone().requires_grad_() for t in (q, k, v))
        plain = attention_ref(qp, kp, vp, causal=causal, upcast=False)[0]
        plain_grads = torch.autograd.grad(plain, (qp, kp, vp), dout)
        for name, g, r, p in zip(("out", "dq", "dk", "dv"), got, (ref.detach(), *ref_grads),
                                 (plain.detach(), *plain_grads)):
            assert_error_rule(name, g, r, (p.double() - r).abs().max().item(), 2, 1e-6)

    plain = (False, (-1, -1))
    route_ok(step())                      # validated, kept; no backward kept yet
    assert not fwd_replays and not planned_bwd and len(interface._FAST_FWD) == 1
    route_ok(step())                      # forward replayed; backward by the route, then kept
    assert fwd_replays == [(("fplan", False), True)] and planned_bwd == [plain] and not bwd_replays
    out, dq, dk, dv = step()              # both replayed: autograd hands on the replay's gradients
    assert bwd_replays == [("bplan", False, dout.stride())]
    assert torch.equal(dq, torch.full_like(q, 3.0)) and torch.equal(dk, torch.full_like(k, 4.0))
    assert torch.equal(dv, torch.full_like(v, 5.0))
    # another signature (causal) keeps its own backward, never this one's
    route_ok(step(True), True)
    route_ok(step(True), True)
    assert planned_bwd == [plain, (True, (-1, -1))] and len(bwd_replays) == 1
    step(True)
    assert bwd_replays[-1] == ("bplan", True, dout.stride())
    # a replay that declines: the route's gradients, and what the route keeps now is recorded again
    declined.append(True)
    route_ok(step())
    assert len(bwd_replays) == 3 and bwd_replays[-1][1] is False and planned_bwd[-1] == plain
    # only some inputs needing a gradient, and the LSE asked for: the same kept entry, right outputs
    declined.clear()
    kg = k.clone().requires_grad_()
    out, lse, _ = tileflash.flash_attn_func(q, kg, v, return_attn_probs=True)
    out.backward(dout)
    assert len(bwd_replays) == 4 and torch.equal(kg.grad, torch.full_like(k, 4.0)) and lse.shape == (1, 4, 20)
    # a signature whose route keeps no launches (here: a window): after a dO that the route made
    # contiguous first (nothing could be kept for it), looked up again; then, not found, never again
    n = len(planned_bwd)
    odd = torch.randn(1, 20, 4, 32)[..., ::2]   # dO with a non-unit last stride
    dout_seen.append(odd)
    step(window=(3, 3))                   # validated, kept
    step(window=(3, 3), grad=odd)         # looked up: nothing
    for _ in range(3):
        step(window=(3, 3))               # looked up once more: nothing, for a dO it could keep
    assert planned_bwd[n:] == [(False, (3, 3))] * 2 and len(bwd_replays) == 4
    # saved-tensor hooks (offloading, checkpointing) may hand the backward other tensors: the kept
    # launches stay unused under them, and the route computes the gradients
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.clone(), lambda t: t):
        route_ok(step())
    assert len(bwd_replays) == 4


@pytest.mark.parametrize("sq", [37, 3, 1])
@pytest.mark.parametrize("memory", ["bhsd", "bshd"])
def test_sdpa_drop_in_output_takes_the_query_memory_order(memory, sq):
    """``tileflash.scaled_dot_product_attention`` returns its output in query's memory order
    (``Options.like_inputs``): (b, h, s, d)-contiguous inputs give a contiguous output, as torch's
    function does, and (b, h, s, d) views of (b, s, h, d) memory give such a view; the values meet
    the error rule against torch's SDPA in fp64, on the first call and on a kept signature."""
    f = torch.nn.functional.scaled_dot_product_attention
    q, k, v = (torch.randn(2, n, h, 16) for n, h in ((sq, 4), (37, 2), (37, 2)))  # (b, s, h, d) memory
    if memory == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    else:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    ref = f(*(t.double() for t in (q, k, v)), is_causal=True, enable_gqa=True)
    plain = f(q, k, v, is_causal=True, enable_gqa=True)
    for _ in range(2):
        out = tileflash.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        assert out.stride() == q.stride(), (out.stride(), q.stride())
        assert_error_rule("out", out, ref, (plain.double() - ref).abs().max().item(), 2, 1e-6)
    # the gradients in their inputs' memory order too (autograd then keeps them without a copy)
    do = torch.randn_like(ref)
    leaves64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref_g = torch.autograd.grad(f(*leaves64, is_causal=True, enable_gqa=True), leaves64, do)
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]  # (clone keeps the memory order)
    plain_g = torch.autograd.grad(f(*leaves, is_causal=True, enable_gqa=True), leaves, do.float())
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        got = torch.autograd.grad(tileflash.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True),
                                  leaves, do.float())
        for name, g, t, r, p in zip(("dq", "dk", "dv"), got, leaves, ref_g, plain_g):
            assert g.stride() == t.stride(), (name, g.stride(), t.stride())
            assert_error_rule(name, g, r, (p.double() - r).abs().max().item(), 2, 1e-6)


@pytest.mark.parametrize("memory", ["bhsd", "bshd"])
def test_sdpa_drop_in_kept_autograd_node_does_the_transposes(monkeypatch, memory):
    """Under autograd a kept ``tileflash.scaled_dot_product_attention`` signature goes through one
    autograd node that transposes inside (``_EagerAttentionBHSD``), with the output and gradients of
    the first call (which goes through transposed views): bitwise, on CPU tensors through
    ``_PREPARE_CPU``; the gradients in their inputs' memory order; an output modified in place
    before the backward gets autograd's usual error (the backward reads the output, as torch's SDPA
    does), not the one for views made inside a custom Function."""
    from tileflash import interface

    monkeypatch.setattr(interface, "_PREPARE_CPU", True)
    monkeypatch.setattr(interface, "_FAST_SDPA", {})
    q, k, v = (torch.randn(2, 29, h, 16) for h in (4, 2, 2))  # (b, s, h, d) memory
    q, k, v = (t.transpose(1, 2).contiguous() if memory == "bhsd" else t.transpose(1, 2) for t in (q, k, v))
    do = torch.randn(2, 4, 29, 16)

    def step(scale_in_place=False):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = tileflash.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
        node = type(out.grad_fn).__name__
        if scale_in_place:
            out.mul_(3.0)
        grads = torch.autograd.grad(out, leaves, do)
        return out.detach(), grads, leaves, node

    first, first_g, _, node = step()
    assert node != "_EagerAttentionBHSDBackward" and len(interface._FAST_SDPA) == 1
    for _ in range(2):
        out, grads, leaves, node = step()
        assert node == "_EagerAttentionBHSDBackward", node
        assert torch.equal(out, first) and all(torch.equal(a, b) for a, b in zip(grads, first_g))
        assert all(g.stride() == t.stride() for g, t in zip(grads, leaves)), [g.stride() for g in grads]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        step(scale_in_place=True)

    class NoGrad(torch.autograd.Function):  # hands its input an undefined gradient
        @staticmethod
        def forward(ctx, x):
            return x.sum()

        @staticmethod
        def backward(ctx, g):
            return None

    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = tileflash.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True)
    assert type(out.grad_fn).__name__ == "_EagerAttentionBHSDBackward"
    grads = torch.autograd.grad(NoGrad.apply(out) + sum(t.sum() for t in leaves), leaves)
    assert all(torch.equal(g, torch.ones_like(t)) for g, t in zip(grads, leaves)), "zero from attention"


def test_sdpa_drop_in_replays_only_its_own_signature(monkeypatch):
    """``tileflash.scaled_dot_product_attention`` keeps its validated signatures (``_FAST_SDPA``:
    the arguments as given, scalars by value and type) like ``flash_attn_func``: a repeat replays
    the planned forward (stand-ins on CPU tensors, through ``_PREPARE_CPU``) without the LSE, under
    autograd inside the autograd class; any other signature, a mask, dropout, a refused argument
    type and inputs that had to be copied (head dim not unit-strided) take the full path, which
    raises or meets the error rule."""
    from tileflash import interface

    monkeypatch.setattr(interface, "_PREPARE_CPU", True)
    monkeypatch.setattr(interface, "_FAST_SDPA", {})
    replays = []

    def planned(q, k, v, scale, causal, shift, window, softcap, dropout_p, options):
        return ("plan", q.stride(), scale, causal)

    def replay(plan, q, k, v, scale, need_lse=True):
        replays.append((plan, need_lse))
        return torch.full_like(q, 7.0), (torch.zeros(1) if need_lse else None)

    monkeypatch.setattr(route, "planned_forward", planned)
    monkeypatch.setattr(route, "replay_forward", replay)
    sdpa = tileflash.scaled_dot_product_attention
    q = torch.randn(1, 4, 20, 16)
    k, v = torch.randn(1, 2, 20, 16), torch.randn(1, 2, 20, 16)

    def full_ok(out, q, k, v, causal=False, scale=None, atol=1e-6):
        f = torch.nn.functional.scaled_dot_product_attention
        ref = f(q.double(), k.double(), v.double(), is_causal=causal, scale=scale, enable_gqa=True)
        plain = f(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)
        assert_error_rule("full path", out, ref, (plain.double() - ref).abs().max().item(), 2, atol)

    full_ok(sdpa(q, k, v, enable_gqa=True), q, k, v)
    assert not replays and len(interface._FAST_SDPA) == 1
    out = sdpa(q, k, v, enable_gqa=True)
    qt = q.transpose(1, 2)  # the (batch, seqlen, nheads, headdim) view the op takes
    assert replays == [(("plan", qt.stride(), 0.25, False), False)]
    assert out.shape == q.shape and torch.equal(out, torch.full_like(q, 7.0))

    misses = [
        ("dtype", (q.half(), k.half(), v.half()), dict(enable_gqa=True)),
        ("strides", (q.transpose(1, 2).contiguous().transpose(1, 2), k, v), dict(enable_gqa=True)),
        ("key strides", (q, k.transpose(1, 2).contiguous().transpose(1, 2), v), dict(enable_gqa=True)),
        ("value strides", (q, k, v.transpose(1, 2).contiguous().transpose(1, 2)), dict(enable_gqa=True)),
        ("is_causal", (q, k, v), dict(enable_gqa=True, is_causal=True)),
        ("scale", (q, k, v), dict(enable_gqa=True, scale=0.3)),
        ("scale as int", (q, k, v), dict(enable_gqa=True, scale=1)),
        ("enable_gqa as int", (q, k, v), dict(enable_gqa=1)),
        ("options", (q, k, v), dict(enable_gqa=True, options=Options(autotune=True))),
        ("options as dict", (q, k, v), dict(enable_gqa=True, options={})),
        ("dropout_p as int", (q, k, v), dict(enable_gqa=True, dropout_p=0)),
    ]
    for name, tensors, kw in misses:
        n = len(replays)
        got = sdpa(*tensors, **kw)
        assert len(replays) == n, f"{name}: another signature must not replay the plan"
        full_ok(got.float(), *(t.float() for t in tensors), causal=kw.get("is_causal", False),
                scale=kw.get("scale"), atol=1e-3 if name == "dtype" else 1e-6)
    n = len(replays)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        sdpa(q, k, v, attn_mask=torch.ones(20, 20, dtype=torch.bool), enable_gqa=True)
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(q, k, v, dropout_p=0.1, enable_gqa=True)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        sdpa(q, k, v, is_causal=0, enable_gqa=True)
    with pytest.raises(ValueError, match="enable_gqa"):
        sdpa(q, k, v)
    assert len(replays) == n
    # inputs whose head dim is not unit-strided are copied for the kernels: no entry for them
    kept = len(interface._FAST_SDPA)
    qs = torch.randn(1, 4, 20, 32)[..., ::2]
    for _ in range(2):
        full_ok(sdpa(qs, k, v, enable_gqa=True), qs, k, v)
    assert len(interface._FAST_SDPA) == kept and len(replays) == n
    # under autograd: the kept plan, with the LSE the backward needs
    qg = q.clone().requires_grad_()
    out = sdpa(qg, k, v, enable_gqa=True)
    assert len(replays) == n + 1 and replays[-1][1] is True and out.requires_grad


def test_replay_backward_declines_what_its_plan_did_not_see(monkeypatch):
    """``route.replay_backward`` replays a kept backward (``route.planned_backward``'s tuple: dO's
    strides, the process-wide switches, the launches) only for dO of the same strides, the same
    ``deterministic`` resolution (argument or ``torch.use_deterministic_algorithms``) and debug
    switches, 16-byte-aligned pointers and the current device; otherwise None (the caller runs the
    route). A stand-in module records the replays; CPU tensors stand for one device."""
    from tileflash.options import DEBUG

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: None, raising=False)  # (a CPU tensor's index)
    ran = []

    class FakeBackward:
        @staticmethod
        def replay_default(launches, dout, q, k, v, out, lse, scale, like_inputs):
            ran.append((launches, scale, like_inputs))
            return "grads"

    q, k, v, out, dout = (torch.randn(1, 32, 2, 16) for _ in range(5))
    lse = torch.randn(1, 2, 32)
    kept = ((dout.stride(), q.stride(), k.stride(), v.stride(), out.stride(), lse.stride()),
            route._bwd_switches(False), (FakeBackward, "launches"), False)
    assert route.replay_backward(kept, dout, q, k, v, out, lse, 0.25) == "grads"
    assert ran == [("launches", 0.25, False)]
    # a plan recorded with Options.like_inputs allocates the gradients in their inputs' memory order
    assert route.replay_backward(kept[:3] + (True,), dout, q, k, v, out, lse, 0.25) == "grads"
    assert ran.pop() == ("launches", 0.25, True)

    def other_strides(t):  # same shape and values, another layout (as a saved-tensor hook may hand it)
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)

    def misaligned(t):  # same shape and strides, 4 bytes off a 16-byte boundary
        return torch.randn(t.numel() + 1)[1:].view(t.shape)

    tensors = dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    for name in tensors:
        for how, change in (("strides", other_strides), ("misaligned", misaligned)):
            if how == "misaligned" and name in ("out", "lse"):
                continue  # (the launches check those pointers themselves: Launch's cacheable test)
            args = dict(tensors, **{name: change(tensors[name])})
            assert route.replay_backward(kept, *args.values(), 0.25) is None, f"{name} {how}"
    assert route.replay_backward(kept, dout, q, k, v, out, lse, 0.25, True) is None, "deterministic argument"
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 3, raising=False)
    assert route.replay_backward(kept, dout, q, k, v, out, lse, 0.25) is None, "another current device"
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: None, raising=False)
    for name in ("gluon_fused", "gluon_bwd", "gluon_dq", "dq_delta"):
        with monkeypatch.context() as m:
            m.setattr(DEBUG, name, not getattr(DEBUG, name))
            assert route.replay_backward(kept, dout, q, k, v, out, lse, 0.25) is None, name
    det = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert route.replay_backward(kept, dout, q, k, v, out, lse, 0.25) is None, "use_deterministic_algorithms"
    finally:
        torch.use_deterministic_algorithms(det)
    assert len(ran) == 1
    assert route.planned_backward(dout, q, k, v, out, lse, 0.25, False, 0) is None, "CPU tensors plan nothing"


def test_planned_launch_passes_its_pointers_as_addresses(monkeypatch):
    """A kept launch (``ops.launch.Launch`` with a compiled runner) hands the runner its raw pointers
    as the integers ``addresses`` read (None kept), so that triton's C launcher makes no
    ``data_ptr`` call and driver pointer query per tensor; a pointer off a 16-byte boundary makes
    ``addresses`` False and the launch goes through the JIT (which specializes on alignment) with
    the tensors; a bool ``cacheable`` and the debug switch ``ptr_ints=0`` pass the tensors
    themselves. Stand-ins for the kernel and the runner; CPU tensors stand for one device."""
    from tileflash.ops.launch import Launch, addresses
    from tileflash.options import DEBUG

    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: None, raising=False)  # (a CPU tensor's index)
    monkeypatch.setattr(DEBUG, "ptr_ints", True)
    calls = []

    class Kernel:  # the JIT's kernel[grid](*args, **constexprs), which leaves no runner
        def __getitem__(self, grid):
            return lambda *args, **constexprs: calls.append(("jit", args))

    launch = Launch(Kernel(), (1,), (), 3, (7, 8), 1, {})
    launch.runner = (None, lambda *args: calls.append(("runner", args)))
    a, b = torch.randn(64), torch.randn(32)
    launch((), (a, None, b), (2,), addresses(a, None, b))
    assert calls.pop() == ("runner", (a.data_ptr(), None, b.data_ptr(), 7, 8, 2.0))
    launch((), (a, None, b), (2,), addresses(a, None, b), (9, 10))  # this call's integers
    assert calls.pop() == ("runner", (a.data_ptr(), None, b.data_ptr(), 9, 10, 2.0))
    off = torch.randn(66)[2:]  # 8 bytes off a 16-byte boundary
    assert addresses(a, off) is False
    launch((), (a, None, off), (2,), addresses(a, None, off))
    kind, args = calls.pop()
    assert kind == "jit" and args[0] is a and args[1] is None and args[2] is off and args[3:] == (7, 8, 2.0)
    launch((), (a, None, b), (2,), True)  # a bool: the tensors
    kind, args = calls.pop()
    assert kind == "runner" and args[0] is a and args[2] is b and args[3:] == (7, 8, 2.0)
    monkeypatch.setattr(DEBUG, "ptr_ints", False)
    assert addresses(a, None, b) is True and addresses(a, off) is False
    launch((), (a, None, b), (2,), addresses(a, None, b))
    kind, args = calls.pop()
    assert kind == "runner" and args[0] is a and args[2] is b
    assert calls == []


@pytest.mark.skipif(not (IS_SM90 and gluon_modules() is not None), reason="needs a Hopper GPU and triton's Gluon")
@pytest.mark.parametrize("causal", [False, True])
def test_fast_forward_replay_on_the_gpu(causal):
    """The one-key replay on the Gluon forward (``interface._FAST_FWD`` -> ``route.replay_forward``):
    a repeated call without autograd gives the first call's bits (output and LSE), a packed-QKV view
    (other strides, same shapes) is its own signature and meets the error rule on fresh inputs, and
    a call at an address that is not 16-byte aligned declines the replay and is still right."""
    from tileflash import interface

    interface._FAST_FWD.clear()
    route._FWD_PLANS.clear()
    q, k, v = make_qkv(2, 256, 256, 4, 4, 128, torch.float16, "cuda", seed=21)
    first = tileflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]
    assert len(interface._FAST_FWD) == 1, "the first call keeps its planned forward"
    again = tileflash.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)[:2]
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert torch.equal(tileflash.flash_attn_func(q, k, v, causal=causal), first[0])

    def check(name, out, q, k, v):
        ref = attention_ref(*(t.cpu().double() for t in (q, k, v)), causal=causal)[0]
        plain = attention_ref(q.cpu(), k.cpu(), v.cpu(), causal=causal, upcast=False)[0]
        assert_error_rule(name, out, ref, (plain.double() - ref).abs().max().item(), 2,
                          rounding_atol(ref, torch.float16))

    qkv = torch.randn(2, 256, 3, 4, 128, device="cuda", dtype=torch.float16)
    qp, kp, vp = qkv.unbind(2)
    for _ in range(2):  # the second call replays the packed layout's own plan
        check("packed", tileflash.flash_attn_func(qp, kp, vp, causal=causal), qp, kp, vp)
    assert len(interface._FAST_FWD) == 2
    raw = torch.randn(q.numel() + 8, device="cuda", dtype=torch.float16)
    qm = raw[1:1 + q.numel()].view(q.shape)  # 2-byte offset: not 16-byte aligned
    qm.copy_(torch.randn_like(q))
    check("misaligned q", tileflash.flash_attn_func(qm, k, v, causal=causal), qm, k, v)


@pytest.mark.skipif(not (IS_SM90 and gluon_modules() is not None), reason="needs a Hopper GPU and triton's Gluon")
@pytest.mark.parametrize("causal", [False, True])
def test_fast_backward_replay_on_the_gpu(monkeypatch, causal):
    """A repeated ``flash_attn_func`` signature under autograd on the Gluon kernels: the first
    backward through the route records its launches into the signature's entry, the next ones
    replay them (``route.replay_backward`` returned gradients) with the bits of the route's
    (the default backward at this size is the split, deterministic pair), and the gradients meet
    the error rule. dO of other strides (expanded, from ``out.sum()``) declines the replay and is
    still right."""
    from tileflash import interface
    from tileflash.options import DEBUG

    for name, default in (("gluon_fused", False), ("gluon_bwd", True), ("gluon_dq", True), ("dq_delta", True)):
        monkeypatch.setattr(DEBUG, name, default)  # the default route: the split pair, whose launches are kept
    interface._FAST_FWD.clear()
    route._FWD_PLANS.clear()
    route._BWD_PLANS.clear()
    replays = count_calls(monkeypatch, route, "replay_backward")
    q, k, v = make_qkv(2, 256, 256, 4, 2, 128, torch.float16, "cuda", seed=23)
    do = torch.randn_like(q)

    def step(dout=do):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out = tileflash.flash_attn_func(qg, kg, vg, causal=causal)
        if dout is None:
            out.sum().backward()
        else:
            out.backward(dout)
        return qg.grad, kg.grad, vg.grad

    first = step()
    second = step()
    assert not replays, "the first backward of a signature runs the route"
    entry = next(iter(interface._FAST_FWD.values()))
    assert entry[2], "the route's launches are kept for the signature"
    third = step()
    assert len(replays) == 1, "a repeated signature's backward replays its kept launches"
    for a, b, c in zip(first, second, third):
        assert torch.equal(a, b) and torch.equal(b, c)

    def check(grads, dout):
        ref = ref_grads(q, k, v, dout, causal, upcast=True)
        eager = ref_grads(q, k, v, dout, causal, upcast=False)
        for name, g, r, e in zip(("dq", "dk", "dv"), grads, ref, eager):
            assert not torch.isnan(g).any(), name
            assert_error_rule(name, g, r, max_err(e, r), 2, rounding_atol(r, torch.float16))

    check(third, do)
    n = len(replays)
    ones = step(None)  # dO = ones, expanded (zero strides): other strides, so not the kept replay
    assert len(replays) == n
    check(ones, torch.ones_like(q))


@pytest.mark.skipif(not (IS_SM90 and gluon_modules() is not None), reason="needs a Hopper GPU and triton's Gluon")
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_sdpa_drop_in_replay_on_the_gpu(monkeypatch, layout):
    """``tileflash.scaled_dot_product_attention`` on its kept signature (``_FAST_SDPA``) on the
    Gluon kernels, with (batch, heads, seq, dim) views of (b, s, h, d) memory and with
    (b, h, s, d)-contiguous tensors: a repeat replays the planned forward, and under autograd the
    kept backward launches, with the first call's bits; both meet the error rule against torch's
    SDPA in fp64."""
    from tileflash import interface
    from tileflash.options import DEBUG

    for name, default in (("gluon_fused", False), ("gluon_bwd", True), ("gluon_dq", True), ("dq_delta", True)):
        monkeypatch.setattr(DEBUG, name, default)
    interface._FAST_SDPA.clear()
    route._FWD_PLANS.clear()
    route._BWD_PLANS.clear()
    fwd_replays = count_calls(monkeypatch, route, "replay_forward")
    bwd_replays = count_calls(monkeypatch, route, "replay_backward")
    f = torch.nn.functional.scaled_dot_product_attention
    q, k, v = (t.transpose(1, 2) for t in make_qkv(2, 256, 256, 4, 2, 128, torch.float16, "cuda", seed=29))
    if layout == "bhsd":
        q, k, v = (t.contiguous() for t in (q, k, v))
    do = torch.randn_like(q)
    first = tileflash.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert len(interface._FAST_SDPA) == 1 and not fwd_replays
    entry = next(iter(interface._FAST_SDPA.values()))
    # both memory orders: the route plans its Gluon forward (the output takes q's memory order,
    # Options.like_inputs, so that O shares Q's layout as the kernel needs)
    assert entry[0], "the drop-in's signature keeps a planned forward"
    assert first.stride() == q.stride(), (first.stride(), q.stride())
    again = tileflash.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert torch.equal(again, first) and again.stride() == q.stride()
    assert len(fwd_replays) == 1, "the repeat replays the planned forward"
    ref = f(*(t.cpu().double() for t in (q, k, v)), is_causal=True, enable_gqa=True)
    plain = f(q, k, v, is_causal=True, enable_gqa=True)
    assert_error_rule("out", first, ref, max_err(plain, ref), 2, rounding_atol(ref, torch.float16))
    grads = []
    for _ in range(3):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        tileflash.scaled_dot_product_attention(*leaves, is_causal=True, enable_gqa=True).backward(do)
        grads.append([t.grad for t in leaves])
    # (the signature was kept by the forward-only call: the first backward records its launches, the
    # next two replay them, where the route keeps launches for the layout)
    assert len(bwd_replays) == (2 if entry[2] else 0), "the second and third backwards replay the kept launches"
    assert entry[2], "the default backward's launches are kept (both memory orders: Options.like_inputs)"
    for a, b, c in zip(*grads):
        assert torch.equal(a, b) and torch.equal(a, c)
    leaves64 = [t.detach().cpu().double().requires_grad_() for t in (q, k, v)]
    ref_g = torch.autograd.grad(f(*leaves64, is_causal=True, enable_gqa=True), leaves64, do.cpu().double())
    leaves16 = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    plain_g = torch.autograd.grad(f(*leaves16, is_causal=True, enable_gqa=True), leaves16, do)
    for name, g, r, p in zip(("dq", "dk", "dv"), grads[2], ref_g, plain_g):
        assert_error_rule(name, g, r, max_err(p, r), 2, rounding_atol(r, torch.float16))
