"""The Hopper Gluon backward (tileflash.ops.gluon.backward) and its routing
(tileflash.ops.route.backward): routing rules on any machine, numerics and determinism on an
sm90 GPU. The numerics tests call the router (as the public functions do): the Triton launcher
(tileflash.ops.triton.backward.flash_attn_backward) runs the Triton kernels only.

As for the Gluon forward, every numerics test first asserts that the call really took the Gluon
kernel (a counting wrapper), so that a routing change cannot turn it into a test of the Triton
backward. Gradients are held to flash-attn's rule against an fp32 reference:
max |grad - ref| <= 2 x max |eager same-dtype grad - ref| + atol.
"""

import pytest
import torch
import triton

import tileflash
from tileflash.ops import launch as launch_mod
from tileflash.ops import route
from tileflash.ops.triton import backward as bwd_mod
from tileflash.ops.triton import forward as fwd_mod
from tileflash.options import DEBUG, DEFAULT, Debug, Options
from tileflash.ops.utils import LOG2E
from tileflash.reference import attention_ref

from helpers import HAS_CUDA, IS_SM90, _flags, backend_device, count_calls, gluon_modules, make_qkv, rounding_atol

_GLUON = gluon_modules()
g90, gb = _GLUON if _GLUON else (None, None)  # None: this triton has no Gluon (every test that needs it skips)
needs_gluon = pytest.mark.skipif(gb is None, reason="this triton has no Gluon")
needs_sm90 = pytest.mark.skipif(not (IS_SM90 and gb is not None), reason="needs a Hopper GPU and triton's Gluon")


@pytest.fixture
def gluon_bwd_calls(monkeypatch):
    """Counts launches of the Gluon backward (switched on even if TILEFLASH_DEBUG turned it off). The
    backward plans recorded so far are set aside: a plan an earlier test in this process recorded for
    the same layout would replay its launches without calling ``gb.backward`` (this failed on the
    H200 when pytest-xdist put two tests of one layout on one worker, 2026-12-05)."""
    monkeypatch.setattr(DEBUG, "gluon_bwd", True)
    monkeypatch.setattr(route, "_BWD_PLANS", {})
    return count_calls(monkeypatch, gb, "backward")


@needs_gluon
def test_bwd_routing_rules_on_cpu_tensors():
    q, k, v = (torch.empty(1, 256, 2, 64, dtype=torch.float16) for _ in range(3))
    lse = torch.empty(1, 2, 256)
    assert not gb.supported(q, q, k, v, q, lse, 0.125, False, 0, _flags(), False, None)


@needs_gluon
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_dq_tiles_cover_every_routed_length(d, causal):
    """Every length the dK/dV kernel takes (Sq a multiple of 128, Sk of its BLOCK_N) must also fit
    the dQ kernel's tiles, or the default route would silently fall back to the Triton dQ kernel
    there; and the dK/dV tiles must divide those lengths too."""
    dkdv, dq = gb.config_for(d, causal, 4096), gb.dq_config_for(d, causal)
    assert 128 % dkdv["BLOCK_M"] == 0
    assert 128 % dq["BLOCK_M"] == 0 and dkdv["BLOCK_N"] % dq["BLOCK_N"] == 0
    q = torch.empty(1, 384, 2, d, dtype=torch.float16)
    k = torch.empty(1, 3 * dkdv["BLOCK_N"], 2, d, dtype=torch.float16)
    assert gb.dq_supported(q, k, torch.empty_like(q), causal)


@needs_gluon
def test_bwd_head_offsets_must_fit_int32():
    """The kernel stores dK/dV at kv_head · head_stride in int32: buffers whose last head starts
    at or past 2^31 elements are not routed (meta tensors: no memory needed)."""
    small = torch.empty(1, 4096, 8, 128, device="meta")
    assert gb._head_offsets_fit(small) and gb._head_offsets_fit(None)
    head_major = torch.empty(1, 8, 2 ** 28, 128, device="meta").transpose(1, 2)  # head stride 2^35
    assert not gb._head_offsets_fit(head_major)
    edge = torch.empty(1, 2, 2 ** 24, 128, device="meta").transpose(1, 2)        # (2-1) · 2^31
    assert not gb._head_offsets_fit(edge)
    below = torch.empty(1, 2, 2 ** 24 - 1, 128, device="meta").transpose(1, 2)
    assert gb._head_offsets_fit(below)


@needs_gluon
def test_ws_fused_mode_refuses_pingpong():
    """The warp-specialized kernel's fused mode (WITH_DQ) has no PINGPONG turns: asking for both is
    an error, not a silently different schedule (raised before any launch, so CPU tensors do)."""
    q = torch.empty(1, 128, 2, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, 128)
    cfg = dict(gb.fused_config_for(64, False), PINGPONG=True)
    assert cfg["WS"] and cfg["WITH_DQ"]
    with pytest.raises(ValueError, match="without PINGPONG"):
        gb._launch(q, q, q, q, lse, lse, q, q, q, 0.125, False, cfg, True)


@needs_gluon
def test_ws_fused_mode_launches_in_either_order(monkeypatch):
    """The fused mode (WITH_DQ) launches in the config's order: the 2-D grid (heads fastest) for
    ordered sums, which fused_config_for keeps there, and with PER_HEAD (its unordered config) the
    dK/dV-only default's 1-D grid (a head's K blocks together), PER_HEAD passed to the
    kernel so that its dQ writer takes the ordered adds' turn from start_n // BLOCK_N, not from
    program_id(1), which is 0 in the 1-D grid (that the order holds on a GPU:
    test_fused_schedule_variants' "per-head" case, bit for bit). The PDL overlap is opt-in: off in
    every default config."""
    for d, causal in ((64, False), (128, True)):
        assert gb.config_for(d, causal, 4096)["PER_HEAD"] and not gb.fused_config_for(d, causal)["PER_HEAD"]
        assert gb.fused_config_for(d, causal, deterministic=False)["PER_HEAD"]  # (unordered: FA4's order)
        # the PDL overlap is opt-in (run 4 of session 18: within the spread; ordering not established)
        assert not gb.config_for(d, causal, 4096)["PDL_TRIGGER"] and not gb.dq_config_for(d, causal)["PDL"]
        assert not gb.fused_config_for(d, causal)["PDL_TRIGGER"]
    calls = []

    class Recorder:  # stands in for the kernel: kernel[grid](*args, **constexprs)
        def __getitem__(self, grid):
            return lambda *args, **kw: calls.append((grid, kw, args))

    monkeypatch.setattr(gb, "_attn_bwd_sm90_ws", Recorder())
    monkeypatch.setattr(gb, "_LAUNCHES", {})  # (launches cached here hold the recorder)
    do, q, k, v, _, lse = _cpu_bwd()                       # B 2, Sq 256, Sk 384, H 4, Hk 2, D 64
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    for det in (True, False):
        for per_head in (False, True):
            cfg = dict(gb.fused_config_for(64, False, deterministic=det), PER_HEAD=per_head)
            gb._launch(do, q, k, v, lse, lse, dq, dk, dv, 0.125, False, cfg, det)
            grid, kw, args = calls.pop()
            assert kw["PER_HEAD"] is per_head and kw["WITH_DQ"] and kw["DETERMINISTIC"] is det
            n_blocks = 384 // cfg["BLOCK_N"]
            assert grid == ((2 * 2 * n_blocks, 1, 1) if per_head else (2 * 2, n_blocks, 1))
            # the cached launch's arguments in the kernel's order: Q, K, V, dO descriptors, LSE, DELTA,
            # DK, DV, then the fp32 dQ sums' descriptor ((B·Sq, H·D) in column-half tiles), zeroed
            # int32 counters (B·H·Sq/BLOCK_M), the integers and the two scales
            assert [a.base.dtype for a in args[:4]] == [q.dtype] * 4 and args[6] is dk and args[7] is dv
            dq_desc, sem = args[8], args[9]
            assert dq_desc.base.dtype == torch.float32 and list(dq_desc.shape) == [2 * 256, 4 * 64]
            assert list(dq_desc.block_shape) == [cfg["BLOCK_M"], 32] and not dq_desc.base.any()
            assert sem.dtype == torch.int32 and sem.numel() == 2 * 4 * (256 // cfg["BLOCK_M"]) and not sem.any()
            assert [type(x) for x in args[-2:]] == [float, float] and args[-2:] == (0.125 * LOG2E, 0.125)
    assert len([key for key in gb._LAUNCHES if key[0] == "fused"]) == 4, "one cached launch per config"
    # the 8-warp kernel has the 2-D grid only and takes no PER_HEAD
    monkeypatch.setattr(gb, "_attn_bwd_sm90", Recorder())
    cfg = dict(gb.config_for(64, False, 4096), WS=False, WITH_DQ=True, PER_HEAD=True)
    gb._launch(do, q, k, v, lse, lse, dq, dk, dv, 0.125, False, cfg, True)
    grid, kw, _ = calls.pop()
    assert grid == (2 * 2, 384 // cfg["BLOCK_N"]) and "PER_HEAD" not in kw


def _route_cuda_backward(do, q, k, v, out, lse, scale, causal, options=DEFAULT):
    """``route.backward``'s CUDA branch called on CPU tensors (only routing runs: the tests replace
    every launcher it reaches by a recorder)."""
    kw = dict(window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None, cu_seqlens_q=None,
              cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None)
    return route._cuda_backward(do, q, k, v, out, lse, scale, causal, None, kw, None, None, None, None, options)


def _record_launches(monkeypatch, supported=True, dq_ok=True):
    """Replace the Gluon backward's launchers, supported() / dq_supported() (answering ``supported``
    / ``dq_ok``), the Triton launcher and the delta kernel by recorders (each Gluon launcher returns
    what a launch that ran returns). Returns (the list of launches, the list of supported() calls)."""
    launches, asked = [], []

    def fake_backward(dout, q, k, v, lse, delta, dq, dk, dv, scale, causal, cfg=None, deterministic=True, bufs=None):
        launches.append(("dkdv", cfg))
        return (dq if cfg and cfg.get("WITH_DQ") else None), dk, dv

    def fake_dq(dout, q, k, v, lse, delta, dq, scale, causal, cfg=None, out=None):
        launches.append(("dq", cfg))
        launches.append(("dq computes delta", out is not None))
        return dq

    def fake_triton(dout, q, k, v, out, lse, scale, causal, causal_shift=None, *, delta=None, run_dkdv=True,
                    run_dq=True, dq=None, dk=None, dv=None, **kw):
        launches.append(("triton", dict(delta=delta is not None, run_dkdv=run_dkdv, run_dq=run_dq)))
        return dq, dk, dv

    monkeypatch.setattr(gb, "supported", lambda *a, **kw: asked.append(1) or supported)
    monkeypatch.setattr(gb, "dq_supported", lambda *a, **kw: dq_ok)
    monkeypatch.setattr(gb, "backward", fake_backward)
    monkeypatch.setattr(gb, "backward_dq", fake_dq)
    monkeypatch.setattr(bwd_mod, "flash_attn_backward", fake_triton)
    # no kernel runs: the delta kernel is replaced too (CPU tensors cannot reach a compiled kernel)
    monkeypatch.setattr(bwd_mod, "compute_delta", lambda out, *a, zero=None: launches.append(("delta", None))
                        or torch.zeros(out.shape[0], out.shape[2], out.shape[1]))
    return launches, asked


def _debug_defaults(monkeypatch):
    for name in ("gluon_fused", "gluon_bwd", "gluon_dq", "dq_delta"):
        monkeypatch.setattr(DEBUG, name, getattr(Debug(), name))


@needs_gluon
@pytest.mark.parametrize("fused", [False, True], ids=["default", "fused"])
def test_fused_mode_is_opt_in(fused, monkeypatch):
    """The debug switch gluon_fused=1 routes the backward to one fused Gluon launch (WITH_DQ, no dQ
    kernel); by default it is off (slower than the split kernels on the H200, perf-notes §22) and
    the split route runs the dK/dV and the dQ kernel. CPU tensors, with the Gluon launchers
    replaced by recorders (supported() forced true), so that only the routing runs."""
    _debug_defaults(monkeypatch)
    assert not DEBUG.gluon_fused  # off by default
    monkeypatch.setattr(DEBUG, "gluon_fused", fused)
    launches, _ = _record_launches(monkeypatch)
    q, k, v = make_qkv(1, 128, 128, 2, 2, 64, torch.float32, "cpu", seed=1)
    do, out, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 2, 128)
    _route_cuda_backward(do, q, k, v, out, lse, 0.125, True)
    if fused:
        assert [name for name, _ in launches] == ["delta", "dkdv"]
        cfg = launches[1][1]
        assert cfg == gb.fused_config_for(64, True, deterministic=False)  # (route's default: deterministic=False)
        assert cfg["WS"] and cfg["WITH_DQ"] and not cfg["CARRY_DK"] and cfg["STAGES"] == 2
    else:
        # the dQ kernel first, computing delta from out (no delta kernel); then the dK/dV kernel
        assert launches == [("dq", None), ("dq computes delta", True), ("dkdv", None)]
        # backward() then takes config_for's split tiles
    launches.clear()
    monkeypatch.setattr(DEBUG, "dq_delta", False)
    _route_cuda_backward(do, q, k, v, out, lse, 0.125, True)
    if not fused:  # the switch: the delta kernel, the dK/dV kernel, then the dQ kernel reading delta
        assert launches == [("delta", None), ("dkdv", None), ("dq", None), ("dq computes delta", False)]


@needs_gluon
def test_route_backward_switches(monkeypatch):
    """Where the router sends a backward on a CUDA device (its CUDA branch, on CPU tensors with
    recorders): by default to both Gluon kernels (dQ first, computing delta); with the debug switch
    gluon_bwd=0 or Options(backend="triton") to the Triton kernels alone, without asking the Gluon
    backward; a call it cannot take (supported() false) to the Triton kernels, and with
    Options(backend="gluon") to a ValueError naming the scope; lengths the Gluon dQ kernel cannot
    take to the Gluon dK/dV kernel and the Triton dQ kernel (with the delta kernel's delta)."""
    _debug_defaults(monkeypatch)
    q, k, v = make_qkv(1, 128, 128, 2, 2, 64, torch.float32, "cpu", seed=1)
    do, out, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 2, 128)
    gluon = [("dq", None), ("dq computes delta", True), ("dkdv", None)]
    triton_all = [("triton", dict(delta=False, run_dkdv=True, run_dq=True))]

    def route_(options=DEFAULT, **rec):
        launches, asked = _record_launches(monkeypatch, **rec)
        _route_cuda_backward(do, q, k, v, out, lse, 0.125, False, options)
        return launches, len(asked)

    assert route_() == (gluon, 1)
    assert route_(Options(backend="gluon")) == (gluon, 1)
    assert route_(Options(backend="triton")) == (triton_all, 0)
    assert route_(supported=False) == (triton_all, 1)
    assert route_(dq_ok=False) == ([("delta", None), ("dkdv", None),
                                    ("triton", dict(delta=True, run_dkdv=False, run_dq=True))], 1)
    with pytest.raises(ValueError, match=r"backend='gluon'.*Gluon backward cannot take this call: its scope"):
        route_(Options(backend="gluon"), supported=False)
    # backend="gluon" promises both Gluon kernels: lengths the dQ kernel cannot take raise, before any launch
    with pytest.raises(ValueError, match=r"backend='gluon'.*Gluon dQ kernel cannot take this call"):
        route_(Options(backend="gluon"), dq_ok=False)
    monkeypatch.setattr(DEBUG, "gluon_bwd", False)
    assert route_() == (triton_all, 0)
    with pytest.raises(ValueError, match=r"backend='gluon'.*gluon_bwd=0"):
        route_(Options(backend="gluon"))


