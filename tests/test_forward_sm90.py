"""The Hopper Gluon forward (tileflash.ops.gluon.forward) and the launch machinery it shares
(tileflash.ops.launch): routing rules on any machine, numerics on an sm90 GPU.

The kernel cannot run in the CPU interpreter, so its numerics tests need a Hopper GPU; every one
of them first asserts that the call really took the Gluon kernel (a counting wrapper), so a
routing change cannot turn them into tests of the Triton kernel. They call the router
(``tileflash.ops.route.forward``), as the public functions do: the Triton launcher
(``tileflash.ops.triton.forward.flash_attn_forward``) runs the Triton kernel only. The routing
tests run anywhere (those of the Gluon module where this triton has Gluon).
"""

import pytest
import torch
import triton

import tileflash
from tileflash.ops import launch as launch_mod
from tileflash.ops import route
from tileflash.ops.triton import forward as fwd_mod
from tileflash.options import DEBUG, Options
from tileflash.reference import attention_ref

from helpers import IS_SM90, _flags, check_cuda_out, count_calls, gluon_modules, make_qkv, rounding_atol

_GLUON = gluon_modules()
g90 = _GLUON[0] if _GLUON else None  # None: this triton has no Gluon (every test that needs it skips)
needs_gluon = pytest.mark.skipif(g90 is None, reason="this triton has no Gluon")
needs_sm90 = pytest.mark.skipif(not (IS_SM90 and g90 is not None), reason="needs a Hopper GPU and triton's Gluon")


@pytest.fixture
def gluon_calls(monkeypatch):
    """Counts launches of the Gluon kernel."""
    return count_calls(monkeypatch, g90, "forward")


@needs_gluon
def test_view_params_cover_both_layouts():
    # (B, S, H, D) memory: heads side by side in a row of H·D elements
    t = torch.empty(2, 256, 4, 64)
    assert g90._view_params(t, 256, 4) == (2 * 256, 4 * 64, 256, 0, 64)
    # SDPA (B, H, S, D) memory seen as (B, S, H, D): every (b, h) is a block of S rows of D
    t = torch.empty(2, 4, 256, 64).transpose(1, 2)
    assert g90._view_params(t, 256, 4) == (2 * 4 * 256, 64, 4 * 256, 256, 0)
    # a head-dim slice of a wider row does not overlap other heads: still a view
    t = torch.empty(2, 256, 4, 128)[..., :64]
    assert g90._view_params(t, 256, 4) == (2 * 256, 4 * 128, 256, 0, 128)
    # rows of a batch that do not start on a row boundary: no 2-D view
    t = torch.as_strided(torch.empty(10_000_000), (2, 256, 4, 64), (256 * 4 * 64 + 32, 4 * 64, 64, 1))
    assert g90._view_params(t, 256, 4) is None