def test_route_backward_pad_head_dim(monkeypatch):
    """A head dim between the Gluon kernels' widths (96): by default the router runs the Gluon
    backward on copies padded to 128; Options(pad_head_dim=False) keeps it on the Triton kernels
    without asking the Gluon backward (CPU tensors, launchers and the pad copy replaced by recorders)."""
    _debug_defaults(monkeypatch)
    q, k, v = make_qkv(1, 128, 128, 2, 2, 96, torch.float32, "cpu", seed=1)
    do, out, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 2, 128)
    padded = []
    monkeypatch.setattr(route.tr_fwd, "pad_head_dim",
                        lambda t, width: padded.append(width) or torch.zeros(*t.shape[:-1], width))
    launches, asked = _record_launches(monkeypatch)
    _route_cuda_backward(do, q, k, v, out, lse, 0.125, False)
    assert padded == [128] * 4 and len(asked) == 1
    assert launches == [("dq", None), ("dq computes delta", True), ("dkdv", None)]
    launches.clear(), padded.clear(), asked.clear()
    _route_cuda_backward(do, q, k, v, out, lse, 0.125, False, Options(pad_head_dim=False))
    assert padded == [] and asked == []
    assert launches == [("triton", dict(delta=False, run_dkdv=True, run_dq=True))]


def _compile_rows(code: str) -> dict:
    """Run `code` (which compiles kernels for sm_90 through tools/compile_check.py and prints one
    JSON dict last) in a fresh interpreter without TRITON_INTERPRET, and return that dict."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}  # compile, not interpret
    env["PYTHONPATH"] = str(root)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900,
                         cwd=root)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@needs_gluon
def test_pdl_trigger_compiles_to_one_early_launch_dependents():
    """No GPU needed: PDL_TRIGGER puts exactly one griddepcontrol.launch_dependents into the dK/dV
    kernel (none without it), before any global load or async copy, so the dQ kernel launched
    with PDL can take the SMs of the dK/dV kernel's last programs; and the dQ launch carries
    triton's launch_pdl option only when asked (PDL)."""
    rows = _compile_rows("""
import json, sys
sys.path.insert(0, "tools")
from compile_check import compile_gluon_bwd
from tileflash.ops.gluon import backward as GB
rows = {}
for d, causal in ((128, False), (64, True)):
    for trig in (False, True):
        ptx = compile_gluon_bwd(d, causal, dict(GB.config_for(d, causal, 4096), PDL_TRIGGER=trig)).asm["ptx"]
        body = ptx[ptx.find(".entry"):]
        i = body.find("griddepcontrol.launch_dependents")
        before = body[:i] if i >= 0 else ""
        rows[f"{d} {int(causal)} {int(trig)}"] = [ptx.count("griddepcontrol"), before.count("ld.global"),
                                                   before.count("cp.async")]
print(json.dumps(rows))
""")
    for key, (n_gdc, loads_before, copies_before) in rows.items():
        assert n_gdc == int(key.split()[2]), key   # one trigger with PDL_TRIGGER, none without
        assert loads_before == 0 and copies_before == 0, key
    do, q, k, v, out, lse = _cpu_bwd(d=128)
    dq = torch.empty_like(q)
    for pdl in (False, True):
        launch = gb._dq_launch(do, q, k, v, lse, dq, False, dict(gb.dq_config_for(128, False), PDL=pdl))
        assert launch.constexprs.get("launch_pdl", False) is pdl
        assert "launch_pdl" not in [p.name for p in launch.kernel.params]  # an option, not in the tail


@needs_gluon
def test_fused_mode_compiles_for_sm90():
    """No GPU needed: the fused mode compiles for sm_90 with the installed triton, adds dQ with TMA
    bulk reductions issued by its writer warp (one per column half of the head; triton splits a
    128-byte-swizzled fp32 tile wider than 32 columns in two), and orders them (one acquire load
    before, one release after) only when deterministic; DQ_MODE 1/2, the timing variants, add nothing.
    Each case compiles the config route runs for it (fused_config_for(d, causal, deterministic))."""
    rows = _compile_rows("""
import json, re, sys
sys.path.insert(0, "tools")
from compile_check import compile_gluon_bwd
from tileflash.ops.gluon import backward as GB
rows = {}
for d, causal, det, mode in ((128, False, True, 0), (128, True, False, 0), (64, False, True, 0), (64, True, True, 0),
                             (64, False, False, 0), (128, False, False, 1), (128, False, False, 2)):
    ptx = compile_gluon_bwd(d, causal, dict(GB.fused_config_for(d, causal, det), DQ_MODE=mode),
                            deterministic=det).asm["ptx"]
    rows[f"{d} {int(causal)} {int(det)} {mode}"] = [ptx.count("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add"),
        len(re.findall(r"(?:atom|red)[.]global[.]gpu[.]release", ptx)), ptx.count("ld.global.gpu.acquire"),
        ptx.count("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group")]
print(json.dumps(rows))
""")
    # [reductions, releases, acquires, plain TMA stores]: D = 128 halves are 64 fp32 columns (two
    # TMA boxes of 32 each), D = 64 halves 32; the order lives in the writer warp alone
    assert rows["128 0 1 0"][:3] == [4, 1, 1] and rows["128 1 0 0"][:3] == [4, 0, 0]
    assert rows["64 0 1 0"][:3] == [2, 1, 1] and rows["64 1 1 0"][:3] == [2, 1, 1]
    assert rows["64 0 0 0"][:3] == [2, 0, 0]  # (the 64-row Q blocks deterministic=False runs at D = 64)
    assert rows["128 0 0 1"][0] == 0 and rows["128 0 0 1"][3] == 4
    assert rows["128 0 0 2"][0] == 0 and rows["128 0 0 2"][3] == 0


def _cpu_bwd(b=2, sq=256, sk=384, h=4, hk=2, d=64):
    q, do, out = (torch.empty(b, sq, h, d, dtype=torch.float16) for _ in range(3))
    k, v = (torch.empty(b, sk, hk, d, dtype=torch.float16) for _ in range(2))
    return do, q, k, v, out, torch.empty(b, h, sq)