@needs_gluon
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_gluon_kernels_compile_for_sm90(dtype):
    """Every kernel and tile set the dispatcher can pick compiles for sm_90 with the installed
    triton (no GPU needed): Gluon's API moves between triton releases (3.8 renamed the TMA
    copies), and CI runs a newer triton than the H200 machine. Runs tools/compile_check.py
    --gluon in a subprocess, since this test process built the kernels for the interpreter."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = {key: val for key, val in os.environ.items() if key != "TRITON_INTERPRET"}  # compile, not interpret
    env["PYTHONPATH"] = str(root)
    res = subprocess.run([sys.executable, str(root / "tools" / "compile_check.py"), "--gluon", dtype],
                         capture_output=True, text=True, env=env, timeout=600)
    lines = [ln for ln in res.stdout.splitlines() if "gluon" in ln]
    assert res.returncode == 0 and " 0 failure(s)" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert not any(ln.startswith("FAIL") for ln in lines)
    # forward: D 64/128 x causal x N 1k/2k/4k/8k; backward (tileflash.ops.gluon.backward): D 64/128 x causal
    # x (warp-specialized dK/dV, 8-warp dK/dV, fused with dQ, dK/dV with dK waited every block)
    assert len([ln for ln in lines if ln.startswith("ok") and " gluon D=" in ln and "D=256" not in ln]) == 16
    # D = 256 (64-key blocks), causal and not
    assert len([ln for ln in lines if ln.startswith("ok") and " gluon D=256" in ln and "'BLOCK_N': 64" in ln]) == 2
    # D = 64 from 2k (8k causal) runs three consumer warpgroups
    assert len([ln for ln in lines if ln.startswith("ok") and " gluon D=64" in ln and "'CONSUMERS': 3" in ln]) == 4
    # the persistent mode: D = 64 and 128 non-causal at 1k; causal (pairs of Q blocks) D = 64 at 2k-4k,
    # D = 128 at 1k-4k
    assert sorted(" ".join(ln.split(" gluon ")[1].split()[:3]) for ln in lines
                  if ln.startswith("ok") and "'PERSISTENT': True" in ln) == sorted(
        [f"D={d} causal=False N=1024" for d in (64, 128)] + [f"D=64 causal=True N={n}" for n in (2048, 4096)]
        + [f"D=128 causal=True N={n}" for n in (1024, 2048, 4096)]), lines
    # ... plus, at D = 128, the padded head dim's D_OUT = 96 stores: warp-specialized dK/dV, 8-warp fused,
    # warp-specialized fused, x causal
    native = [ln for ln in lines if ln.startswith("ok") and "'D_OUT'" not in ln]
    padded = [ln for ln in lines if ln.startswith("ok") and "'D_OUT': 96" in ln]
    assert len([ln for ln in native if "gluon-bwd D=64" in ln or "gluon-bwd D=128" in ln]) == 16
    ws = [ln for ln in native if "gluon-bwd" in ln and "'WS': True" in ln and "'SPLIT_D'" not in ln
          and "lse-global" not in ln and "gluon-bwd-dq" not in ln and "gluon-bwd-perhead" not in ln]
    # the opt-in dQ schedules (not routed): DQ_ALT at D = 64 with 64- and 128-row Q blocks and at D = 128
    # with 64, DQ_LATE at D 64/128, each causal or not, ordered and unordered
    alt = [ln for ln in native if "gluon-bwd-dqalt" in ln]
    late = [ln for ln in native if "gluon-bwd-dqlate" in ln]
    assert len(alt) == 12 and all("'DQ_ALT': True" in ln and "'WITH_DQ': True" in ln for ln in alt), alt
    assert len(late) == 8 and all("'DQ_LATE': True" in ln and "'WITH_DQ': True" in ln for ln in late), late
    # DQ_MSPLIT (the consumers split dQ's rows) at D = 64 with 128-row Q blocks, causal or not, ordered and
    # unordered
    msplit = [ln for ln in native if "gluon-bwd-dqmsplit" in ln]
    assert len(msplit) == 4 and all("'DQ_MSPLIT': True" in ln and "'BLOCK_M': 128" in ln and " D=64 " in ln
                                    for ln in msplit), msplit
    # the fused kernel's ordered sums in the per-head launch order (opt-in), D 64/128 x causal
    perhead = [ln for ln in native if "gluon-bwd-perhead" in ln]
    assert len(perhead) == 4 and all("'PER_HEAD': True" in ln and "'LSE_EARLY': 0" in ln for ln in perhead), perhead
    assert len([ln for ln in ws if "gluon-bwd-unordered" not in ln]) == 4
    assert all("'LSE_EARLY': 3" in ln for ln in ws)  # the producer stages the LSE/delta rows
    # the opt-in consumer loads of the LSE/delta rows: dK/dV and fused unordered, D 64/128 x causal
    early = [ln for ln in native if "gluon-bwd-lse-global" in ln]
    assert len(early) == 8 and not any("'LSE_EARLY': 3" in ln for ln in early), early
    assert len([ln for ln in early if "'WITH_DQ': True" in ln]) == 4
    # the fused config that deterministic=False routes to (D 64/128, causal and not), unordered sums
    unordered = [ln for ln in native if "gluon-bwd-unordered D=" in ln]
    assert len(unordered) == 4 and all("'WITH_DQ': True" in ln and "'LSE_EARLY': 3" in ln and "'PER_HEAD': True" in ln
                                       for ln in unordered)
    # D = 256: the warp-specialized dK/dV kernel with dK's and dV's columns split between the consumers
    split = [ln for ln in native if "gluon-bwd D=256" in ln]
    assert len(split) == 2 and all("'SPLIT_D': True" in ln for ln in split), split
    assert len([ln for ln in padded if "gluon-bwd D=128" in ln]) == 6
    assert len([ln for ln in padded if "gluon-bwd D=128" in ln and "'WS': True" in ln]) == 4
    # the Gluon dQ kernel: D 64/128 x causal, reading delta and computing it (FUSE_DELTA, the default
    # route), and D = 128 with D_OUT = 96, both ways
    dq_native = [ln for ln in native if "gluon-dq D=64" in ln or "gluon-dq D=128" in ln]
    assert len(dq_native) == 8 and len([ln for ln in dq_native if "'FUSE_DELTA': True" in ln]) == 4
    assert len([ln for ln in native if "gluon-dq D=256" in ln and "'SPLIT_D': True" in ln]) == 2
    # ... and their D_OUT = 192 stores (128 < D < 256 runs at 256 on padded copies), x causal
    wide = [ln for ln in lines if ln.startswith("ok") and "'D_OUT': 192" in ln]
    assert len([ln for ln in wide if "gluon-bwd D=256" in ln]) == 2 and len([ln for ln in wide if "gluon-dq D=256" in ln]) == 2
    assert len([ln for ln in padded if "gluon-dq D=128" in ln]) == 4
    assert len([ln for ln in padded if "gluon-dq D=128" in ln and "'FUSE_DELTA': True" in ln]) == 2
    # the ping-pong kernel runs three partitions: 4 + 4 consumer warps and a producer warp (12 warps)
    assert any("'WS': True" in ln for ln in lines)


@needs_gluon
def test_persistent_rule():
    """The persistent mode (config_for): non-causal calls with at most 1024 keys (D = 128: the
    fifteenth session's sweep; D = 64, keys a multiple of 128: the seventeenth's); causal calls
    whose 128-row Q blocks are even in number, at D = 128 up to 4k rows and keys and at D = 64
    from 2k to below 8k (the seventeenth session's, with pairs of Q blocks per program); nothing
    else. Whatever the lengths, a causal persistent config has 128-row Q blocks, even in number."""
    def persistent(d, causal, sq, sk=None):
        return g90.config_for(d, causal, sq, sk).get("PERSISTENT", False)
    assert [persistent(128, False, n) for n in (128, 512, 1024, 2048, 4096, 16384)] == [True] * 3 + [False] * 3
    assert not persistent(128, False, 1024, 2048) and persistent(128, False, 2048, 1024)  # by the key length
    assert [persistent(128, True, n) for n in (256, 1024, 2048, 4096, 8192, 16384)] == [True] * 4 + [False] * 2
    assert not persistent(128, True, 1152) and not persistent(128, True, 128)  # 9 and 1 Q blocks: no pairs
    assert [persistent(64, True, n) for n in (1024, 2048, 4096, 6144, 8192, 16384)] == \
        [False, True, True, True, False, False]
    assert not persistent(64, True, 2176) and not persistent(64, True, 2048, 2112)  # odd blocks; 64-key multiple
    # D = 64 non-causal: up to 1024 keys, a multiple of the 128-key blocks
    assert [persistent(64, False, n) for n in (128, 512, 1024, 2048, 16384)] == [True] * 3 + [False] * 2
    assert not persistent(64, False, 1024, 2048) and not persistent(64, False, 960)
    # long key ranges (a chunked prefill: Sk >> Sq) keep one program per tile
    assert not persistent(128, True, 1024, 16384) and not persistent(64, True, 2048, 8192)
    assert persistent(128, True, 1024, 4096) and persistent(64, True, 2048, 4096)
    n_paired = 0
    for d in (64, 128):
        for sq in range(64, 20 * 1024 + 1, 64):
            for sk in {sq, sq + 64, sq + 128, 2 * sq, 16384}:
                cfg = g90.config_for(d, True, sq, sk)
                if cfg.get("PERSISTENT"):
                    n_paired += 1
                    assert cfg["BLOCK_M"] == 128 and cfg.get("CONSUMERS", 2) == 2, (d, sq, sk)
                    assert sq % 128 == 0 and sq // 128 % 2 == 0, (d, sq, sk)
    assert n_paired > 50


@needs_gluon
def test_three_consumer_rule():
    """D = 64 takes the three-consumer kernel (192-row Q blocks) from N = 2k, causal from 8k; short
    calls (two consumers, persistent, at 1k non-causal) and D = 128 keep two consumers (the
    thresholds come from the H200 sweeps in config_for)."""
    def consumers(d, causal, n):
        cfg = g90.config_for(d, causal, n)
        return cfg.get("CONSUMERS", 2) if cfg.get("WS") else 0
    assert [consumers(64, False, n) for n in (1024, 2048, 4096, 16384)] == [2, 3, 3, 3]
    assert [consumers(64, True, n) for n in (1024, 4096, 8192, 16384)] == [0, 2, 3, 3]
    assert {consumers(128, c, n) for c in (False, True) for n in (1024, 4096, 16384)} == {2}
    # a key length that is a multiple of 64 but not of 128 keeps the 64-key-block kernel
    assert g90.config_for(64, False, 2048, 2112).get("CONSUMERS") is None
    assert g90.config_for(64, False, 2048, 2048)["CONSUMERS"] == 3
    cfg = g90.config_for(64, False, 4096)
    assert cfg["BLOCK_M"] == 192 and g90.q_block_rows(cfg) == 64
    assert g90.q_block_rows(g90.config_for(128, False, 4096)) == 64
    assert g90.q_block_rows(g90.config_for(64, False, 1152)) == 128  # one-partition kernel: whole block


@pytest.mark.parametrize("num_c", [2, 3])
def test_turn_protocol_model(num_c):
    """tests/ws_turn_model.py replays the warp-specialized forward's barrier protocol (producer,
    NUM_C consumers, K/V ring, round-robin turns) under random schedules with PTX's mbarrier
    parity rule: no schedule deadlocks and the matmuls are always issued in round-robin order.
    Negative control: the first three-consumer version's turn wait (every consumer but 0 on
    pp_bar[1], which hung on the H200) deadlocks or breaks the order in the same model."""
    import ws_turn_model as model

    for stages in (2, 3, 4):
        for n_blocks in (1, 2, 5, 9):
            assert model.explore(num_c, stages, n_blocks, schedules=60) == {"ok": 60}
    if num_c == 3:
        bad = model.explore(3, 2, 9, schedules=60, turn_bug=True)
        assert bad.get("ok", 0) == 0, bad  # every schedule out of turn or stuck
        bad = model.explore(3, 3, 9, schedules=300, turn_bug=True)
        assert bad.get("deadlock", 0) > 0, bad  # and some schedules hang, as on the H200


@pytest.mark.parametrize("num_c", [2, 3])
def test_persistent_protocol_model(num_c):
    """The persistent mode's protocol (tests/ws_turn_model.py with per-tile block counts): ring
    positions and turns running on across tiles, Q slices reloaded after q_empty. No schedule
    deadlocks, turns stay round robin, and no matmul reads a slot or slice holding another block
    or tile. Negative controls, each caught: a producer that reloads Q without waiting for q_empty,
    consumers that restart the ring position or the turn count at every tile."""
    import ws_turn_model as model

    for stages in (2, 3):
        for tiles in ([1, 1, 1], [3, 1, 4, 2], [9, 2, 5], [2]):
            assert model.explore(num_c, stages, tiles, schedules=60) == {"ok": 60}, (stages, tiles)
    bad = model.explore(num_c, 2, [3, 1, 4, 2], schedules=60, bug="q")
    assert bad.get("data", 0) > 0 and bad.get("ok", 0) < 60, bad
    for bug in ("ring", "turns"):
        assert model.explore(num_c, 2, [3, 1, 4, 2], schedules=60, bug=bug).get("ok", 0) == 0, bug


@needs_gluon
def test_routing_rules_on_cpu_tensors():
    q, k, v = (torch.empty(1, 256, 2, 64, dtype=torch.float16) for _ in range(3))
    out, lse = torch.empty_like(q), torch.empty(1, 2, 256)
    # CPU tensors never take the Gluon kernel
    assert not g90.supported(q, k, v, out, lse, 0.125, False, 0, _flags(), False, None)


def _cpu_plan(monkeypatch, b=2, sq=256, sk=256, h=4, hk=2, d=64, causal=False):
    """A plan built from CPU tensors, with the device checks of _layout_config bypassed (only the
    host logic is under test: CPU tensors never take the Gluon kernel)."""
    cfg = g90.config_for(d, causal, sq, sk)
    monkeypatch.setattr(g90, "_layout_config", lambda *a: cfg)
    monkeypatch.setattr(g90, "_PLANS", {})
    q, k, v = (torch.empty(b, s, n, d, dtype=torch.float16) for s, n in ((sq, h), (sk, hk), (sk, hk)))
    return q, k, v, torch.empty_like(q), torch.empty(b, h, sq)


@needs_gluon
@pytest.mark.parametrize("d,causal,sq", [(64, False, 1024), (64, False, 4096), (64, True, 1024), (128, True, 2048),
                                         (128, False, 896), (64, False, 896), (256, True, 1024)])
def test_plan_matches_the_kernel_signature(monkeypatch, d, causal, sq):
    """The cached launch plan (host time, perf-notes §24) feeds the compiled kernel's launcher
    positionally: its runtime arguments must be exactly the kernel's non-constexpr parameters, in
    order, and its tail the constexpr ones with the values the JIT call passes. Its descriptors,
    rebased on a call's tensors, must equal freshly validated ones."""
    sk = sq + 128  # Sq != Sk, so that a swap of the two lengths shows
    q, k, v, out, lse = _cpu_plan(monkeypatch, sq=sq, sk=sk, d=d, causal=causal)
    plan = g90.plan_for(q, k, v, out, lse, 0.125, causal, sk - sq, _flags(HAS_RIGHT=causal), False, None)
    cfg = g90.config_for(d, causal, sq, sk)
    assert plan is not None and plan.cfg == cfg
    # the persistent plans: D = 128 causal (pairs of Q blocks), D = 128 and D = 64 non-causal (Sk = 1024)
    assert cfg.get("PERSISTENT", False) == ((d, causal, sq) in ((128, True, 2048), (128, False, 896), (64, False, 896)))
    params = plan.kernel.params
    n_runtime = 5 + len(plan.ints) + 1
    assert [p.is_constexpr for p in params] == [False] * n_runtime + [True] * len(plan.tail)
    # the integer arguments by name (a swap of two of them would pass the count check above)
    ints = dict(zip([p.name for p in params[5:5 + len(plan.ints)]], plan.ints))
    want = dict(stride_lb=lse.stride(0), stride_lh=lse.stride(1), nheads=4, kv_group=2, seqlen_q=sq, seqlen_k=sk)
    if cfg.get("WS"):
        want["batch_heads"] = 2 * 4
    assert {n: ints[n] for n in want} == want and params[n_runtime - 1].name == "qk_scale"
    tail = dict(zip([p.name for p in params[n_runtime:]], plan.tail))
    assert {n: tail[n] for n in ("HEAD_DIM", "BLOCK_M", "BLOCK_N", "STAGES", "CAUSAL")} == \
        dict(HEAD_DIM=d, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], STAGES=cfg["STAGES"], CAUSAL=causal)
    if cfg.get("WS"):
        assert tail["NUM_C"] == cfg.get("CONSUMERS", 2) and tail["PERSISTENT"] == cfg.get("PERSISTENT", False)
    # a persistent plan launches at most one program per SM (one on CPU tensors), on a 1-D grid
    n_tiles = -(-sq // cfg["BLOCK_M"]) * 2 * 4
    assert plan.grid == ((1, 1, 1) if cfg.get("PERSISTENT") else (n_tiles // (2 * 4), 2 * 4, 1))
    rows = g90.q_block_rows(plan.cfg)
    fresh = [g90._desc(t, t.shape[1], t.shape[2], r)[0]
             for t, r in ((q, rows), (k, plan.cfg["BLOCK_N"]), (v, plan.cfg["BLOCK_N"]), (out, rows))]
    for got, want, t in zip(plan.descriptors(q, k, v, out), fresh, (q, k, v, out)):
        assert type(got) is type(want) and got.base is t and want.base is t
        assert {n: x for n, x in vars(got).items() if n != "base"} == \
            {n: x for n, x in vars(want).items() if n != "base"}
    assert all(t.base is None for t in plan.templates)  # a cached plan holds no tensor
    assert len(plan.grid) == 3  # CompiledKernel[grid] indexes all three


@needs_gluon
def test_causal_persistent_plan_grid_and_odd_blocks(monkeypatch):
    """A causal persistent plan launches one program per pair of Q blocks, at most one per SM;
    an odd number of Q blocks is refused with a ValueError before anything is launched."""
    monkeypatch.setattr(g90, "sm_count", lambda device: 132)
    cfg = dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, num_warps=4, WS=True, PERSISTENT=True)
    for b, h, sq, programs in ((2, 4, 1024, 2 * 4 * 8 // 2), (16, 16, 1024, 132)):
        q, k, v = (torch.empty(b, sq, h, 128, dtype=torch.float16) for _ in range(3))
        plan = g90._Plan(q, k, v, torch.empty_like(q), torch.empty(b, h, sq), True, cfg)
        assert plan.grid == (programs, 1, 1)
        plan = g90._Plan(q, k, v, torch.empty_like(q), torch.empty(b, h, sq), False, cfg)  # non-causal: tiles
        assert plan.grid == (min(b * h * sq // 128, 132), 1, 1)
    q, k, v = (torch.empty(2, 384, 4, 128, dtype=torch.float16) for _ in range(3))  # 3 Q blocks
    with pytest.raises(ValueError, match="even number of Q blocks, got 3"):
        g90._Plan(q, k, v, torch.empty_like(q), torch.empty(2, 4, 384), True, cfg)


@needs_gluon
def test_plan_cache_keys_and_per_call_checks(monkeypatch):
    """One plan per layout; what is not in the key (scale, flags, causal alignment, pointer
    alignment) is checked on every call."""
    q, k, v, out, lse = _cpu_plan(monkeypatch)

    def plan(q=q, k=k, v=v, out=out, lse=lse, scale=0.125, causal=False, shift=0, flags=None):
        return g90.plan_for(q, k, v, out, lse, scale, causal, shift, flags or _flags(HAS_RIGHT=causal), False, None)

    first = plan()
    assert first is not None and plan() is first and len(g90._PLANS) == 1
    q2 = torch.empty_like(q)
    assert plan(q=q2) is first                                   # same layout, other memory: same plan
    qt = torch.empty(2, 4, 256, 64, dtype=torch.float16).transpose(1, 2)  # (B, H, S, D) memory
    assert plan(q=qt, out=torch.empty_like(qt)) not in (None, first) and len(g90._PLANS) == 2
    assert plan(causal=True) is not first                        # causal is in the key
    assert plan(scale=-0.1) is None and plan(scale=float("nan")) is None
    assert plan(flags=_flags(HAS_SOFTCAP=True)) is None and plan(flags=_flags(HAS_RIGHT=True)) is None
    assert plan(causal=True, shift=5) is None                    # top-left alignment with Sq != Sk
    buf = torch.empty(q.numel() + 8, dtype=torch.float16)
    assert plan(q=buf[1:q.numel() + 1].view(q.shape)) is None    # 2-byte aligned base
    assert plan(q=buf[8:].view(q.shape)) is first                # 16-byte aligned base
    g90._PLANS.update({i: None for i in range(g90._PLANS_MAX)})
    assert plan() is first and len(g90._PLANS) > g90._PLANS_MAX  # a hit changes nothing
    k2 = torch.empty(2, 512, 2, 64, dtype=torch.float16)
    assert plan(k=k2, v=torch.empty_like(k2)) is not None and len(g90._PLANS) == 1  # a miss in a full cache


def test_launch_passes_scales_as_floats_and_keeps_the_launcher_per_device(monkeypatch):
    """``launch.Launch`` (the cached launch of every Gluon kernel and of the backward's delta kernel)
    hands the scales to triton as floats: triton would specialize an integer 1 into a constexpr,
    which the cached launcher then skips. It keeps the compiled launcher with the CUDA device it
    was made on, and uses it only on that device and only for cacheable calls. A fake kernel
    stands in for triton's (no GPU needed)."""
    calls = []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *args: calls.append(("runner", grid, args))

    class Kernel:
        def __getitem__(self, grid):
            def jit(*args, **constexprs):
                calls.append(("jit", grid, args))
                return Compiled()
            return jit

    device = [0]
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device[0])
    # (a launch with a runner reads torch's getter directly; absent from CPU builds of torch)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: device[0], raising=False)
    launch = launch_mod.Launch(Kernel(), (3, 2), (), 1, (7, 8), 2, {})
    ptr = torch.empty(1)
    launch((), (ptr,), (1, 2), True)
    assert calls[-1][0] == "jit" and calls[-1][1] == (3, 2, 1)
    assert [type(x) for x in calls[-1][2][3:]] == [float, float] and calls[-1][2][1:3] == (7, 8)
    launch((), (ptr,), (0.5, 3), True)
    assert calls[-1][0] == "runner" and [type(x) for x in calls[-1][2][3:]] == [float, float]
    launch((), (ptr,), (0.5, 3), False)                    # not cacheable (e.g. an unaligned pointer): the JIT
    assert calls[-1][0] == "jit" and launch.runner[0] == 0
    device[0] = 1                                          # another current device: the JIT, then its launcher
    launch((), (ptr,), (0.5, 3), True)
    assert calls[-1][0] == "jit" and launch.runner[0] == 1
    launch((), (ptr,), (0.5, 3), True)
    assert calls[-1][0] == "runner"


def test_launch_places_descriptors_at_their_slots(monkeypatch):
    """A kernel whose descriptors are not all first (the fused backward's dQ descriptor is its
    ninth parameter): ``Launch(slots=...)`` and ``DescRunner`` put each descriptor, or its expanded
    map, shape and strides, at its own position among the other arguments, on every path (the
    JIT's first launch, the cached C launcher, triton's runner under a launch hook), and a
    launcher whose descriptor positions are other than the slots is declined. Stand-ins for
    triton 3.6's launcher, as in the test below; no GPU needed."""
    from triton.backends.nvidia import driver as nv

    assert launch_mod.interleave((0, 1, 4), "ABC", ("p", "q", "r", "s")) == ("A", "B", "p", "q", "C", "r", "s")
    assert launch_mod.interleave((1,), [(7, 8)], ("p", "q"), True) == ("p", 7, 8, "q")
    assert launch_mod.interleave(None, "AB", ("p",)) == ("A", "B", "p")
    with pytest.raises(ValueError, match="must ascend"):
        launch_mod.Launch(object(), (1,), (type("T", (), {})(), type("T", (), {})()), 1, (), 0, {}, slots=(2, 1))

    monkeypatch.setattr(nv, "make_tensordesc_arg", lambda desc, meta: [("map", desc.base.data_ptr(), meta), 64],
                        raising=False)
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO", raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    raw, slow, jit = [], [], []

    def compiled(indices):
        launcher = type("Launcher", (), dict(global_scratch_size=0, profile_scratch_size=0, num_ctas=1,
                                             launch_cooperative_grid=False, launch_pdl=False))()

        def wrapper(launcher, tensordesc_indices, tensordesc_meta):
            def inner(*args):
                return launcher, tensordesc_indices, tensordesc_meta
            return inner
        launcher.launch = wrapper(lambda *a: raw.append(a), set(indices), ["m0", "m1"])
        comp = type("Compiled", (), dict(run=launcher, function=99, packed_metadata="pm"))()
        comp.__class__.__getitem__ = lambda self, grid: (lambda *a: slow.append(a))
        return comp

    assert launch_mod.DescRunner.make(compiled((0, 3)), None, (1, 1, 1), 2, (0, 2)) is None  # other positions
    assert launch_mod.DescRunner.make(compiled((0, 3)), None, (1, 1, 1), 2) is None          # not the first two

    class Kernel:  # the JIT: kernel[grid](*args, **constexprs) compiles and returns the compiled kernel
        params = ()

        def __getitem__(self, grid):
            return lambda *args, **kw: jit.append(args) or compiled((0, 3))

    desc = type("Desc", (), {})
    templates = [desc(), desc()]
    t0, t1 = torch.empty(8), torch.empty(8)
    launch = launch_mod.Launch(Kernel(), (2,), templates, 2, (5,), 1, {}, slots=(0, 3))
    launch((t0, t1), ("p", "q"), (0.5,), True)                  # the JIT: descriptors at 0 and 3
    (args,) = jit
    assert [a.base for a in args[:1]] == [t0] and args[1:3] == ("p", "q") and args[3].base is t1
    assert args[4:] == (5, 0.5)
    assert isinstance(launch.runner[1], launch_mod.DescRunner)
    launch((t1, t0), ("p", "q"), (0.25,), True)                 # the C launcher: maps at their places
    assert raw[-1][13:] == (("map", t1.data_ptr(), "m0"), 64, "p", "q", ("map", t0.data_ptr(), "m1"), 64, 5, 0.25)
    launch.runner[1](*jit[0])                                   # triton's argument order, as given
    assert raw[-1][13:] == (("map", t0.data_ptr(), "m0"), 64, "p", "q", ("map", t1.data_ptr(), "m1"), 64, 5, 0.5)
    hook = lambda *a: None  # noqa: E731
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        launch((t0, t1), ("p", "q"), (0.25,), True)             # a hook: triton's runner, descriptors placed
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert slow[-1][0].base is t0 and slow[-1][1:3] == ("p", "q") and slow[-1][3].base is t1
    assert slow[-1][4:] == (5, 0.25) and len(jit) == 1
    assert all(t.base is None for t in templates), "the templates must stay unbound"


def test_desc_runner_encodes_once_per_slot_and_address_and_passes_triton_args(monkeypatch):
    """``launch.DescRunner`` against a stand-in for triton 3.6's launcher (the structure it reads: the
    wrapper closing over ``launcher``, ``tensordesc_indices`` and ``tensordesc_meta``; the GPU
    test checks the real one). It must hand the C launcher exactly triton's argument list (grid,
    stream, function, the launch flags, no scratch, the packed metadata, no hooks, then each
    descriptor expanded into its map, shape and strides, then the other arguments), encode a
    descriptor once per (slot, address), empty a slot when full, hand launches to triton's
    runner when a launch hook is set or it is switched off (the debug switch desc_cache=0), and
    decline launchers of another structure. No GPU needed."""
    from triton.backends.nvidia import driver as nv

    encodes = []

    def encode(desc, meta):
        encodes.append((desc.base.data_ptr(), meta))
        return [("map", desc.base.data_ptr(), meta), 64, 128]

    monkeypatch.setattr(nv, "make_tensordesc_arg", encode, raising=False)
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO", raising=False)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda device: 1234, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    raw = []

    def wrapper(launcher, tensordesc_indices, tensordesc_meta):
        def inner(*args):
            return launcher, tensordesc_indices, tensordesc_meta
        return inner

    def wrapper_with_more(launcher, tensordesc_indices, tensordesc_meta, extra):
        def inner(*args):
            return launcher, tensordesc_indices, tensordesc_meta, extra
        return inner

    def compiled(indices=(0, 1), metas=("m0", "m1"), scratch=0, more=False):
        launcher = type("Launcher", (), dict(global_scratch_size=scratch, profile_scratch_size=0, num_ctas=1,
                                             launch_cooperative_grid=False, launch_pdl=True))()
        launcher.launch = (wrapper_with_more(lambda *a: raw.append(a), set(indices), list(metas), 1) if more
                           else wrapper(lambda *a: raw.append(a), set(indices), list(metas)))
        return type("Compiled", (), dict(run=launcher, function=99, packed_metadata="pm"))()

    slow = []
    runner = launch_mod.DescRunner.make(compiled(), lambda *a: slow.append(a), (3, 2, 1), 2)
    assert isinstance(runner, launch_mod.DescRunner)
    t0, t1, t2 = (torch.empty(8) for _ in range(3))
    desc = type("Desc", (), {})

    def d(t):
        x = desc()
        x.base = t
        return x

    runner(d(t0), d(t1), "lse", 7, 0.5, "CONSTEXPR")
    assert raw[-1] == (3, 2, 1, 1234, 99, False, True, None, None, "pm", None, None, None,
                       ("map", t0.data_ptr(), "m0"), 64, 128, ("map", t1.data_ptr(), "m1"), 64, 128,
                       "lse", 7, 0.5, "CONSTEXPR")
    runner(d(t0), d(t1), "lse", 7, 0.5, "CONSTEXPR")
    assert len(encodes) == 2 and len(raw) == 2                  # known addresses: no encode
    templates = (d(None), d(None))                                # Launch's way: tensors, no descriptors
    runner.call_tensors(templates, (t0, t1), ("lse", 7, 0.5, "CONSTEXPR"))
    assert raw[-1] == raw[0] and len(encodes) == 2
    assert templates[0].base is None and templates[1].base is None, "the templates must stay unbound"
    runner(d(t2), d(t1), "lse", 7, 0.5, "CONSTEXPR")
    assert encodes[-1] == (t2.data_ptr(), "m0") and len(encodes) == 3
    assert raw[-1][13] == ("map", t2.data_ptr(), "m0")
    runner(d(t1), d(t0), "lse", 7, 0.5, "CONSTEXPR")             # the slot is part of the key
    assert encodes[-2:] == [(t1.data_ptr(), "m0"), (t0.data_ptr(), "m1")]
    assert raw[-1][13] == ("map", t1.data_ptr(), "m0") and raw[-1][16] == ("map", t0.data_ptr(), "m1")
    monkeypatch.setattr(launch_mod.DescRunner, "MAX_PER_SLOT", 3)
    runner(d(torch.empty(8)), d(t0), "lse", 7, 0.5, "CONSTEXPR")  # slot 0 held 3 addresses: emptied
    assert len(runner.maps[0]) == 1 and len(runner.maps[1]) == 2
    n_raw = len(raw)
    hook = lambda *a: None  # noqa: E731
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        runner(d(t0), d(t1), "lse", 7, 0.5, "CONSTEXPR")
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert len(raw) == n_raw and slow[-1][2:] == ("lse", 7, 0.5, "CONSTEXPR")
    monkeypatch.setattr(DEBUG, "desc_cache", False)
    n_encodes = len(encodes)
    runner(d(t0), d(t1), "lse", 7, 0.5, "CONSTEXPR")
    assert len(raw) == n_raw and len(slow) == 2
    runner.call_tensors(templates, (t2, t0), ("lse", 7, 0.5, "CONSTEXPR"))
    assert len(raw) == n_raw and [x.base for x in slow[-1][:2]] == [t2, t0] and slow[-1][2:] == ("lse", 7, 0.5, "CONSTEXPR")
    # launchers it was not written for: it declines, and the caller keeps triton's runner
    assert launch_mod.DescRunner.make(compiled(indices=(0, 2)), None, (1, 1, 1), 2) is None
    assert launch_mod.DescRunner.make(compiled(metas=("m0", None)), None, (1, 1, 1), 2) is None
    assert launch_mod.DescRunner.make(compiled(scratch=128), None, (1, 1, 1), 2) is None
    assert launch_mod.DescRunner.make(compiled(), None, (1, 1, 1), 0) is None      # no descriptors, a wrapper
    # no descriptors and triton's C launcher itself (no Python wrapper): the same arguments, no maps
    plain = compiled()
    plain.run.launch = type("CLauncher", (), dict(__call__=lambda self, *a: raw.append(a)))()
    runner0 = launch_mod.DescRunner.make(plain, lambda *a: slow.append(a), (4, 1, 1), 0)
    assert isinstance(runner0, launch_mod.DescRunner)
    monkeypatch.setattr(DEBUG, "desc_cache", True)
    runner0.call_tensors((), (), ("ptr", 5, 0.25, "CONSTEXPR"))
    assert raw[-1] == (4, 1, 1, 1234, 99, False, True, None, None, "pm", None, None, None, "ptr", 5, 0.25, "CONSTEXPR")
    runner0("ptr", 6, 0.25, "CONSTEXPR")
    assert raw[-1][13:] == ("ptr", 6, 0.25, "CONSTEXPR") and len(encodes) == n_encodes
    assert launch_mod.DescRunner.make(object(), None, (1, 1, 1), 2) is None
    assert launch_mod.DescRunner.make(compiled(more=True), None, (1, 1, 1), 2) is None   # a wrapper that does more
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOOO")                   # another C launcher
    assert launch_mod.DescRunner.make(compiled(), None, (1, 1, 1), 2) is None
    monkeypatch.setattr(nv, "_BASE_ARGS_FORMAT", "iiiKKppOOOOOO")
    assert launch_mod.DescRunner.make(compiled(), None, (1, 1, 1), 2) is not None
    monkeypatch.setattr(nv, "make_tensordesc_arg", lambda arg, metadata, extra: None)
    assert launch_mod.DescRunner.make(compiled(), None, (1, 1, 1), 2) is None


@needs_sm90
def test_repeated_calls_take_the_cached_launcher(gluon_calls):
    """The second call of a layout launches through the plan's cached launcher (no JIT binding);
    its results are bitwise those of the first call (JIT path) and right against the reference,
    on fresh NaN-poisoned buffers. An LSE whose pointer is not 16-byte aligned (the JIT specialized
    on it) goes through the JIT again."""
    for d, causal, n in ((64, True, 1024), (64, False, 2048), (128, False, 1024)):
        q, k, v = make_qkv(2, n, n, 4, 2, d, torch.bfloat16, "cuda", seed=n + d)
        results, runs = [], []
        for lse_offset in (0, 0, 1):
            out = torch.full_like(q, float("nan"))
            buf = torch.full((2 * 4 * n + lse_offset,), float("nan"), device="cuda")
            lse = buf[lse_offset:].view(2, 4, n)
            plan = g90.plan_for(q, k, v, out, lse, d ** -0.5, causal, 0, _flags(HAS_RIGHT=causal), False, None)
            assert plan is not None
            if results:
                assert plan.runner is not None, "the first launch should have kept the compiled launcher"
                device, real = plan.runner
                plan.runner = (device, lambda *a, real=real: (runs.append(lse_offset), real(*a)))
            route.forward(q, k, v, d ** -0.5, causal, out=out, lse=lse)
            check_cuda_out(out, lse, q, k, v, causal)
            results.append((out, lse))
        assert runs == [0], runs  # the aligned repeat took the launcher, the misaligned LSE the JIT
        for out, lse in results[1:]:
            assert torch.equal(out, results[0][0]) and torch.equal(lse, results[0][1])
    assert len(gluon_calls) == 9


@needs_sm90
def test_descriptor_runner_encodes_each_address_once_and_stays_right():
    """On triton 3.6 the cached launcher is a ``launch.DescRunner``: each TMA descriptor is encoded once
    per base address. Calls of one layout on several tensors (fresh NaN-poisoned outputs, reused
    addresses, then new ones) must each be right against the reference and bitwise equal to
    triton's own runner (with a launch hook set, which makes the runner hand the launch to
    triton's); the encoder must run once per new (slot, address), never for a known one."""
    if not triton.__version__.startswith("3.6"):
        pytest.skip(f"_DescRunner was written against triton 3.6's launcher (installed: {triton.__version__})")
    if not DEBUG.desc_cache:
        pytest.skip("the debug switch desc_cache=0 (TILEFLASH_DEBUG) turns the descriptor runner off")
    d, causal, n = 128, True, 1024
    sets = [make_qkv(2, n, n, 4, 2, d, torch.bfloat16, "cuda", seed=s) for s in range(3)]

    def call(qkv):
        q, k, v = qkv
        out = torch.full_like(q, float("nan"))
        lse = torch.full((2, 4, n), float("nan"), device="cuda")
        route.forward(q, k, v, d ** -0.5, causal, out=out, lse=lse)
        return out, lse

    call(sets[0])  # the JIT, which keeps the launcher
    plan = g90.plan_for(*sets[0], torch.empty_like(sets[0][0]), torch.empty(2, 4, n, device="cuda"), d ** -0.5,
                        causal, 0, _flags(HAS_RIGHT=causal), False, None)
    runner = plan.runner[1]
    assert isinstance(runner, launch_mod.DescRunner), type(runner)
    encodes = []
    real = runner.encode
    runner.encode = lambda desc, meta: (encodes.append(desc.base.data_ptr()), real(desc, meta))[1]
    for m in runner.maps:
        m.clear()
    fast = []
    for qkv in (sets[0], sets[1], sets[0], sets[2], sets[1]):
        out, lse = call(qkv)
        check_cuda_out(out, lse, *qkv, causal)
        fast.append((out, lse))
    # q, k, v and out: one encode per slot and address; the outputs are fresh each call
    want_qkv = {t.data_ptr() for s_ in sets for t in s_}
    assert want_qkv <= set(encodes), "every input address should have been encoded"
    assert sum(1 for p_ in encodes if p_ in want_qkv) == 9, encodes  # 3 sets x (q, k, v), once each
    hook_calls = []
    hook = lambda *a: hook_calls.append(1)  # noqa: E731
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        slow = [call(qkv) for qkv in (sets[0], sets[1], sets[0], sets[2], sets[1])]
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert len(hook_calls) == 5, "with a hook set, the launch should go through triton's runner"
    for (o1, l1), (o2, l2) in zip(fast, slow):
        assert torch.equal(o1, o2) and torch.equal(l1, l2)


@needs_sm90
def test_routing_rules_on_gpu():
    def ok(sq=256, sk=256, d=128, dtype=torch.float16, causal=False, scale=0.1, flags=None, config=None,
           shift=None):
        q, k, v = make_qkv(1, sq, sk, 2, 2, d, dtype, "cuda")
        out, lse = torch.empty_like(q), torch.empty(1, 2, sq, device="cuda")
        flags = flags or _flags(HAS_RIGHT=causal)
        shift = sk - sq if shift is None else shift
        return g90.supported(q, k, v, out, lse, scale, causal, shift, flags, False, config)

    assert ok() and ok(d=64) and ok(causal=True, sk=384) and ok(dtype=torch.bfloat16)
    assert not ok(sq=200)                       # not a whole number of 128-row blocks
    assert ok(sq=2240, sk=2304, d=64)           # three consumers: a whole number of 64-row slices
    assert not ok(sq=2272, sk=2304, d=64)       # ... but not of 64-row slices
    assert ok(sq=2048, sk=2112, d=64)           # Sk not a multiple of 128: the 64-key-block kernel
    assert not ok(sk=200)
    assert not ok(d=96) and not ok(d=192)
    assert ok(d=256) and ok(d=256, causal=True, sk=320)  # D = 256: 64-key blocks
    assert not ok(d=256, sk=288)                         # ... so Sk is a multiple of 64
    assert not ok(causal=True, sq=384, sk=256)  # rows with no visible key: the Triton kernel
    assert not ok(causal=True, shift=0, sk=384)  # top-left causal alignment
    assert not ok(scale=-0.1)
    assert not ok(flags=_flags(HAS_SOFTCAP=True)) and not ok(flags=_flags(HAS_LEFT=True))
    assert not ok(flags=_flags(HAS_RIGHT=True))  # a right window that is not causal
    assert not ok(config=dict(BLOCK_M=64, BLOCK_N=64))
    assert not ok(scale=float("nan"))
    # inputs the public API rejects but a direct caller could pass: the Triton kernel's checks apply
    q, k, v = make_qkv(1, 256, 256, 4, 2, 128, torch.float16, "cuda")
    lse = torch.empty(1, 4, 256, device="cuda")
    assert g90.supported(q, k, v, torch.empty_like(q), lse, 0.1, False, 0, _flags(), False, None)
    assert not g90.supported(q, k, v, torch.empty_like(q, dtype=torch.float32), lse, 0.1, False, 0, _flags(), False,
                             None)
    assert not g90.supported(q, k[..., :64], v[..., :64], torch.empty_like(q), lse, 0.1, False, 0, _flags(), False,
                             None)
    q3 = torch.randn(1, 256, 3, 128, device="cuda", dtype=torch.float16)  # 3 query heads on 2 kv heads
    assert not g90.supported(q3, k, v, torch.empty_like(q3), torch.empty(1, 3, 256, device="cuda"), 0.1, False, 0,
                             _flags(), False, None)


CASES = [  # (batch, seqlen_q, seqlen_k, nheads, nheads_k)
    (2, 256, 384, 4, 2),     # GQA, Sq < Sk
    (1, 1024, 1024, 8, 8),
    (2, 128, 512, 3, 1),     # MQA, one Q block
    (1, 2048, 2048, 2, 1),
]


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gluon_forward_matches_reference(case, d, causal, dtype, layout, gluon_calls):
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, dtype, "cuda", seed=sq + d + hk)
    if layout == "bhsd":  # the SDPA memory layout, seen through a transpose: no copy
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        out = torch.full((b, h, sq, d), float("nan"), dtype=dtype, device="cuda").transpose(1, 2)
    else:
        out = torch.full((b, sq, h, d), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((b, h, sq), float("nan"), device="cuda")
    route.forward(q, k, v, d ** -0.5, causal, out=out, lse=lse)
    assert len(gluon_calls) == 1, "the call did not take the Gluon kernel"
    check_cuda_out(out, lse, q, k, v, causal)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [72, 96, 160, 192])
@pytest.mark.parametrize("case", CASES[:3], ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_gluon_forward_padded_head_dims(case, d, causal, layout, gluon_calls, monkeypatch):
    """A head dim between the Gluon widths (64 < D < 128, 128 < D < 256) runs the Gluon forward at
    the padded width on zero-padded copies and copies the output's first D columns back: into
    NaN-poisoned out and LSE (the bhsd case a strided view), every element is written and meets
    flash-attn's rule; with Options(pad_head_dim=False) the Triton kernel runs and agrees to rounding."""
    b, sq, sk, h, hk = case
    q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.bfloat16, "cuda", seed=sq + d)
    if layout == "bhsd":
        out = torch.full((b, h, sq, d), float("nan"), dtype=q.dtype, device="cuda").transpose(1, 2)
    else:
        out = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, sq), float("nan"), device="cuda")
    route.forward(q, k, v, d ** -0.5, causal, out=out, lse=lse)
    assert [c[0].shape[-1] for c in gluon_calls] == [g90.padded_head_dim(d)], "the padded Gluon forward did not run"
    check_cuda_out(out, lse, q, k, v, causal)
    ref_out, ref_lse = route.forward(q, k, v, d ** -0.5, causal, options=Options(pad_head_dim=False))
    assert len(gluon_calls) == 1  # the Triton kernel this time
    assert (out.float() - ref_out.float()).abs().max().item() <= 2e-2 * ref_out.float().abs().max().item()
    assert (lse - ref_lse).abs().max().item() <= 1e-3


def test_pad_switch():
    """Options(pad_head_dim=False) turns the padded Gluon forward off; it is on by default, survives
    the custom ops' string form, and takes bools only."""
    assert Options().pad_head_dim and not Options(pad_head_dim=False).pad_head_dim
    assert not Options.decode(Options(pad_head_dim=False).encode()).pad_head_dim
    assert Options.decode(Options().encode()).pad_head_dim
    with pytest.raises(ValueError, match="pad_head_dim must be a bool"):
        Options(pad_head_dim=0)


@needs_sm90
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gluon_forward_agrees_with_triton_kernel(causal, gluon_calls):
    """The two kernels compute the same sums in a different order: they agree to rounding."""
    q, k, v = make_qkv(2, 1024, 1536, 4, 2, 128, torch.bfloat16, "cuda", seed=11)
    out_g, lse_g = route.forward(q, k, v, 0.0883, causal)
    assert len(gluon_calls) == 1
    out_t, lse_t = route.forward(q, k, v, 0.0883, causal, config=fwd_mod.default_config(128, causal, tma=True))
    assert len(gluon_calls) == 1, "a pinned config must keep the Triton kernel"
    assert (out_g.float() - out_t.float()).abs().max().item() <= 2e-2
    assert (lse_g - lse_t).abs().max().item() <= 1e-4


@needs_sm90
def test_gluon_forward_under_autograd_and_public_api(gluon_calls):
    """flash_attn_func and SDPA route the forward of a training step through it; the gradients
    (Triton backward from its LSE) match fp32 autograd to the usual tolerance."""
    q, k, v = make_qkv(2, 512, 512, 4, 4, 64, torch.float16, "cuda", seed=5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = tileflash.flash_attn_func(q, k, v, causal=True)
    assert len(gluon_calls) == 1
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref, _ = attention_ref(qf, kf, vf, causal=True, upcast=True)
    ref_grads = torch.autograd.grad(ref, (qf, kf, vf), do.float())
    qh, kh, vh = (t.detach().requires_grad_() for t in (q, k, v))
    eager, _ = attention_ref(qh, kh, vh, causal=True, upcast=False)
    eager_grads = torch.autograd.grad(eager, (qh, kh, vh), do)
    for g, r, e in zip(grads, ref_grads, eager_grads):
        err = (g.float() - r).abs().max().item()
        assert err <= 2 * (e.float() - r).abs().max().item() + 1e-3


@needs_sm90
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("case", [(2, 2240, 2304, 3, 1, False), (1, 8320, 8320, 2, 1, True),
                                  (1, 2112, 2304, 2, 2, False), (2, 8192, 8448, 2, 1, True)],
                         ids=lambda c: "x".join(map(str, c)))
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_three_consumer_kernel_through_public_route(case, dtype, layout, gluon_calls):
    """The three-consumer kernel as the public call routes to it (D = 64), against the fp32
    reference with NaN-poisoned outputs. Lengths of 35 and 130 slices of 64 leave the last
    192-row Q block one or two slices past the end: those slices load rows of the next (b, h)
    (or TMA zeros) and must store nothing, or the next batch's rows and LSE would be clobbered."""
    b, sq, sk, h, hk, causal = case
    assert g90.config_for(64, causal, sq).get("CONSUMERS") == 3
    q, k, v = make_qkv(b, sq, sk, h, hk, 64, dtype, "cuda", seed=sq + hk)
    if layout == "bhsd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
        out = torch.full((b, h, sq, 64), float("nan"), dtype=dtype, device="cuda").transpose(1, 2)
    else:
        out = torch.full((b, sq, h, 64), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((b, h, sq), float("nan"), device="cuda")
    route.forward(q, k, v, 0.125, causal, out=out, lse=lse)
    assert len(gluon_calls) == 1, "the call did not take the Gluon kernel"
    check_cuda_out(out, lse, q, k, v, causal)


@needs_sm90
@pytest.mark.parametrize("cfg", [
    dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, num_warps=8, LOOKAHEAD=True),
    dict(BLOCK_M=128, BLOCK_N=64, STAGES=4, num_warps=8, LOOKAHEAD=True),
    dict(BLOCK_M=64, BLOCK_N=64, STAGES=3, num_warps=4, LOOKAHEAD=False),
    dict(BLOCK_M=64, BLOCK_N=64, STAGES=2, num_warps=4, LOOKAHEAD=False),
    dict(BLOCK_M=128, BLOCK_N=64, STAGES=3, num_warps=8, LOOKAHEAD=False),
    dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, num_warps=4, WS=True),
    dict(BLOCK_M=128, BLOCK_N=64, STAGES=4, num_warps=4, WS=True),
    dict(BLOCK_M=192, BLOCK_N=128, STAGES=2, num_warps=4, WS=True, CONSUMERS=3, CONSUMER_REGS=160),
    dict(BLOCK_M=192, BLOCK_N=64, STAGES=4, num_warps=4, WS=True, CONSUMERS=3, CONSUMER_REGS=160),
    dict(BLOCK_M=128, BLOCK_N=128, STAGES=2, num_warps=4, WS=True, PERSISTENT=True),
    dict(BLOCK_M=192, BLOCK_N=128, STAGES=2, num_warps=4, WS=True, CONSUMERS=3, CONSUMER_REGS=160, PERSISTENT=True),
], ids=["la-128-128", "la-128-64", "64-64", "64-64-2", "128-64", "ws-128-128", "ws-128-64", "c3-192-128", "c3-192-64",
        "ws-128-128-persistent", "c3-192-128-persistent"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_schedules_and_tiles(cfg, d, causal):
    """Every schedule and tile shape that gluon_check.py sweeps, against the fp32 reference (a ring
    of 2-4 slots over 3-16 key blocks exercises each slot's barrier phase more than once). The
    persistent mode also gets 3-5x more tiles than the H200's 132 SMs, so that its programs run
    several tiles each (ring positions, turns and Q reloads carried across tiles). Causal and
    persistent, programs take pairs of Q blocks (n_m - 1 - j, j) of one head: that needs an even
    number of Q blocks, and an odd one is refused with a ValueError, before any launch."""
    shapes = [(2, 256, 1024, 4, 2), (1, 128, 192 if cfg["BLOCK_N"] == 64 else 256, 2, 2)]
    if cfg.get("PERSISTENT"):
        shapes += [(4, 2048, 2048, 8, 2), (3, 1536, 1920, 6, 3), (4, 3072, 3072, 8, 2)]
    for (b, sq, sk, h, hk) in shapes:
        q, k, v = make_qkv(b, sq, sk, h, hk, d, torch.bfloat16, "cuda", seed=sk + d)
        out = torch.full_like(q, float("nan"))
        lse = torch.full((b, h, sq), float("nan"), device="cuda")
        if causal and cfg.get("PERSISTENT") and -(-sq // cfg["BLOCK_M"]) % 2:
            with pytest.raises(ValueError, match="even number of Q blocks"):
                g90.forward(q, k, v, out, lse, d ** -0.5, causal, cfg)
            assert out.isnan().all()
            continue
        g90.forward(q, k, v, out, lse, d ** -0.5, causal, cfg)
        check_cuda_out(out, lse, q, k, v, causal)


@needs_sm90
def test_compile_failure_falls_back_to_triton(monkeypatch):
    """A Gluon kernel that does not compile (a triton whose Gluon API moved) warns once and the
    call runs the Triton kernel; later calls skip the broken configuration without retrying."""
    attempts = []

    def broken(*args, **kwargs):
        attempts.append(1)
        raise RuntimeError("PassManager::run failed (simulated)")

    monkeypatch.setattr(g90, "replay", broken)
    monkeypatch.setattr(g90, "_BROKEN", set())
    monkeypatch.setattr(g90, "_PLANS", {})  # plans made here must not outlive the simulated failure
    # (nor may the route replay a plan that launched in an earlier test: a launched plan has compiled)
    monkeypatch.setattr(route, "_FWD_PLANS", {})
    q, k, v = make_qkv(1, 256, 256, 2, 2, 128, torch.float16, "cuda", seed=3)
    with pytest.warns(RuntimeWarning, match="failed to compile"):
        out, _ = route.forward(q, k, v, 0.088, False)
    ref, _ = attention_ref(q, k, v, softmax_scale=0.088, upcast=True)
    eager, _ = attention_ref(q, k, v, softmax_scale=0.088, upcast=False)
    assert (out.float() - ref).abs().max().item() <= 2 * (eager.float() - ref).abs().max().item() \
        + rounding_atol(ref, torch.float16)
    route.forward(q, k, v, 0.088, False)
    assert len(attempts) == 1, "a configuration that failed to compile must not be retried"


def test_only_compile_errors_fall_back(monkeypatch):
    """The fallback covers triton failing to build the kernel, not errors of the call itself."""
    from triton.compiler.errors import CompilationError

    assert launch_mod.compile_error(RuntimeError("PassManager::run failed"))
    assert launch_mod.compile_error(CompilationError("src", None, "bad"))
    assert not launch_mod.compile_error(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not launch_mod.compile_error(ValueError("strides must be 16-byte aligned"))