@needs_gluon
@pytest.mark.parametrize("d,causal", [(64, False), (64, True), (128, False), (128, True), (256, False), (256, True)])
def test_bwd_launches_match_the_kernel_signatures(d, causal):
    """The backward's cached launches (host time, perf-notes §25) feed the compiled kernels'
    launchers positionally: descriptors, pointers, integers and scales must be exactly each
    kernel's runtime parameters, in order and by name (Sq != Sk and a GQA group of 2, so that a
    swap shows), and the tail its constexprs with the values of the config."""
    do, q, _, _, out, lse = _cpu_bwd(d=d)
    # K and V in (B, H, S, D) memory, Q in (B, S, H, D): the view offsets of the two differ
    k, v = (torch.empty(2, 2, 384, d, dtype=torch.float16).transpose(1, 2) for _ in range(2))
    dq = torch.empty_like(q)
    dk, dv = (torch.empty(2, 384, 2, d, dtype=torch.float16) for _ in range(2))
    cfg = gb.config_for(d, causal, q.shape[1])
    views = dict(q_rb=256, q_rh=0, q_ch=d, kv_rb=2 * 384, kv_rh=384, kv_ch=0)
    dkdv = gb._ws_launch(do, q, k, v, lse, dk, dv, causal, cfg, True)
    dqcfg = gb.dq_config_for(d, causal)
    launches = {"dkdv": (dkdv, ["LSE", "DELTA", "DK", "DV", "dq_desc", "SEM"],
                         dict(stride_dkb=dk.stride(0), stride_dkn=dk.stride(1), stride_dkh=dk.stride(2),
                              stride_dvb=dv.stride(0), stride_dvn=dv.stride(1), stride_dvh=dv.stride(2),
                              nheads_k=2, kv_group=2, seqlen_q=256, seqlen_k=384),
                         dict(BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], STAGES=cfg["STAGES"],
                              CARRY_DK=cfg["CARRY_DK"], WITH_DQ=False, DETERMINISTIC=True, CONSUMER_REGS=240,
                              PINGPONG=False, DQ_MODE=0, PER_HEAD=cfg.get("PER_HEAD", False),
                              PDL_TRIGGER=cfg.get("PDL_TRIGGER", False), SPLIT_D=d == 256))}
    assert gb.dq_supported(q, k, dq, causal)
    # the default route's dQ launch reads O for delta: O in (B, H, S, D) memory, so its strides differ from dq's
    o_t = torch.empty(q.shape[0], q.shape[2], q.shape[1], d, dtype=q.dtype).transpose(1, 2)
    fuse = gb.dq_computes_delta(d, causal)
    dq_launch = gb._dq_launch(do, q, k, v, lse, dq, causal, dqcfg, o_t if fuse else None)
    o_strides = o_t.stride() if fuse else dq.stride()
    launches["dq"] = (dq_launch, ["LSE", "DELTA", "DQ", "O"],
                      dict(stride_dqb=dq.stride(0), stride_dqm=dq.stride(1), stride_dqh=dq.stride(2),
                           stride_ob=o_strides[0], stride_om=o_strides[1], stride_oh=o_strides[2], nheads=4,
                           kv_group=2, seqlen_q=256, seqlen_k=384),
                      dict(BLOCK_M=dqcfg["BLOCK_M"], BLOCK_N=dqcfg["BLOCK_N"], STAGES=dqcfg["STAGES"],
                           CONSUMER_REGS=240, SPLIT_D=d == 256, FUSE_DELTA=fuse))
    assert fuse == (d != 256)  # SPLIT_D keeps the delta kernel
    fused = None
    if d != 256:  # the fused kernel (deterministic=False's route from 2k): dq_desc is its ninth parameter
        fcfg = gb.fused_config_for(d, causal, deterministic=False)
        fused = gb._ws_launch(do, q, k, v, lse, dk, dv, causal, fcfg, False,
                              dq_acc=torch.empty(q.shape, dtype=torch.float32))
        launches["fused"] = (fused, ["LSE", "DELTA", "DK", "DV", "dq_desc", "SEM"], launches["dkdv"][2],
                             dict(BLOCK_M=fcfg["BLOCK_M"], BLOCK_N=fcfg["BLOCK_N"], STAGES=fcfg["STAGES"],
                                  CARRY_DK=False, WITH_DQ=True, DETERMINISTIC=False, PER_HEAD=True, LSE_EARLY=3,
                                  DQ_BUFS=fcfg["DQ_BUFS"], DQ_FIRST=d > 64, DQ_ALT=False, DQ_LATE=False,
                                  DQ_MSPLIT=False, SPLIT_D=False, PINGPONG=False, D_OUT=0))
    for name, (launch, ptrs, ints_want, tail_want) in launches.items():
        params = launch.kernel.params
        names = [p.name for p in params]
        n_runtime = 4 + len(ptrs) + len(launch.ints) + 2
        assert names[:4] == ["q_desc", "k_desc", "v_desc", "do_desc"], name
        assert names[4:4 + len(ptrs)] == ptrs, name
        # the descriptors' slots: the first four (the fused launch: and dq_desc's; the dK/dV kernel's is a None)
        want = ["q_desc", "k_desc", "v_desc", "do_desc"] + (["dq_desc"] if name == "fused" else [])
        assert [names[i] for i in (launch.slots or range(len(launch.templates)))] == want, name
        assert [p.is_constexpr for p in params] == [False] * n_runtime + [True] * len(launch.tail), name
        assert names[n_runtime - 2:n_runtime] == ["qk_scale", "sm_scale"], name
        ints = dict(zip(names[4 + len(ptrs):n_runtime - 2], launch.ints))
        assert {n: ints[n] for n in ints_want} == ints_want, name
        assert {n: ints[n] for n in views} == views, name
        assert ints["stride_lb"] == lse.stride(0) and ints["stride_lh"] == lse.stride(1), name
        tail = dict(zip(names[n_runtime:], launch.tail))
        assert {n: tail[n] for n in tail_want} == tail_want and tail["HEAD_DIM"] == d and tail["CAUSAL"] == causal
        assert all(t.base is None for t in launch.templates), name  # a cached launch holds no tensor
        assert len(launch.grid) == 3, name
    if fused is not None:  # dQ's fp32 sums, (B·Sq, H·D), in column halves of the Q block
        dq_t = fused.templates[4]
        assert list(dq_t.shape) == [2 * 256, 4 * d] and list(dq_t.strides) == [4 * d, 1]
        assert list(dq_t.block_shape) == [fcfg["BLOCK_M"], d // 2] and len(fused.templates) == 5
        assert fused.grid == (2 * 2 * (384 // fcfg["BLOCK_N"]), 1, 1)
    if cfg.get("PER_HEAD", False):  # 1-D: batch·kv heads · K/V blocks
        assert dkdv.grid == (2 * 2 * (384 // cfg["BLOCK_N"]), 1, 1)
    else:
        assert dkdv.grid == (2 * 2, 384 // cfg["BLOCK_N"], 1)
    assert launches["dq"][0].grid == (256 // dqcfg["BLOCK_M"], 2 * 4, 1)  # 64-row Q blocks at D = 256
    # the other launch order: the same arguments, a 1-D grid (or the 2-D one), PER_HEAD in the tail
    other = dict(cfg, PER_HEAD=not cfg.get("PER_HEAD", False))
    flip = gb._ws_launch(do, q, k, v, lse, dk, dv, causal, other, True)
    assert flip.ints == dkdv.ints
    dkdv_consts = [p.name for p in dkdv.kernel.params if p.is_constexpr]
    assert dict(zip(dkdv_consts, flip.tail))["PER_HEAD"] == other["PER_HEAD"]
    want_grid = (2 * 2 * (384 // cfg["BLOCK_N"]), 1, 1) if other["PER_HEAD"] else (2 * 2, 384 // cfg["BLOCK_N"], 1)
    assert flip.grid == want_grid
    # rebased descriptors equal freshly validated ones (K/V in the WS kernel's 64-key halves, or with
    # SPLIT_D in whole blocks)
    kv_rows = cfg["BLOCK_N"] if cfg.get("SPLIT_D", False) else cfg["BLOCK_N"] // 2
    fresh = [gb._f90._desc(t, t.shape[1], t.shape[2], r)[0]
             for t, r in ((q, cfg["BLOCK_M"]), (k, kv_rows), (v, kv_rows), (do, cfg["BLOCK_M"]))]
    for got, want, t in zip(dkdv.descriptors(q, k, v, do), fresh, (q, k, v, do)):
        assert got.base is t and {n: x for n, x in vars(got).items() if n != "base"} == \
            {n: x for n, x in vars(want).items() if n != "base"}


def test_delta_launch_matches_the_kernel_signature(monkeypatch):
    """The delta kernel's cached launch (``triton.backward.compute_delta``): its pointers and integers are the
    kernel's runtime parameters in order and by name, its tail the constexprs; one launch per
    layout, and it computes rowsum(dO * O) on the CPU interpreter's or the compiled kernel's path
    alike (here: whichever this machine runs, on its device)."""
    monkeypatch.setattr(bwd_mod, "_PRE_LAUNCHES", {})
    device = "cuda" if HAS_CUDA else "cpu"
    if device == "cpu" and not bwd_mod.interpreting():
        pytest.skip("CPU tensors need the interpreter's kernels")
    out = torch.randn(2, 96, 3, 40, device=device)
    dout = torch.randn(2, 3, 96, 40, device=device).transpose(1, 2)  # strides unlike out's
    lse = torch.empty(2, 3, 96, device=device)
    delta = bwd_mod.compute_delta(out, dout, lse, False, 3, 40)
    torch.testing.assert_close(delta, (out * dout).sum(-1).transpose(1, 2), rtol=1e-5, atol=1e-5)
    (launch,) = bwd_mod._PRE_LAUNCHES.values()
    assert bwd_mod.compute_delta(out, dout, lse, False, 3, 40) is not delta and len(bwd_mod._PRE_LAUNCHES) == 1
    params = getattr(bwd_mod._bwd_preprocess, "params", None)
    if params is None:  # the interpreter's kernel object has no parameter list
        params = triton.JITFunction(bwd_mod._bwd_preprocess.fn).params
    names = [p.name for p in params]
    assert names[:4] == ["O", "DO", "DELTA", "ZERO"] and [p.is_constexpr for p in params] == [False] * 14 + [True] * 5
    assert names[14:] == ["HEAD_DIM", "BLOCK_D", "BLOCK_M", "FLAT_GRID", "ZERO_CHUNK"]
    assert dict(zip(names[4:14], launch.ints)) == dict(
        stride_ob=out.stride(0), stride_om=out.stride(1), stride_oh=out.stride(2), stride_dob=dout.stride(0),
        stride_dom=dout.stride(1), stride_doh=dout.stride(2), nheads=3, seqlen_q=96, n_zero=0, zero_per=0)
    assert launch.constexprs["HEAD_DIM"] == 40 and launch.constexprs["BLOCK_D"] == 64
    assert launch.constexprs["ZERO_CHUNK"] == 0  # without a buffer to zero: no stores beyond delta
    assert launch.grid == (-(-96 // launch.constexprs["BLOCK_M"]), 2 * 3, 1) and launch.constexprs["FLAT_GRID"] is False


@pytest.mark.parametrize("flat", [False, True], ids=["2d-grid", "flat-grid"])
@pytest.mark.parametrize("n_zero", [1, 63, 1000, 6 * 96 * 40 + 77, 3 * 6 * 96 * 40 + 5])
def test_delta_kernel_zeroes_the_buffer_it_is_given(monkeypatch, n_zero, flat):
    """``compute_delta(..., zero=words)`` (the fused backward's dQ sums and counters, zeroed in the
    delta kernel rather than by a memset): every word of a poisoned int32 buffer becomes 0, at sizes
    below, near and above what the programs' equal shares cover, while delta stays rowsum(dO * O);
    words past the buffer are not touched (a guard word after a view of a longer buffer); one launch
    per (layout, size); a buffer that is not contiguous int32 is refused with what to pass. Also in
    the flat grid of calls with more batch·heads than a grid's y axis takes (``utils.block_grid``,
    its limit lowered here), where the programs' linear ids come from one axis."""
    monkeypatch.setattr(bwd_mod, "_PRE_LAUNCHES", {})
    device = "cuda" if HAS_CUDA else "cpu"
    if device == "cpu" and not bwd_mod.interpreting():
        pytest.skip("CPU tensors need the interpreter's kernels")
    if flat:
        from tileflash.ops import utils as ops_utils
        monkeypatch.setattr(ops_utils, "GRID_YZ_MAX", 4)  # 2 * 3 batch·heads: over it
    out = torch.randn(2, 96, 3, 40, device=device)
    dout = torch.randn(2, 96, 3, 40, device=device)
    lse = torch.empty(2, 3, 96, device=device)
    for _ in range(2):
        backing = torch.full((n_zero + 4,), -12345, dtype=torch.int32, device=device)
        words = backing[:n_zero]
        delta = bwd_mod.compute_delta(out, dout, lse, False, 3, 40, zero=words)
        assert int(words.count_nonzero()) == 0, "every word zeroed"
        assert backing[n_zero:].tolist() == [-12345] * 4, "nothing past the buffer written"
        torch.testing.assert_close(delta, (out * dout).sum(-1).transpose(1, 2), rtol=1e-5, atol=1e-5)
    assert len(bwd_mod._PRE_LAUNCHES) == 1
    (launch,) = bwd_mod._PRE_LAUNCHES.values()
    assert launch.constexprs["FLAT_GRID"] is flat and (launch.grid[1] == 1) is flat
    chunk, per = launch.constexprs["ZERO_CHUNK"], launch.ints[-1]
    n_prog = launch.grid[0] * launch.grid[1]
    assert chunk > 0 and per % chunk == 0 and (per - chunk) * n_prog < n_zero <= per * n_prog
    with pytest.raises(ValueError, match="contiguous int32"):
        bwd_mod.compute_delta(out, dout, lse, False, 3, 40, zero=torch.zeros(8, device=device))
    with pytest.raises(ValueError, match="contiguous int32"):
        bwd_mod.compute_delta(out, dout, lse, False, 3, 40, zero=backing[::2])


@pytest.mark.parametrize("n", [1, 17, 255, 256, 4097, 2 * 2048 * 4 * 64 + 3])
def test_scale_cast_kernel_equals_torch_mul(monkeypatch, n):
    """``triton.backward.scale_cast`` (the fused backward's dQ postprocess: fp32 sums times the scale,
    cast to dq's dtype) gives the bits of ``torch.mul(src, scale, out=dst)``, writes every element of a
    NaN-poisoned output at odd sizes (the last block's mask), keeps one launch per size, and leaves
    layouts it does not take (a non-contiguous source) to ``torch.mul``. On the CPU interpreter fp16
    (its bf16 stores are wrong, GPU.md) or on the GPU fp16 and bf16, whichever this machine runs."""
    monkeypatch.setattr(bwd_mod, "_CAST_LAUNCHES", {})
    device = "cuda" if HAS_CUDA else "cpu"
    if device == "cpu" and not bwd_mod.interpreting():
        pytest.skip("CPU tensors need the interpreter's kernels")
    dtypes = [torch.float16, torch.bfloat16] if device == "cuda" else [torch.float16]
    g = torch.Generator(device=device).manual_seed(n)
    src = torch.randn(n, device=device, generator=g) * 300  # (fp16's range: some products round at its top)
    for dt in dtypes:
        dst = torch.full((n,), float("nan"), dtype=dt, device=device)
        assert bwd_mod.scale_cast(src, dst, 0.0883883) is dst
        assert torch.equal(dst, torch.mul(src, 0.0883883, out=torch.empty_like(dst)))
    assert len(bwd_mod._CAST_LAUNCHES) == len(dtypes)
    (launch, *_) = bwd_mod._CAST_LAUNCHES.values()
    assert launch.ints == (n,) and launch.grid == (-(-n // launch.constexprs["BLOCK"]), 1, 1)
    if n > 2:  # a strided source: torch.mul, no launch
        dst = torch.full((n // 2,), float("nan"), dtype=torch.float16, device=device)
        bwd_mod.scale_cast(src[: 2 * (n // 2)].view(-1, 2)[:, 0], dst, 2.0)
        assert torch.equal(dst, (src[: 2 * (n // 2): 2] * 2.0).half()) and len(bwd_mod._CAST_LAUNCHES) == len(dtypes)


@needs_gluon
def test_bwd_routing_cache_and_per_call_checks(monkeypatch):
    """supported() decides the layout once per (shapes, strides, dtypes, device, causal) of every
    tensor it looks at, and checks the scale, flags, causal alignment, pointer alignment and
    compile failures on every call. (The switches are the router's: test_route_backward_switches.)"""
    monkeypatch.setattr(gb, "_LAYOUTS", {})
    monkeypatch.setattr(gb, "_BROKEN", set())
    layouts = []
    real = gb._layout_cfg_key
    assert real(*_cpu_bwd(), False, None, None) is None  # CPU tensors never take the Gluon kernel
    monkeypatch.setattr(gb, "_layout_cfg_key", lambda *a: layouts.append(1) or ("cfg",))
    do, q, k, v, out, lse = _cpu_bwd()
    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def ok(do=do, q=q, k=k, v=v, out=out, lse=lse, dk=dk, dv=dv, scale=0.125, causal=False, shift=128, flags=None,
           varlen=False, config=None):
        return gb.supported(do, q, k, v, out, lse, scale, causal, shift, flags or _flags(HAS_RIGHT=causal),
                            varlen, config, dk=dk, dv=dv)

    assert ok() and ok() and ok(q=torch.empty_like(q)) and len(layouts) == 1   # one decision per layout
    assert ok(causal=True) and len(layouts) == 2                               # causal is in the key
    # each tensor's layout is in the key: another strides (or dtype) of any one is a new decision
    for name, t in dict(do=do, q=q, k=k, v=v, out=out, dk=dk, dv=dv).items():
        other = t.transpose(1, 2).contiguous().transpose(1, 2)                 # same shape, other strides
        n = len(layouts)
        assert ok(**{name: other}) and len(layouts) == n + 1, name
    n = len(layouts)
    assert ok(lse=torch.empty(2, 4, 256, dtype=torch.float64)) and ok(dk=None) and len(layouts) == n + 2
    n = len(layouts)
    assert not ok(causal=True, shift=0)                                        # top-left alignment, Sq != Sk
    assert not ok(scale=0.0) and not ok(scale=float("nan"))
    assert not ok(flags=_flags(HAS_SOFTCAP=True)) and not ok(flags=_flags(HAS_RIGHT=True))
    assert not ok(varlen=True) and not ok(config={"dkdv": {}})
    for name, t in dict(q=q, k=k, v=v, do=do).items():                         # TMA bases: 16-byte aligned
        buf = torch.empty(t.numel() + 8, dtype=torch.float16)
        assert not ok(**{name: buf[1:t.numel() + 1].view(t.shape)}) and ok(**{name: buf[8:].view(t.shape)}), name
    assert ok() and len(layouts) == n
    gb._BROKEN.add(("cfg",))                                                   # a compile failure since
    assert not ok()
    monkeypatch.setattr(gb, "_BROKEN", set())
    gb._LAYOUTS.update({i: None for i in range(gb._CACHE_MAX)})
    assert ok() and len(layouts) == n                                          # a hit changes nothing
    assert ok(k=torch.empty(2, 512, 2, 64, dtype=torch.float16)) and len(gb._LAYOUTS) == 1  # a miss, full


@needs_sm90
def test_bwd_routing_rules_on_gpu(monkeypatch):
    monkeypatch.setattr(DEBUG, "gluon_bwd", True)

    def ok(sq=256, sk=256, d=128, dtype=torch.float16, causal=False, scale=0.1, flags=None, config=None, shift=None,
           h=2, hk=2):
        q, k, v = (t.to(dtype) for t in make_qkv(1, sq, sk, h, hk, d, torch.float16, "cuda"))
        lse = torch.empty(1, h, sq, device="cuda")
        flags = flags or _flags(HAS_RIGHT=causal)
        shift = sk - sq if shift is None else shift
        return gb.supported(torch.empty_like(q), q, k, v, torch.empty_like(q), lse, scale, causal, shift, flags,
                            False, config)

    assert ok() and ok(d=64) and ok(d=64, causal=True) and ok(causal=True, sk=384) and ok(dtype=torch.bfloat16)
    assert ok(h=6, hk=2)
    assert not ok(sq=192) and not ok(sk=192)     # lengths must be multiples of 128
    assert ok(d=96) and ok(d=72, causal=True) and ok(d=120, h=6, hk=2)  # padded to 128 (padded_head_dim)
    assert not ok(d=96, sq=192) and not ok(d=96, flags=_flags(HAS_SOFTCAP=True))  # ...under the same rules
    assert ok(d=256) and ok(d=256, causal=True, sk=384) and ok(d=256, h=6, hk=2)  # the split-column kernel
    assert not ok(d=256, sk=288)  # D = 256 takes 64-key blocks, so Sk must be a multiple of 64 (and Sq of 128)
    assert ok(d=256, sk=320) and not ok(d=256, sq=192)
    assert ok(d=192) and ok(d=160, causal=True, sk=320)  # padded to 256 (padded_head_dim)
    assert not ok(d=192, sk=288) and not ok(d=48) and not ok(dtype=torch.float32)
    assert not ok(causal=True, sq=384, sk=256)   # rows that see no key
    assert not ok(causal=True, shift=0, sk=384)  # top-left causal alignment
    assert not ok(scale=-0.1) and not ok(scale=float("nan"))
    assert not ok(flags=_flags(HAS_SOFTCAP=True)) and not ok(flags=_flags(HAS_LEFT=True))
    assert not ok(flags=_flags(HAS_ALIBI=True)) and not ok(flags=_flags(HAS_DROPOUT=True))
    assert not ok(flags=_flags(HAS_RIGHT=True))  # a right window that is not causal
    assert not ok(config={"dkdv": {}, "dq": {}})  # pinned Triton tiles
    # the switches (the router's): the debug switch gluon_bwd=0 and Options(backend="triton") keep
    # a call the Gluon backward takes on the Triton kernels; by default it takes the Gluon kernel
    q, k, v = make_qkv(1, 256, 256, 2, 2, 128, torch.float16, "cuda", seed=2)
    out, lse = route.forward(q, k, v, 0.1, False)
    do = torch.randn_like(q)
    calls = count_calls(monkeypatch, gb, "backward")
    monkeypatch.setattr(DEBUG, "gluon_bwd", False)
    route.backward(do, q, k, v, out, lse, 0.1, False)
    assert not calls
    monkeypatch.setattr(DEBUG, "gluon_bwd", True)
    route.backward(do, q, k, v, out, lse, 0.1, False, options=Options(backend="triton"))
    assert not calls
    route.backward(do, q, k, v, out, lse, 0.1, False)
    assert len(calls) == 1  # on by default


def _grads(q, k, v, do, causal, deterministic=False):
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = tileflash.flash_attn_func(qg, kg, vg, causal=causal, deterministic=deterministic)
    return torch.autograd.grad(out, (qg, kg, vg), do)


def _ref_grads(q, k, v, do, causal, upcast):
    qs, ks, vs = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out, _ = attention_ref(qs, ks, vs, causal=causal, upcast=upcast)
    return torch.autograd.grad(out.to(do.dtype) if not upcast else out, (qs, ks, vs),
                               do if not upcast else do.float())


def check_cuda_grads(grads, q, k, v, do, causal):
    ref = _ref_grads(q, k, v, do, causal, upcast=True)
    eager = _ref_grads(q, k, v, do, causal, upcast=False)
    for name, g, r, e in zip("qkv", grads, ref, eager):
        assert g.shape == r.shape and g.dtype == q.dtype
        assert not torch.isnan(g).any(), f"NaN in d{name}"
        err = (g.float() - r).abs().max().item()
        eager_err = (e.float() - r).abs().max().item()
        atol = rounding_atol(r, q.dtype)
        assert err <= 2 * eager_err + atol, f"d{name}: err {err:.3g} > 2 * eager {eager_err:.3g} + {atol:.3g}"


CASES = [  # (batch, seqlen_q, seqlen_k, nheads, nheads_k)
    (2, 256, 384, 4, 2),     # GQA, Sq < Sk
    (1, 1024, 1024, 4, 4),
    (2, 128, 512, 3, 1),     # MQA, one Q block
    (1, 384, 128, 2, 2),     # Sq > Sk (non-causal only: causal rows would see no key)
]


@needs_sm90
def test_repeated_backward_calls_take_the_cached_launchers(monkeypatch, gluon_bwd_calls):
    """The second backward call of a layout launches its two kernels (dQ, which computes delta,
    then dK/dV; no delta kernel runs) through the cached compiled launchers; its gradients are
    bitwise those of the first call (JIT path) and right against the reference, on fresh NaN-poisoned buffers. Every call gets its own copies
    of the inputs, and the earlier calls' tensors stay alive, so a launcher that kept an earlier
    call's addresses would read or write the wrong memory. A dq buffer whose pointer is not
    16-byte aligned (the JIT specializes on it) sends the dQ kernel through the JIT again. Both
    kept launchers are ``DescRunner`` s (descriptors encoded once per address), not triton's runner."""
    monkeypatch.setattr(DEBUG, "gluon_dq", True)
    monkeypatch.setattr(DEBUG, "gluon_fused", False)
    monkeypatch.setattr(DEBUG, "dq_delta", True)
    delta_calls = count_calls(monkeypatch, bwd_mod, "compute_delta")
    for d, causal, (b, sq, sk, h, hk) in ((64, True, (2, 256, 384, 4, 2)), (128, False, (1, 1024, 1024, 4, 4)),
                                          (64, False, (2, 512, 512, 4, 1))):
        q0, k0, v0 = make_qkv(b, sq, sk, h, hk, d, torch.bfloat16, "cuda", seed=sq + d)
        do0 = torch.randn_like(q0)
        scale = d ** -0.5
        out0, lse0 = route.forward(q0, k0, v0, scale, causal)
        results, runs, keep = [], [], []
        for offset in (0, 0, 1):
            q, k, v, do, out, lse = (t.clone() for t in (q0, k0, v0, do0, out0, lse0))
            buf = torch.full((q.numel() + offset,), float("nan"), dtype=q.dtype, device="cuda")
            dq = buf[offset:].view(q.shape)
            dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
            if len(results) == 1:  # wrap the launchers once, after the first (JIT) call
                launches = [x for key, x in gb._LAUNCHES.items()
                            if key[1][:2] == ((do.shape, do.stride(), do.dtype), (q.shape, q.stride(), q.dtype))
                            and key[2][0] == causal]
                assert len(launches) == 2, launches
                for x in launches:
                    assert x.runner is not None, "the first launch should have kept the compiled launcher"
                    device, real = x.runner
                    # (triton's own runner re-encodes the four TMA descriptors at every launch)
                    assert isinstance(real, launch_mod.DescRunner), (x.kernel.fn.__name__, type(real))
                    x.runner = (device, lambda *a, real=real, name=x.kernel.fn.__name__:
                                (runs.append((offset, name)), real(*a)))
            grads = route.backward(do, q, k, v, out, lse, scale, causal, dq=dq, dk=dk, dv=dv)
            assert grads[0] is dq
            check_cuda_grads(grads, q0, k0, v0, do0, causal)
            results.append([g.clone() for g in grads])
            keep.append((q, k, v, do, out, lse, buf, dk, dv))
        names = sorted(n for _, n in runs)
        assert [o for o, _ in runs].count(0) == 2 and [o for o, _ in runs].count(1) == 1, runs
        assert names.count("_attn_bwd_dq_sm90_ws") == 1, runs  # the misaligned dq took the JIT
        for grads in results[1:]:
            assert all(torch.equal(g, g0) for g, g0 in zip(grads, results[0]))
    assert len(gluon_bwd_calls) == 9 and not delta_calls


@needs_sm90
@pytest.mark.parametrize("d,causal,deterministic", [(64, True, False), (128, False, False), (128, True, True)])
def test_repeated_fused_backward_replays_its_cached_launch(monkeypatch, d, causal, deterministic):
    """From 2k tokens ``deterministic=False`` runs the fused kernel (``deterministic=True`` with the
    debug switch ``gluon_fused=1``: its ordered sums, which read the zeroed counters), whose launch is
    cached per layout (``ops.launch.Launch`` with the dQ descriptor at its own slot) and recorded in
    ``route._BWD_PLANS``: the second and third calls replay it through triton's C launcher (no JIT,
    no builder) on fresh copies of the inputs while the earlier copies, and a block the size of the
    dQ sums and counters, stay alive, so the replays get new addresses (encoded anew: two more maps
    in the dQ slot) and a launch that kept an earlier call's addresses would read or write the wrong
    memory. Every call meets the reference rule (GQA, NaN-free); ordered sums give the same bits."""
    monkeypatch.setattr(DEBUG, "gluon_bwd", True)
    monkeypatch.setattr(DEBUG, "gluon_fused", deterministic)
    monkeypatch.setattr(route, "FUSED_MIN_FLOPS", 0)  # (this small shape is under the work floor)
    monkeypatch.setattr(route, "_BWD_PLANS", {})
    monkeypatch.setattr(gb, "_LAUNCHES", {})  # (not a launch an earlier test cached for this layout)
    builds = count_calls(monkeypatch, gb, "_ws_launch")
    q0, k0, v0 = make_qkv(1, 2048, 2048, 4, 2, d, torch.float16, "cuda", seed=77 + d)
    do0 = torch.randn_like(q0)
    scale = d ** -0.5
    out0, lse0 = route.forward(q0, k0, v0, scale, causal)
    launched, keep, results, runner = [], [], [], None
    for i in range(3):
        q, k, v, do, out, lse = (t.clone() for t in (q0, k0, v0, do0, out0, lse0))
        if i == 1:  # count the C launcher's launches from here on
            ((_, launches),) = route._BWD_PLANS.values()
            assert launches[0] == "fused", launches
            runner = launches[1].runner[1]
            assert isinstance(runner, launch_mod.DescRunner), type(runner)
            raw = runner.raw
            runner.raw = lambda *a: (launched.append(i), raw(*a))
        grads = route.backward(do, q, k, v, out, lse, scale, causal, deterministic=deterministic)
        check_cuda_grads(grads, q0, k0, v0, do0, causal)
        results.append(grads)
        # the freed block of the dQ sums and counters is taken by one of the same size, so the next
        # call's get another address
        bm = gb.fused_config_for(d, causal, deterministic)["BLOCK_M"]
        keep.append((q, k, v, do, out, lse, gb.fused_buffers(q, bm)))
    assert len(launched) == 2 and len(builds) == 1, (launched, builds)
    assert len(runner.maps[4]) == 2, "each replay's dQ sums at a new address, encoded for it"
    if deterministic:
        for grads in results[1:]:
            assert all(torch.equal(g, g0) for g, g0 in zip(grads, results[0]))


@needs_sm90
@pytest.mark.parametrize("deterministic", [False, True], ids=["unordered", "ordered"])
def test_fused_backward_zeroes_its_sums_in_the_delta_kernel(monkeypatch, deterministic):
    """The fused backward's fp32 dQ sums and counters come from ``torch.empty`` and are zeroed by the
    delta kernel (no memset): with every such buffer poisoned (NaN words, and counters at -1, which
    would also break the ordered sums' turns) before the delta kernel runs, a routed call and two
    replays of its kept launches still give grads that meet the reference rule, and no buffer is
    made by a memset (``zeroed=True``) on those paths."""
    monkeypatch.setattr(DEBUG, "gluon_bwd", True)
    monkeypatch.setattr(DEBUG, "gluon_fused", True)
    monkeypatch.setattr(route, "_BWD_PLANS", {})
    made = []
    real = gb.fused_buffers

    def poisoned(q, bm, zeroed=True):
        bufs = real(q, bm, zeroed)
        made.append(zeroed)
        if not zeroed:
            bufs[0].fill_(float("nan"))
            bufs[1].fill_(-1)
        return bufs

    monkeypatch.setattr(gb, "fused_buffers", poisoned)
    real_delta = bwd_mod.compute_delta
    zeroed = []

    def checked_delta(*a, zero=None):
        # (checked before the fused kernel runs: ordered sums on counters left at -1 would wait forever)
        delta = real_delta(*a, zero=zero)
        zeroed.append(zero is not None and int(zero.count_nonzero()) == 0)
        return delta

    monkeypatch.setattr(bwd_mod, "compute_delta", checked_delta)
    monkeypatch.setattr(gb, "_compute_delta", checked_delta)
    replays = count_calls(monkeypatch, gb, "replay_default")
    q, k, v = make_qkv(2, 2048, 2048, 4, 2, 128, torch.float16, "cuda", seed=11)
    do = torch.randn_like(q)
    out, lse = route.forward(q, k, v, 128 ** -0.5, False)
    for _ in range(3):
        grads = route.backward(do, q, k, v, out, lse, 128 ** -0.5, False, deterministic=deterministic)
        check_cuda_grads(grads, q, k, v, do, False)
    assert made == [False] * 3 and zeroed == [True] * 3 and len(route._BWD_PLANS) == 1
    assert len(replays) == 2, "the second and third calls replay the kept launches"


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fused_backward_scale_cast_switch_gives_the_same_bits(monkeypatch, dtype):
    """The debug switch ``scale_cast=1`` (the fused backward's dQ postprocess by our own kernel rather
    than ``torch.mul``) changes no bit of dq, dk or dv, on a routed call (no kept launches) and on a
    replay of the kept ones; with the switch on the kernel runs and ``torch.mul`` does not, with it
    off the reverse. dq meets the reference rule (ordered sums, so every run has the same fp32 sums
    to cast)."""
    monkeypatch.setattr(DEBUG, "gluon_bwd", True)
    monkeypatch.setattr(DEBUG, "gluon_fused", True)  # ordered sums: the same fp32 dQ sums every run
    monkeypatch.setattr(bwd_mod, "_CAST_LAUNCHES", {})
    casts = count_calls(monkeypatch, gb, "_scale_cast")
    muls = []
    real_mul = torch.mul
    # (torch.mul is patched for the whole test; only calls with out= count: the postprocess's form)
    monkeypatch.setattr(gb.torch, "mul", lambda *a, **kw: ("out" in kw and muls.append(1)) or real_mul(*a, **kw))
    q, k, v = make_qkv(2, 2048, 2048, 4, 2, 128, dtype, "cuda", seed=5)
    do = torch.randn_like(q)
    out, lse = route.forward(q, k, v, 128 ** -0.5, True)
    got = {}
    for switch, routed in ((True, True), (True, False), (False, True), (False, False)):
        monkeypatch.setattr(DEBUG, "scale_cast", switch)
        if routed:  # no kept launches: the route's own call of the fused kernel
            monkeypatch.setattr(route, "_BWD_PLANS", {})
        n_casts, n_muls = len(casts), len(muls)
        grads = route.backward(do, q, k, v, out, lse, 128 ** -0.5, True, deterministic=True)
        assert (len(casts) - n_casts, len(muls) - n_muls) == ((1, 0) if switch else (0, 1))
        assert len(route._BWD_PLANS) == 1  # (the routed call kept its launches: the next one replays)
        assert all(not g.isnan().any() for g in grads)
        if switch in got:
            assert all(torch.equal(g, h) for g, h in zip(grads, got[switch]))
        got[switch] = grads
    assert bwd_mod._CAST_LAUNCHES, "the kernel's launch was made"
    assert all(torch.equal(g, h) for g, h in zip(got[False], got[True]))
    check_cuda_grads(got[True], q, k, v, do, True)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_gluon_backward_matches_reference(case, d, causal, dtype, gluon_bwd_calls):
    b, sq, sk, h, hk = case
    if causal and sq > sk:
        pytest.skip("causal with Sq > Sk runs the Triton backward (rows without keys)")
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, "cuda", seed=sq + sk + d)
    do = torch.randn_like(q)
    grads = _grads(q, k, v, do, causal)
    assert gluon_bwd_calls, "the call did not take the Gluon backward"
    check_cuda_grads(grads, q, k, v, do, causal)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_backward_sdpa_layout(causal, gluon_bwd_calls):
    """(B, H, S, D) memory (tileflash.scaled_dot_product_attention) takes the kernel without a copy."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2)
               for t in make_qkv(2, 512, 512, 4, 4, 128, torch.float16, "cuda", seed=11))
    assert q.stride(2) == 512 * 128  # heads are whole blocks of rows
    do = torch.randn_like(q)
    grads = _grads(q, k, v, do, causal)
    assert gluon_bwd_calls
    check_cuda_grads(grads, q, k, v, do, causal)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [128, 256])
def test_gluon_backward_writes_every_gradient(d, causal, gluon_bwd_calls):
    """NaN-poisoned gradient buffers: every element is written (at D = 256 each consumer stores its
    own column half of dK and dV)."""
    q, k, v = make_qkv(1, 640, 768, 4, 2, d, torch.bfloat16, "cuda", seed=5)
    do = torch.randn_like(q)
    out, lse = route.forward(q, k, v, 0.125, causal)
    bufs = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    dq, dk, dv = route.backward(do, q, k, v, out, lse, 0.125, causal, dq=bufs[0], dk=bufs[1], dv=bufs[2])
    assert gluon_bwd_calls
    for g in (dq, dk, dv):
        assert not torch.isnan(g).any()
    ref = bwd_mod.flash_attn_backward(do, q, k, v, out, lse, 0.125, causal,
                                      config=bwd_mod.default_bwd_config(d, causal))
    for g, r in zip((dq, dk, dv), ref):  # the Triton backward, pinned: same math, other summation order
        assert (g.float() - r.float()).abs().max().item() <= 0.05 * r.float().abs().max().item()


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_backward_d256_is_deterministic(causal, monkeypatch, gluon_bwd_calls):
    """D = 256 (the split-column dK/dV and dQ kernels, whose consumers trade P and dS through
    shared memory every block): two calls give the same bits, and the call took those kernels."""
    monkeypatch.setattr(DEBUG, "gluon_dq", True)
    dq_calls = count_calls(monkeypatch, gb, "backward_dq")
    q, k, v = make_qkv(2, 512, 640, 4, 2, 256, torch.float16, "cuda", seed=7)
    do = torch.randn_like(q)
    first, second = _grads(q, k, v, do, causal), _grads(q, k, v, do, causal)
    assert len(gluon_bwd_calls) == 2 and gb.config_for(256, causal, 512)["SPLIT_D"]
    assert len(dq_calls) == 2 and gb.dq_config_for(256, causal)["SPLIT_D"]
    check_cuda_grads(first, q, k, v, do, causal)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


FUSED = dict(BLOCK_M=64, BLOCK_N=128, STAGES=2, num_warps=8, VEC=2, WITH_DQ=True)


def _scale_lse_delta(q, k, v, do, causal):
    """What the Gluon backward kernels take besides q, k, v, dO: the default scale, the forward's
    LSE and delta = rowsum(dO * O) in the LSE's layout."""
    scale = q.shape[-1] ** -0.5
    out, lse = route.forward(q, k, v, scale, causal)
    return scale, lse, (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()


def _direct(q, k, v, do, causal, cfg, deterministic=True, poison=True):
    """The Gluon kernel called directly (any mode), with NaN-poisoned gradient buffers."""
    scale, lse, delta = _scale_lse_delta(q, k, v, do, causal)
    bufs = [torch.full_like(t, float("nan")) if poison else torch.empty_like(t) for t in (q, k, v)]
    return gb.backward(do, q, k, v, lse, delta, *bufs, scale, causal, cfg, deterministic=deterministic), bufs


@needs_sm90
@pytest.mark.parametrize("d,causal", [(64, False), (64, True), (128, False), (128, True)])
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "x".join(map(str, c)))
def test_lse_early_moves_loads_not_bits(case, d, causal):
    """LSE_EARLY (config_for: where the consumers load a Q block's LSE and delta rows; 2 loads them a
    block ahead, clamped on the last block; 3 reads them from shared memory, where the producer
    staged them) changes when the loads run, not what is computed: dK and dV are the same bits for
    0, 1, 2 and 3 (NaN-poisoned buffers), and meet the reference rule."""
    b, sq, sk, h, hk = case
    if causal and sq > sk:
        pytest.skip("causal with Sq > Sk runs the Triton backward (rows without keys)")
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.float16, "cuda", seed=sq + 3 * d)
    do = torch.randn_like(q)
    runs = []
    for early in (0, 1, 2, 3):
        cfg = dict(gb.config_for(d, causal, sq), LSE_EARLY=early)
        res, bufs = _direct(q, k, v, do, causal, cfg)
        assert res is not None and res[1] is bufs[1] and res[2] is bufs[2]
        runs.append([t.clone() for t in res[1:]])
    for other in runs[1:]:
        for a, b_ in zip(runs[0], other):
            assert torch.equal(a, b_)
    scale, lse, delta = _scale_lse_delta(q, k, v, do, causal)
    dq = torch.full_like(q, float("nan"))
    gb.backward_dq(do, q, k, v, lse, delta, dq, scale, causal)
    check_cuda_grads((dq, *runs[2]), q, k, v, do, causal)


@needs_sm90
@pytest.mark.parametrize("variant", [dict(DQ_OWN_FIRST=True), dict(DQ_BUFS=1), dict(DQ_FIRST="flip"), dict(LSE_EARLY=2),
                                     dict(LSE_EARLY=3), dict(DQ_ALT=True), dict(DQ_ALT=True, BLOCK_M=64),
                                     dict(DQ_ALT=True, DQ_BUFS=1, LSE_EARLY=3), dict(DQ_LATE=True),
                                     dict(DQ_LATE=True, BLOCK_M=64, LSE_EARLY=3), dict(DQ_MSPLIT=True, BLOCK_M=128),
                                     dict(DQ_MSPLIT=True, BLOCK_M=128, LSE_EARLY=3, DQ_FIRST=True), dict(PER_HEAD=True)],
                         ids=["own-first", "one-slot", "dq-first-flipped", "lse-early", "lse-smem", "dq-alt",
                              "dq-alt-64", "dq-alt-one-slot-lse", "dq-late", "dq-late-64-lse", "dq-msplit",
                              "dq-msplit-lse-first", "per-head"])
@pytest.mark.parametrize("d,causal", [(64, False), (128, True)])
def test_fused_schedule_variants(variant, d, causal):
    """The fused mode's schedule switches (fused_config_for's DQ_BUFS, DQ_FIRST, DQ_OWN_FIRST, and
    LSE_EARLY, DQ_ALT, DQ_LATE, DQ_MSPLIT, and the launch order PER_HEAD, whose ordered dQ adds
    must keep their turn in the 1-D grid) reorder work, not arithmetic: dK and dV are the same bits as the
    default config's, and so is dQ except with DQ_OWN_FIRST (consumer 1 then adds its two key halves in
    the other order), DQ_ALT (one wgmma of N = D per key half instead of two of D / 2, and 64-row Q
    blocks change the tiles) and DQ_MSPLIT (row halves of N = D), which meet the reference rule instead
    (as does any variant with other Q blocks). NaN-poisoned buffers; GQA,
    Sq != Sk. (DQ_MSPLIT's 128-row Q blocks fit shared memory at D = 64 only.)"""
    if "DQ_MSPLIT" in variant and d != 64:
        pytest.skip("DQ_MSPLIT takes 128-row Q blocks, which fit shared memory at D = 64 only")
    q, k, v = make_qkv(2, 256, 384, 4, 2, d, torch.float16, "cuda", seed=11 + d)
    do = torch.randn_like(q)
    base = gb.fused_config_for(d, causal)
    cfg = dict(base, **variant)
    if variant.get("DQ_FIRST") == "flip":
        cfg["DQ_FIRST"] = not base["DQ_FIRST"]
    ref, _ = _direct(q, k, v, do, causal, base)
    ref = [t.clone() for t in ref]
    res, bufs = _direct(q, k, v, do, causal, cfg)
    assert res is not None and res[0] is bufs[0]
    if cfg["BLOCK_M"] == base["BLOCK_M"]:  # (other Q blocks: other dK/dV sums)
        assert torch.equal(res[1], ref[1]) and torch.equal(res[2], ref[2])
    if ("DQ_OWN_FIRST" in variant or "DQ_ALT" in variant or "DQ_MSPLIT" in variant
            or cfg["BLOCK_M"] != base["BLOCK_M"]):
        check_cuda_grads(res, q, k, v, do, causal)
    else:
        assert torch.equal(res[0], ref[0])


@needs_sm90
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
def test_fused_dq_row_split(causal, deterministic):
    """DQ_MSPLIT (the consumers split the rows of a 128-row Q block's dQ part, FA4's D = 64 layout;
    opt-in) at D = 64, causal or not, with unordered and ordered dQ sums: NaN-poisoned buffers, GQA,
    Sq != Sk, several Q blocks per program; the reference rule for every gradient. (The schedule
    variants test compares it bit for bit with the default where the tiles match.)"""
    q, k, v = make_qkv(2, 384, 512, 4, 2, 64, torch.float16, "cuda", seed=31 + causal)
    do = torch.randn_like(q)
    cfg = dict(gb.fused_config_for(64, causal, deterministic=deterministic), DQ_MSPLIT=True, BLOCK_M=128)
    res, bufs = _direct(q, k, v, do, causal, cfg, deterministic=deterministic)
    assert res is not None and res[0] is bufs[0], "the fused kernel ran (not the Triton fallback)"
    check_cuda_grads(res, q, k, v, do, causal)


@needs_sm90
@pytest.mark.parametrize("d,causal", [(64, False), (64, True), (128, False), (128, True)])
def test_fused_per_head_order_unordered(d, causal):
    """The fused kernel in the per-head launch order (PER_HEAD) with unordered dQ sums (what
    deterministic=False runs from 2k tokens; PER_HEAD is set here too, so that the test keeps that
    order if the config changes): NaN-poisoned buffers, GQA, Sq != Sk, several
    heads and K blocks per batch; the reference rule for every gradient. (Ordered sums in that
    order are compared bit for bit with the 2-D grid's in test_fused_schedule_variants.)"""
    q, k, v = make_qkv(2, 384, 512, 4, 2, d, torch.float16, "cuda", seed=41 + d + causal)
    do = torch.randn_like(q)
    cfg = dict(gb.fused_config_for(d, causal, deterministic=False), PER_HEAD=True)
    res, bufs = _direct(q, k, v, do, causal, cfg, deterministic=False)
    assert res is not None and res[0] is bufs[0], "the fused kernel ran (not the Triton fallback)"
    check_cuda_grads(res, q, k, v, do, causal)


def test_fused_writer_protocol_model():
    """tests/fused_writer_model.py replays the fused mode's barrier protocol (producer, two
    consumers sharing dSᵀ, the writer warp with its staging slots and the ordered adds; several
    resident K-block programs, causal suffixes) under random schedules with PTX's mbarrier parity
    rule: no schedule deadlocks, no read sees the wrong block, and every Q block's adds come in
    K-block order. Negative controls, each caught: one dSᵀ buffer, a writer that skips its turn,
    consumers that stage without waiting for a free slot. It models the source by hand, so a
    miscompile would not show (perf-notes §22); the GPU tests cover the compiled kernel."""
    import fused_writer_model as model

    for causal in (False, True):
        for stages, dq_bufs in ((2, 2), (3, 1)):
            for n_k, n_q, resident in ((4, 8, 2), (6, 5, 3), (8, 8, 8)):
                got = model.explore(n_k, n_q, resident, stages, dq_bufs, causal, schedules=40)
                assert got == {"ok": 40}, (causal, stages, dq_bufs, n_k, n_q, resident, got)
    assert model.explore(6, 8, 3, 2, 2, True, schedules=40, bug="one_ds").get("data", 0) > 0
    assert model.explore(6, 8, 3, 2, 2, True, schedules=40, bug="no_turn").get("order", 0) > 0
    assert model.explore(6, 8, 3, 2, 2, True, schedules=40, bug="no_empty").get("data", 0) > 0
    # DQ_ALT (the consumers take turns at whole dQ parts): no release barrier for the dSᵀ buffers
    for causal in (False, True):
        for stages, dq_bufs in ((2, 2), (3, 2), (3, 1)):
            got = model.explore(6, 8, 3, stages, dq_bufs, causal, schedules=40, alt=True)
            assert got == {"ok": 40}, ("alt", causal, stages, dq_bufs, got)
    for bug, caught in (("one_ds", "data"), ("no_turn", "order"), ("no_empty", "data")):
        assert model.explore(6, 8, 3, 3, 2, True, schedules=40, bug=bug, alt=True).get(caught, 0) > 0, bug
    # DQ_LATE (a block's dQ halves staged after the next block's Q/dO wait)
    for causal in (False, True):
        for stages, dq_bufs in ((2, 2), (3, 1)):
            got = model.explore(6, 8, 3, stages, dq_bufs, causal, schedules=40, late=True)
            assert got == {"ok": 40}, ("late", causal, stages, dq_bufs, got)
    for bug, caught in (("no_turn", "order"), ("no_empty", "data")):
        assert model.explore(6, 8, 3, 2, 2, True, schedules=40, bug=bug, late=True).get(caught, 0) > 0, bug


def test_lse_smem_protocol_model():
    """LSE_EARLY=3 in tests/fused_writer_model.py: the producer stages each block's LSE/delta rows
    after issuing its Q/dO copies and arrives a second time on the slot's q_full (count 2); under
    random schedules no consumer reads another block's rows, at the LSE read after its q_full wait
    or at the delta read before dSᵀ, and nothing deadlocks (ring depths 2 and 3, one or two dQ
    staging slots, causal suffixes, several resident programs). Negative control: q_full with one arrival (the expect only) lets a
    consumer read stale rows, which the model catches. The GPU tests cover the compiled kernel."""
    import fused_writer_model as model

    for causal in (False, True):
        for stages, dq_bufs in ((2, 2), (2, 1), (3, 1), (3, 2)):
            for n_k, n_q, resident in ((4, 8, 2), (6, 5, 3), (8, 8, 8)):
                got = model.explore(n_k, n_q, resident, stages, dq_bufs, causal, schedules=40, lse=True)
                assert got == {"ok": 40}, (causal, stages, dq_bufs, n_k, n_q, resident, got)
    assert model.explore(6, 8, 3, 2, 2, True, schedules=40, bug="lse_one_arrival", lse=True).get("data", 0) > 0


@needs_gluon
def test_padded_head_dim_rule():
    """Head dims strictly between 64 and 128 run the Gluon kernels at 128, those between 128 and
    256 at 256; the three native ones (64, 128, 256) as they are; everything else is not taken."""
    assert g90.padded_head_dim(64) == 64 and g90.padded_head_dim(128) == 128 and g90.padded_head_dim(256) == 256
    assert all(g90.padded_head_dim(d) == 128 for d in (65, 72, 80, 96, 112, 120, 127))
    assert all(g90.padded_head_dim(d) == 256 for d in (129, 136, 160, 192, 200, 224, 255))
    assert all(g90.padded_head_dim(d) is None for d in (8, 32, 40, 48, 63, 257, 320))
    assert gb._f90 is g90  # the backward routes by the forward's rule


@pytest.mark.parametrize("d,width", [(96, 128), (192, 256)])
@pytest.mark.parametrize("seqlen", [1, 17, 65])
def test_pad_head_dim(seqlen, d, width, backend):
    """The padded copies the Gluon backward runs a 64 < D < 128 call on (the Triton copy kernel,
    in the interpreter or on the GPU): the input's values in the first D columns whatever its
    strides ((B, H, S, D) memory here), exact zeros after them, contiguous (B, S, H, 128). The
    kernel writes every element of a NaN-poisoned destination and nothing past it (the
    destination is every other row slice of a larger buffer)."""
    if backend == "tiled":
        pytest.skip("a Triton kernel: the interpreter or the GPU")
    dev = backend_device(backend)
    t = torch.randn(2, 3, seqlen, d, device=dev).transpose(1, 2)  # (B, S, H, D) view of (B, H, S, D) memory
    p = fwd_mod.pad_head_dim(t, width)
    assert p.shape == (2, seqlen, 3, width) and p.is_contiguous() and p.dtype == t.dtype
    assert torch.equal(p[..., :d], t) and torch.equal(p[..., d:], torch.zeros(2, seqlen, 3, width - d, device=dev))
    wide = torch.full((2, seqlen, 3, 2, width), float("nan"), device=dev)
    fwd_mod.copy_cols(t, wide[..., 0, :])
    assert torch.equal(wide[..., 0, :d], t) and not wide[..., 0, d:].any()
    assert torch.isnan(wide[..., 1, :]).all()  # the neighbouring slices are untouched


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [72, 96, 120, 160, 192])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_gluon_backward_padded_head_dims(case, d, causal, gluon_bwd_calls):
    """64 < D < 128 and 128 < D < 256 through the public API: the Gluon kernels at D = 128 (256,
    the split-column kernels) on zero-padded copies,
    storing the gradients' own D columns (D_OUT). The gradients meet flash-attn's rule; into
    NaN-poisoned buffers that are the first D columns of wider ones, every element is written and
    nothing past column D; they equal the pinned Triton backward up to the summation order."""
    b, sq, sk, h, hk = case
    if causal and sq > sk:
        pytest.skip("causal with Sq > Sk runs the Triton backward (rows without keys)")
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.bfloat16, "cuda", seed=sq + sk + d)
    do = torch.randn_like(q)
    grads = _grads(q, k, v, do, causal)
    assert [c[1].shape[-1] for c in gluon_bwd_calls] == [g90.padded_head_dim(d)], "the call did not take the padded Gluon backward"
    check_cuda_grads(grads, q, k, v, do, causal)
    _check_padded_into_wider_buffers(q, k, v, do, causal)


def _check_padded_into_wider_buffers(q, k, v, do, causal):
    """The padded backward into NaN-poisoned buffers that are the first D columns of wider ones."""
    d = q.shape[-1]
    scale = d ** -0.5
    out, lse = route.forward(q, k, v, scale, causal)
    wide = [torch.full(t.shape[:-1] + (d + 32,), float("nan"), dtype=t.dtype, device=t.device) for t in (q, k, v)]
    bufs = [w[..., :d] for w in wide]
    got = route.backward(do, q, k, v, out, lse, scale, causal, dq=bufs[0], dk=bufs[1], dv=bufs[2])
    assert all(g is buf for g, buf in zip(got, bufs)) and not any(torch.isnan(g).any() for g in got)
    assert all(torch.isnan(w[..., d:]).all() for w in wide), "a store past the gradients' head dim"
    ref = bwd_mod.flash_attn_backward(do, q, k, v, out, lse, scale, causal, config=bwd_mod.default_bwd_config(d, causal))
    for g, r in zip(got, ref):
        assert (g.float() - r.float()).abs().max().item() <= 0.02 * r.float().abs().max().item()


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES[:2], ids=lambda c: "x".join(map(str, c)))
def test_gluon_fused_backward_padded_head_dim(case, causal, monkeypatch, gluon_bwd_calls):
    """D = 96 through the opt-in fused kernel (debug switch gluon_fused=1): its dQ sums run over 128
    columns, of which the first 96 are cast into dq; dK and dV as in the split kernels."""
    monkeypatch.setattr(DEBUG, "gluon_fused", True)
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, 96, torch.float16, "cuda", seed=sq + sk)
    do = torch.randn_like(q)
    grads = _grads(q, k, v, do, causal)
    assert [c[1].shape[-1] for c in gluon_bwd_calls] == [128] and gluon_bwd_calls[0][-1].get("WITH_DQ")
    check_cuda_grads(grads, q, k, v, do, causal)
    _check_padded_into_wider_buffers(q, k, v, do, causal)


@needs_gluon
def test_lse_early_rule():
    """config_for's LSE_EARLY: the producer warp stages each Q block's LSE/delta rows in shared memory
    (3) for every warp-specialized dK/dV kernel but the split-D one (D = 256), whose consumers load
    their own; the fused mode's ordered sums keep the loads after the Q/dO wait (0), its unordered
    sums (deterministic=False) take 3 as well, 64-row Q blocks at D = 64 non-causal (measured
    2026-12-05: gluon.backward's docstrings; the other cases keep the ordered kernel's tiles) and the
    per-head launch order (PER_HEAD, measured 2026-12-06), which the ordered sums do not take."""
    for d in (64, 128):
        for c in (False, True):
            for n in (1024, 4096, 16384):
                assert gb.config_for(d, c, n)["LSE_EARLY"] == 3
            ordered = gb.fused_config_for(d, c)
            assert ordered["LSE_EARLY"] == 0
            nd = gb.fused_config_for(d, c, deterministic=False)
            rows = 64 if d == 64 else ordered["BLOCK_M"]
            assert nd["LSE_EARLY"] == 3 and dict(nd, LSE_EARLY=0, BLOCK_M=ordered["BLOCK_M"], PER_HEAD=False) == ordered
            assert nd["BLOCK_M"] == rows and nd["PER_HEAD"] and not ordered["PER_HEAD"]
    assert gb.fused_config_for(64, False)["BLOCK_M"] == 128  # (what the 64-row change is measured against)
    assert all(gb.config_for(256, c, 4096)["LSE_EARLY"] == 0 for c in (False, True))


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "x".join(map(str, c)))
def test_gluon_fused_mode_matches_reference(case, d, causal):
    """WITH_DQ=True: dQ summed in fp32 by ordered atomic adds inside the dK/dV kernel."""
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.float16, "cuda", seed=sq + d)
    do = torch.randn_like(q)
    res, bufs = _direct(q, k, v, do, causal, FUSED)
    assert res is not None and res[0] is bufs[0]  # dq written by the kernel
    check_cuda_grads(res, q, k, v, do, causal)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_ws_fused_mode_matches_reference(case, d, causal, dtype):
    """The warp-specialized kernel's fused mode (fused_config_for): dQ summed in fp32 by ordered TMA
    reductions, every gradient buffer NaN-poisoned, flash-attn's rule; unordered within 1e-2 of it."""
    b, sq, sk, h, hk = case
    if causal and sq > sk:
        pytest.skip("causal with Sq > Sk runs the Triton backward (rows without keys)")
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, "cuda", seed=sq + 5 * d)
    do = torch.randn_like(q)
    cfg = gb.fused_config_for(d, causal)
    res, bufs = _direct(q, k, v, do, causal, cfg)
    assert res is not None and res[0] is bufs[0]  # dq written by the kernel
    check_cuda_grads(res, q, k, v, do, causal)
    again, _ = _direct(q, k, v, do, causal, cfg)
    for a, b in zip(res, again):  # ordered sums: the same bits on a rerun
        assert torch.equal(a, b)
    nondet, _ = _direct(q, k, v, do, causal, cfg, deterministic=False)
    assert torch.equal(res[1], nondet[1]) and torch.equal(res[2], nondet[2])  # dK, dV: no atomics
    assert (res[0].float() - nondet[0].float()).abs().max().item() <= 1e-2 * res[0].float().abs().max().item()


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ws_fused_mode_through_the_public_api(causal, monkeypatch, gluon_bwd_calls):
    """The debug switch gluon_fused=1: autograd of flash_attn_func takes the fused kernel (one Gluon
    launch, no dQ kernel); with deterministic=True its gradients are bitwise the same in three runs
    (ordered sums); with deterministic=False (unordered, LSE_EARLY=2) they meet the reference rule."""
    monkeypatch.setattr(DEBUG, "gluon_fused", True)
    dq_calls = count_calls(monkeypatch, gb, "backward_dq")
    q, k, v = make_qkv(2, 2048, 2048, 8, 2, 128, torch.bfloat16, "cuda", seed=9)
    do = torch.randn_like(q)
    runs = [_grads(q, k, v, do, causal, deterministic=True) for _ in range(3)]
    # the first call launches through gb.backward and the route keeps its fused launch; the next two
    # replay it (route._BWD_PLANS or the signature's kept backward), not through gb.backward
    assert len(gluon_bwd_calls) == 1 and not dq_calls
    assert [launches[0] for _, launches in route._BWD_PLANS.values()] == ["fused"]
    check_cuda_grads(runs[0], q, k, v, do, causal)
    for other in runs[1:]:
        for a, b in zip(runs[0], other):
            assert torch.equal(a, b)
    unordered = _grads(q, k, v, do, causal)   # (another plan key: deterministic=False)
    assert len(gluon_bwd_calls) == 2 and not dq_calls
    assert gluon_bwd_calls[-1][11] == gb.fused_config_for(128, causal, deterministic=False)
    check_cuda_grads(unordered, q, k, v, do, causal)
    monkeypatch.setattr(DEBUG, "gluon_fused", False)
    split = _grads(q, k, v, do, causal)
    for a, b in zip(runs[0], split):  # the split default: same math, other fp32 summation order for dQ
        assert (a.float() - b.float()).abs().max().item() <= 1e-2 * b.float().abs().max().item()


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "x".join(map(str, c)))
def test_ws_kernel_equals_the_eight_warp_kernel(case, d, causal):
    """The warp-specialized dK/dV kernel (the default) and the 8-warp one, each with dK carried in
    flight across blocks or waited every block (CARRY_DK), and the WS kernel with turns
    (PINGPONG), and the WS kernel in the other launch order (PER_HEAD) do the same arithmetic per
    element in the same order: all six give the same dK and dV bits, and none leaves a NaN of the
    poisoned buffers."""
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.bfloat16, "cuda", seed=sq + 3 * d)
    do = torch.randn_like(q)
    base = gb.config_for(d, causal, sq)
    assert base["WS"] and not base["WITH_DQ"]
    ws, _ = _direct(q, k, v, do, causal, base)
    assert ws is not None and ws[0] is None  # dQ is left to the Triton kernel
    for a in ws[1:]:
        assert not torch.isnan(a).any()
    others = [dict(base, WS=False, CARRY_DK=True), dict(base, WS=False, CARRY_DK=False),
              dict(base, CARRY_DK=not base["CARRY_DK"]), dict(base, PINGPONG=True),
              dict(base, PER_HEAD=not base.get("PER_HEAD", False))]
    for cfg in others:
        res, _ = _direct(q, k, v, do, causal, cfg)
        assert res is not None
        for a, c in zip(ws[1:], res[1:]):
            assert torch.equal(a, c), f"{cfg} differs from the default"


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "x".join(map(str, c)))
def test_dq_kernel_under_pdl_overlaps_safely(case, d, causal):
    """The dQ kernel launched with PDL right after a dK/dV kernel that lets dependents launch from
    its start (PDL_TRIGGER) computes the same bits as the serial pair, leaves no NaN of the
    poisoned buffers, and ordinary kernels launched right after the pair (no sync) read the
    results: five poisoned reruns, each reduced at once (dQ first, then dK and dV), equal the
    serial sums. The dQ kernel usually outlasts the dK/dV kernel's tail, so this does not
    establish that a kernel after the pair waits for the dK/dV kernel (perf-notes §27)."""
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.bfloat16, "cuda", seed=sq + 7 * d)
    do = torch.randn_like(q)
    scale, lse, delta = _scale_lse_delta(q, k, v, do, causal)
    kv_cfg, dq_cfg = gb.config_for(d, causal, sq), gb.dq_config_for(d, causal)

    def pair(pdl):
        bufs = [torch.full_like(t, float("nan")) for t in (q, k, v)]
        assert gb.backward(do, q, k, v, lse, delta, *bufs, scale, causal, dict(kv_cfg, PDL_TRIGGER=pdl)) is not None
        assert gb.backward_dq(do, q, k, v, lse, delta, bufs[0], scale, causal, dict(dq_cfg, PDL=pdl)) is not None
        return bufs, torch.stack([t.float().sum() for t in bufs])  # reduced at once, no sync

    serial, want = pair(False)
    check_cuda_grads(serial, q, k, v, do, causal)
    for _ in range(5):
        got, sums = pair(True)
        assert torch.equal(sums, want)
        for a, c in zip(got, serial):
            assert torch.equal(a, c)


class _FakeDesc:
    """Stands in for a TensorDescriptor on CPU tensors (only ``base`` is read by the host path)."""

    def __init__(self, base):
        self.base = base


@needs_gluon
def test_gluon_dq_falls_back_when_it_does_not_compile(monkeypatch):
    """A compile failure of the Gluon dQ kernel warns, returns None (the caller then runs the Triton
    dQ kernel) and is not retried (CPU tensors: the launch is replaced before any GPU work)."""
    attempts = []

    class Broken:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                attempts.append(1)
                raise RuntimeError("PassManager::run failed (simulated)")
            return launch

    monkeypatch.setattr(gb, "_attn_bwd_dq_sm90_ws", Broken())
    monkeypatch.setattr(gb, "_BROKEN", set())
    monkeypatch.setattr(gb, "_LAUNCHES", {})  # a launch cached by an earlier test would hold the real kernel
    monkeypatch.setattr(gb._f90, "_desc", lambda t, s, h, rows: (_FakeDesc(t), (0, 0, 0)))
    q = torch.empty(1, 128, 2, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, 128)
    with pytest.warns(RuntimeWarning, match="Gluon dQ kernel failed to compile"):
        assert gb.backward_dq(q, q, q, q, lse, lse, torch.empty_like(q), 0.125, False) is None
    assert gb.backward_dq(q, q, q, q, lse, lse, torch.empty_like(q), 0.125, False) is None
    assert len(attempts) == 1


@needs_gluon
def test_gluon_dq_kernel_checks_its_tiles():
    """backward_dq (the Gluon dQ kernel) refuses lengths that are not multiples of
    its tiles with a message, before any launch (CPU tensors do)."""
    q = torch.empty(1, 192, 2, 64, dtype=torch.float16)
    k = torch.empty(1, 256, 2, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, 192)
    with pytest.raises(ValueError, match="multiples of BLOCK_M=128"):
        gb.backward_dq(q, q, k, k, lse, lse, torch.empty_like(q), 0.125, False)


@needs_gluon
def test_gluon_dq_kernel_checks_out():
    """backward_dq with ``out`` (delta computed in the kernel) refuses an O it cannot read, with a
    message, before any launch: another shape, another dtype, a non-unit last stride, and a D = 256
    config (SPLIT_D, each consumer holds half a row). out_supported() is the route's check."""
    q = torch.empty(1, 128, 2, 64, dtype=torch.float16)
    lse = torch.empty(1, 2, 128)
    dq = torch.empty_like(q)
    bad = {"shape": torch.empty(1, 128, 2, 32, dtype=torch.float16),
           "dtype": torch.empty(1, 128, 2, 64, dtype=torch.bfloat16),
           "stride": torch.empty(1, 128, 2, 128, dtype=torch.float16)[..., ::2]}
    for what, out in bad.items():
        assert not gb.out_supported(out, q, dq), what
        with pytest.raises(ValueError, match="out must have dq's shape"):
            gb.backward_dq(q, q, q, q, lse, lse, dq, 0.125, False, out=out)
    assert gb.out_supported(torch.empty_like(q), q, dq)
    q256 = torch.empty(1, 128, 2, 256, dtype=torch.float16)
    with pytest.raises(ValueError, match="without SPLIT_D"):
        gb.backward_dq(q256, q256, q256, q256, lse, lse, torch.empty_like(q256), 0.0625, False,
                       out=torch.empty_like(q256))
    assert not gb.dq_computes_delta(256, False) and gb.dq_computes_delta(128, True)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 96])
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "x".join(map(str, c)))
def test_gluon_dq_kernel_computes_delta(case, d, causal):
    """backward_dq with ``out``: the dQ kernel computes delta = rowsum(dO∘O) itself. Every element
    of a NaN-poisoned delta buffer is written and equals the fp32 rowsum within fp32 summation
    order; dq (NaN-poisoned) is the same bits as the kernel's result without ``out`` reading that
    stored delta back; dQ, and dK/dV from the default kernel fed that delta, meet the fp32 rule.
    D = 96 runs on copies padded to 128 (O keeps its 96 columns: D_OUT)."""
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.float16, "cuda", seed=sq + 7 * d)
    do = torch.randn_like(q)
    scale, lse, delta_ref = _scale_lse_delta(q, k, v, do, causal)
    out, _ = route.forward(q, k, v, scale, causal)
    width = g90.padded_head_dim(d)
    g_in = (do, q, k, v) if width == d else tuple(fwd_mod.pad_head_dim(t, width) for t in (do, q, k, v))
    delta = torch.full_like(delta_ref, float("nan"))
    dq = torch.full_like(q, float("nan"))
    assert gb.backward_dq(*g_in, lse, delta, dq, scale, causal, out=out) is dq
    assert not torch.isnan(delta).any() and not torch.isnan(dq).any()
    torch.testing.assert_close(delta, delta_ref, rtol=1e-5, atol=1e-5 * delta_ref.abs().max().item())
    dq_read = torch.full_like(q, float("nan"))
    assert gb.backward_dq(*g_in, lse, delta, dq_read, scale, causal) is dq_read
    assert torch.equal(dq, dq_read)  # the same delta bits, used from registers or read back
    dkv = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    assert gb.backward(*g_in, lse, delta, *dkv, scale, causal) is not None
    check_cuda_grads((dq, dkv[1], dkv[2]), q, k, v, do, causal)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "x".join(map(str, c)))
def test_gluon_dq_kernel_matches_reference(case, d, causal):
    """The Gluon dQ kernel (``backward_dq``) under the fp32 rule, writing every
    element of a NaN-poisoned buffer; dK and dV from the default Gluon kernel."""
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.float16, "cuda", seed=sq + 5 * d)
    do = torch.randn_like(q)
    scale, lse, delta = _scale_lse_delta(q, k, v, do, causal)
    dkv, _ = _direct(q, k, v, do, causal, gb.config_for(d, causal, sq))
    dq = torch.full_like(q, float("nan"))
    assert gb.backward_dq(do, q, k, v, lse, delta, dq, scale, causal) is dq
    check_cuda_grads((dq, dkv[1], dkv[2]), q, k, v, do, causal)


@needs_gluon
def test_gluon_dq_is_the_default_and_can_be_turned_off(monkeypatch):
    """The Gluon dQ kernel follows the Gluon dK/dV kernel unless the debug switch gluon_dq=0 (or the
    whole Gluon backward is off: gluon_bwd=0, Options(backend="triton")); then the Triton dQ kernel
    runs after the Gluon dK/dV kernel, reading the delta kernel's delta. It applies to lengths that
    are multiples of its tiles. (Routing on CPU tensors with recorders: test_route_backward_switches.)"""
    assert Debug.from_env("").gluon_dq and Debug.from_env("").gluon_bwd and not Debug.from_env("").gluon_fused
    assert not Debug.from_env("gluon_dq=0").gluon_dq
    q = torch.empty(1, 256, 2, 64, dtype=torch.float16)
    assert gb.dq_supported(q, q, torch.empty_like(q), False)
    assert not gb.dq_supported(q[:, :192], q, torch.empty_like(q[:, :192]), False)   # not a tile multiple
    assert not gb.dq_supported(q, q, torch.empty(1, 256, 2, 128, dtype=torch.float16)[..., ::2], False)
    _debug_defaults(monkeypatch)
    q, k, v = make_qkv(1, 128, 128, 2, 2, 64, torch.float16, "cpu", seed=1)
    do, out, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 2, 128)
    for switch, want in ((True, [("dq", None), ("dq computes delta", True), ("dkdv", None)]),
                         (False, [("delta", None), ("dkdv", None),
                                  ("triton", dict(delta=True, run_dkdv=False, run_dq=True))])):
        monkeypatch.setattr(DEBUG, "gluon_dq", switch)
        launches, _ = _record_launches(monkeypatch)
        _route_cuda_backward(do, q, k, v, out, lse, 0.125, False)
        assert launches == want, (switch, launches)


@needs_sm90
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_dq_route_through_the_public_api(causal, layout, monkeypatch, gluon_bwd_calls):
    """By default flash_attn_func's backward runs both Gluon kernels and meets the fp32 rule, in
    (B, S, H, D) memory and in SDPA's (B, H, S, D) memory (other dq strides)."""
    monkeypatch.setattr(DEBUG, "gluon_dq", True)
    dq_calls = count_calls(monkeypatch, gb, "backward_dq")
    q, k, v = make_qkv(2, 512, 640, 4, 2, 128, torch.bfloat16, "cuda", seed=21)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    do = torch.randn_like(q)
    grads = _grads(q, k, v, do, causal)
    assert gluon_bwd_calls and dq_calls
    check_cuda_grads(grads, q, k, v, do, causal)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_backward_bitwise_deterministic(causal, gluon_bwd_calls):
    """Two runs give the same bits: ``deterministic=True`` through the public API (from 2k tokens
    and route.FUSED_MIN_FLOPS of work the default, ``deterministic=False``, takes the fused kernel's
    unordered sums, since e00c8c0), and
    the fused mode, whose ordered dQ sums take many K blocks per dQ block."""
    q, k, v = make_qkv(2, 2048, 2048, 8, 2, 128, torch.bfloat16, "cuda", seed=4)
    do = torch.randn_like(q)
    runs = [_grads(q, k, v, do, causal, deterministic=True) for _ in range(2)]
    assert gluon_bwd_calls
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    fused = [_direct(q, k, v, do, causal, FUSED)[0] for _ in range(3)]
    for other in fused[1:]:
        for a, b in zip(fused[0], other):
            assert torch.equal(a, b)


@needs_sm90
def test_gluon_backward_unordered_mode_is_close():
    """deterministic=False (unordered atomic sums, fused mode) gives the same gradients up to the
    fp32 summation order."""
    q, k, v = make_qkv(1, 1024, 1024, 4, 4, 128, torch.float16, "cuda", seed=6)
    do = torch.randn_like(q)
    det, _ = _direct(q, k, v, do, True, FUSED)
    nondet, _ = _direct(q, k, v, do, True, FUSED, deterministic=False)
    assert torch.equal(det[1], nondet[1]) and torch.equal(det[2], nondet[2])  # dK, dV: no atomics
    assert (det[0].float() - nondet[0].float()).abs().max().item() <= 1e-2 * det[0].float().abs().max().item()


@needs_sm90
def test_bwd_compile_failure_falls_back_to_triton(monkeypatch):
    monkeypatch.setattr(DEBUG, "gluon_bwd", True)
    attempts = []

    def broken(*args, **kwargs):
        attempts.append(1)
        raise RuntimeError("PassManager::run failed (simulated)")

    monkeypatch.setattr(gb, "_launch", broken)
    monkeypatch.setattr(gb, "_BROKEN", set())
    q, k, v = make_qkv(1, 256, 256, 2, 2, 128, torch.float16, "cuda", seed=3)
    do = torch.randn_like(q)
    with pytest.warns(RuntimeWarning, match="Gluon backward failed to compile"):
        grads = _grads(q, k, v, do, False)
    check_cuda_grads(grads, q, k, v, do, False)
    _grads(q, k, v, do, False)
    assert len(attempts) == 1, "a configuration that failed to compile must not be retried"


@needs_gluon
def test_default_kernels_keep_wgmma_asynchronous():
    """No GPU needed: compile every default Gluon configuration for sm_90 and read the SASS
    (tools/sass_check.py, cuobjdump from triton's wheel). ptxas serializes wgmma when an
    accumulator is touched by other instructions while in flight (advisory C7515): a full wait
    then follows each HGMMA. That happened to the backward while it carried dK across blocks; the
    forward kernels, the dQ kernel and the backward except at D=64 non-causal must keep a handful
    of full waits, not one per HGMMA. (The D=64 non-causal backward still carries dK, which
    measured faster there: perf-notes §16.)"""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import triton

    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")):
        pytest.skip("this triton wheel ships no cuobjdump")
    root = Path(__file__).resolve().parent.parent
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}  # compile, not interpret
    env["PYTHONPATH"] = str(root)
    res = subprocess.run([sys.executable, str(root / "tools" / "sass_check.py"), "--json"],
                         capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = json.loads(res.stdout.strip().splitlines()[-1])
    assert len(rows) == 20 and {"bwd D=64 causal=0", "bwd D=64 causal=1", "dq D=128 causal=1",
                                "fwd D=64 causal=1 N=16384"} <= set(rows)
    for name, r in rows.items():
        assert r["hgmma"] >= 16 and r["loop"] > 0, (name, r)
        if name != "bwd D=64 causal=0":
            assert r["waits0"] * 4 <= r["hgmma"], f"{name}: wgmmas serialized ({r})"


@needs_gluon
@needs_gluon
def test_broken_fused_config_makes_no_buffers(monkeypatch):
    """Where the fused config failed to compile before (``gb._BROKEN``), the route neither makes the
    fused mode's fp32 dQ buffers nor zeroes them, and runs the split pair as it runs by default (the
    dQ kernel computing delta; no delta kernel).
    Launchers recorded, CPU tensors."""
    _debug_defaults(monkeypatch)
    monkeypatch.setattr(DEBUG, "gluon_fused", True)
    launches, _ = _record_launches(monkeypatch)
    made = count_calls(monkeypatch, gb, "fused_buffers")
    q, k, v = make_qkv(1, 128, 128, 2, 2, 64, torch.float32, "cpu", seed=1)
    do, out, lse = torch.randn_like(q), torch.randn_like(q), torch.randn(1, 2, 128)
    monkeypatch.setattr(gb, "_BROKEN", set())
    _route_cuda_backward(do, q, k, v, out, lse, 0.125, False)
    assert len(made) == 1 and [c for n, c in launches if n == "dkdv"][0].get("WITH_DQ")
    launches.clear()
    monkeypatch.setattr(gb, "_BROKEN", {gb._f90._key(64, False, q.dtype, gb.fused_config_for(64, False, False))})
    _route_cuda_backward(do, q, k, v, out, lse, 0.125, False)
    assert len(made) == 1, "no buffers for a broken fused config"
    assert not any(c and c.get("WITH_DQ") for n, c in launches if n == "dkdv")
    assert ("delta", None) not in launches and ("dq computes delta", True) in launches  # the split pair's own way


@needs_gluon
def test_fused_mode_refuses_buffers_of_another_layout():
    """``gb.backward(..., bufs=)`` checks that the caller's buffers are ``fused_buffers(q, BLOCK_M)``'s
    (the cached launch keys neither), and says what to pass; no kernel is reached (CPU tensors)."""
    q, k, v = make_qkv(1, 256, 256, 2, 2, 64, torch.float16, "cpu", seed=1)
    do, lse, delta = torch.randn_like(q), torch.randn(1, 2, 256), torch.randn(1, 2, 256)
    cfg = gb.fused_config_for(64, False, False)
    wrong = gb.fused_buffers(q[:, :128], cfg["BLOCK_M"])
    for bufs in (wrong, gb.fused_buffers(q, cfg["BLOCK_M"] // 2)):
        with pytest.raises(ValueError, match=r"fused_buffers\(q, "):
            gb._launch(do, q, k, v, lse, delta, torch.empty_like(q), torch.empty_like(k), torch.empty_like(v),
                       0.125, False, cfg, False, bufs)


@needs_gluon
def test_deterministic_flag_picks_the_backward(monkeypatch):
    """``deterministic=False`` takes the fused kernel with unordered dQ sums only where it measured
    faster than the split pair (route._fused_backward: D = 64 or 128 with both lengths >= 1k non-causal
    and >= 2k causal, and at least route.FUSED_MIN_FLOPS of backward work), in the per-head launch order;
    ``deterministic=True`` never takes it, unless the debug switch gluon_fused forces the fused
    kernel, which then keeps its ordered (bitwise) sums. Launchers recorded; the tensors are on
    the GPU where there is one (a padded head dim's copy kernel runs before the recorded launches,
    and kernels built for the GPU cannot read CPU tensors)."""
    _debug_defaults(monkeypatch)
    launches, _ = _record_launches(monkeypatch)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    modes = []
    real = gb.backward  # (the recorder _record_launches installed)
    monkeypatch.setattr(gb, "backward", lambda *a, deterministic=True, **kw: modes.append(deterministic)
                        or real(*a, **kw))

    def route_of(d, causal, sq, sk, deterministic, b=1, h=1, hk=None):
        launches.clear()
        modes.clear()
        q = torch.empty(b, sq, h, d, device=dev)
        k, v = (torch.empty(b, sk, hk or h, d, device=dev) for _ in range(2))
        do, out, lse = torch.empty_like(q), torch.empty_like(q), torch.empty(b, h, sq, device=dev)
        kw = dict(window=(-1, -1), softcap=0.0, alibi_slopes=None, dropout_p=0.0, seed=None, cu_seqlens_q=None,
                  cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None)
        route._cuda_backward(do, q, k, v, out, lse, 0.1, causal, None, kw, None, None, None, None, DEFAULT,
                             deterministic)
        fused = [cfg for name, cfg in launches if name == "dkdv" and cfg and cfg.get("WITH_DQ")]
        if fused:
            assert fused == [gb.fused_config_for(min(d, 128), causal, modes[0])]
        return ("fused", modes[0]) if fused else "split"

    # (h heads for the work floor route.FUSED_MIN_FLOPS: 2e11 FLOPs of backward, 10·B·H·Sq·Sk·D,
    # halved when causal)
    for d, causal, sq, sk, h in ((128, False, 16384, 16384, 1), (128, False, 16384, 32768, 1),
                                 (128, False, 2048, 2048, 48), (128, True, 2048, 16384, 16),
                                 (64, False, 2048, 2048, 96), (64, True, 4096, 2048, 96)):
        assert route_of(d, causal, sq, sk, False, h=h) == ("fused", False), (d, causal, sq, sk, h)
    assert route_of(128, False, 16384, 16384, True) == "split"
    assert route_of(64, True, 2048, 2048, True, h=128) == "split"
    # under the floor the split pair stays (the host bench's B=1 N=2k H=16/8 D=128 step: 4.3e10
    # causal, 8.6e10 not, host-bound; B=1 causal 4k: 1.7e11, where the fused kernel measured slower)
    for causal in (False, True):
        assert route_of(128, causal, 2048, 2048, False, h=16, hk=8) == "split", causal
    assert route_of(128, True, 4096, 4096, False, h=16, hk=8) == "split"                  # 1.7e11
    assert route_of(128, False, 4096, 4096, False, h=16, hk=8) == ("fused", False)       # 3.4e11
    assert route_of(128, True, 8192, 8192, False, h=16, hk=8) == ("fused", False)        # 6.9e11
    assert route_of(128, True, 2048, 2048, False, b=5, h=16, hk=8) == ("fused", False)   # 2.1e11
    assert route_of(64, True, 2048, 2048, False, h=149) == "split"                        # 1.9995e11
    assert route_of(64, True, 2048, 2048, False, h=150) == ("fused", False)               # 2.013e11
    # the length floors, with work well above FUSED_MIN_FLOPS: non-causal from 1k, causal from 2k
    assert route_of(128, False, 1024, 1024, False, b=16, h=16) == ("fused", False)       # 3.4e11
    assert route_of(64, False, 1024, 1024, False, b=16, h=32) == ("fused", False)        # 3.4e11
    assert route_of(128, False, 1023, 1024, False, b=16, h=16) == "split"
    assert route_of(128, False, 1024, 1023, False, b=16, h=16) == "split"
    assert route_of(128, True, 1024, 1024, False, b=32, h=16) == "split"                  # 3.4e11, causal
    assert route_of(128, True, 2047, 2048, False, b=16, h=16) == "split"                  # 6.9e11, causal
    for d, causal, sq, sk in ((128, False, 1024, 1024), (128, True, 8192, 1024), (64, False, 2047, 2048),
                              (64, True, 2048, 1920), (256, False, 16384, 16384), (96, False, 16384, 16384)):
        assert route_of(d, causal, sq, sk, False) == "split", (d, causal, sq, sk)
    monkeypatch.setattr(DEBUG, "gluon_fused", True)
    assert route_of(64, True, 256, 256, True) == ("fused", True)
    assert route_of(64, True, 256, 256, False) == ("fused", False)   # (the switch ignores the floor)
    assert route_of(256, False, 256, 256, False) == "split"  # no fused kernel at D = 256


def test_deterministic_reaches_the_backward(monkeypatch):
    """flash-attn's ``deterministic`` travels from every public entry (eager autograd, the packed
    variants, the custom op's registered autograd) to ``route.backward``; default False."""
    from tileflash.ops import attention as ops

    seen = []
    real = route.backward
    monkeypatch.setattr(route, "backward", lambda *a, deterministic=None, **kw: seen.append(deterministic)
                        or real(*a, deterministic=bool(deterministic), **kw))
    q, k, v = make_qkv(1, 33, 33, 2, 2, 16, torch.float32, "cpu", seed=3)
    for det in (None, False, True):
        extra = {} if det is None else dict(deterministic=det)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        tileflash.flash_attn_func(qg, kg, vg, causal=True, **extra).sum().backward()
        qkv = torch.stack((q, k, v), 2).requires_grad_()
        tileflash.flash_attn_qkvpacked_func(qkv, **extra).sum().backward()
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, _ = ops.attention_fwd(qg, kg, vg, 0.25, False, 0, **extra)  # the op, as torch.compile sees it
        out.sum().backward()
    assert seen == [False] * 3 + [False] * 3 + [True] * 3
    with pytest.raises(TypeError, match="deterministic must be a bool"):
        tileflash.flash_attn_func(q, k, v, deterministic=1)


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_nondeterministic_backward_where_routed(dtype, monkeypatch):
    """Where deterministic=False routes to the fused kernel (D = 128, non-causal, 16k), its gradients
    meet the fp32-reference rule; deterministic=True (and torch.use_deterministic_algorithms) take
    the split kernels, whose gradients are the same bits on every run."""
    _debug_defaults(monkeypatch)
    calls = count_calls(monkeypatch, gb, "backward")
    q, k, v = make_qkv(1, 16384, 16384, 2, 1, 128, dtype, "cuda", seed=5)
    do = torch.randn_like(q)

    def grads(**kw):
        calls.clear()
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = tileflash.flash_attn_func(qg, kg, vg, **kw)
        g = torch.autograd.grad(out, (qg, kg, vg), do)
        # (route passes the fused config as the 12th positional argument, the split call none)
        return g, [len(args) > 11 and bool(args[11].get("WITH_DQ")) for args in calls]

    g_nd, fused = grads()
    assert fused == [True], fused
    check_cuda_grads(g_nd, q, k, v, do, False)
    g_d, fused = grads(deterministic=True)
    assert fused == [False], fused
    check_cuda_grads(g_d, q, k, v, do, False)
    g_d2, fused = grads(deterministic=True)  # (a repeated layout may replay its plan: no gb.backward call)
    assert True not in fused and all(torch.equal(a, b) for a, b in zip(g_d, g_d2))
    torch.use_deterministic_algorithms(True)
    try:
        g_d3, fused = grads()
    finally:
        torch.use_deterministic_algorithms(False)
    assert True not in fused and all(torch.equal(a, b) for a, b in zip(g_d, g_d3))
