"""Host cost per call (``tileflash bench --host``): microseconds per call launched back to back.

Small problems are launch-bound: the GPU finishes each kernel before Python has issued the next,
so what a caller pays per call is the host path (argument checks, dispatch, launch). This mode
times ``--calls`` calls issued back to back and synchronises once at the end:

* ``us/call``: wall time per call including the final synchronisation (what a loop pays);
* ``issue us``: time until the last call returned to Python, per call (the host path alone).

Cases (flash-attn / issue-tracker shapes): forward and forward+backward at B=1 N=128 H=16/8 D=128
causal; ``flash_attn_with_kvcache`` at B=1, cache length L=8k, one query token, read-only and with
one new k/v token appended. On a GPU also ``fwd+bwd@2k``: forward+backward at N=2048 (the same
heads), where ``deterministic=False`` runs the fused backward kernel (a short-sequence training
step, whose kernels take about as long as the host path; not timed on CPU, where it is compute). Providers: tileflash, torch SDPA with its default backend choice and
with the flash / cuDNN backends forced, flash-attn 2 and FA4 (``flash_attn.cute``) where they import;
``tf_sdpa`` is ``tileflash.scaled_dot_product_attention`` (forward and forward+backward only);
``tf_det`` is ``flash_attn_func(deterministic=True)`` (forward+backward only: the split backward
kernels, where the default may take the fused one).
SDPA's decode step is a slice of the cache (read-only) or ``index_copy_`` of the new token at a
device-tensor position followed by the slice (append), as a static-cache decoding loop does.

On a machine without a CUDA GPU it times the tiled CPU path at the same shapes and says so.
``--profile FILE`` also writes cProfile statistics of tileflash's calls.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from tileflash.bench.providers import sdpa_backend

CASES = ("fwd", "fwd+bwd", "fwd+bwd@2k", "decode", "decode+append")
CPU_CASES = tuple(c for c in CASES if "@" not in c)  # (@2k on the tiled CPU path is compute, not host time)


def _sdpa(name):
    """SDPA on (b, h, s, d) tensors, its backend pinned per call for the ``sdpa_*`` provider names
    (``providers.sdpa_backend``; plain ``sdpa`` dispatches freely)."""
    def fwd(q, k, v, causal):
        with sdpa_backend(name):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1])
    return fwd


def _providers(device):
    import tileflash

    prov = {"tileflash": ("bshd", lambda q, k, v, c: tileflash.flash_attn_func(q, k, v, causal=c))}
    # tileflash's SDPA drop-in (dense cases only), beside flash_attn_func
    prov["tf_det"] = ("bshd", lambda q, k, v, c: tileflash.flash_attn_func(q, k, v, causal=c, deterministic=True))
    prov["tf_sdpa"] = ("bhsd", lambda q, k, v, c: tileflash.scaled_dot_product_attention(
        q, k, v, is_causal=c, enable_gqa=q.shape[1] != k.shape[1]))
    prov["sdpa"] = ("bhsd", _sdpa("sdpa"))
    if device == "cuda":
        prov["sdpa_flash"] = ("bhsd", _sdpa("sdpa_flash"))
        prov["sdpa_cudnn"] = ("bhsd", _sdpa("sdpa_cudnn"))
        with contextlib.suppress(Exception):
            from flash_attn import flash_attn_func as fa2

            prov["flash_attn"] = ("bshd", lambda q, k, v, c: fa2(q, k, v, causal=c))
        with contextlib.suppress(Exception):
            from flash_attn.cute import flash_attn_func as fa4

            prov["fa4"] = ("bshd", lambda q, k, v, c: fa4(q, k, v, causal=c)[0])
    return prov


def _round(fn, calls, sync):
    """One round: (us per call with the final sync, us per call to issue)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return (t2 - t0) / calls * 1e6, (t1 - t0) / calls * 1e6


def _dense_case(mode, layout, fn, device, dtype):
    b, n, h, hk, d = 1, 2048 if mode.endswith("@2k") else 128, 16, 8, 128
    shape = (lambda heads: (b, n, heads, d)) if layout == "bshd" else (lambda heads: (b, heads, n, d))
    grad = mode.startswith("fwd+bwd")
    q, k, v = (torch.randn(shape(x), device=device, dtype=dtype, requires_grad=grad) for x in (h, hk, hk))
    if not grad:
        return lambda: fn(q, k, v, True)
    do = torch.randn(shape(h), device=device, dtype=dtype)

    def step():
        out = fn(q, k, v, True)
        torch.autograd.backward(out, do)
        q.grad = k.grad = v.grad = None
    return step


def _decode_case(name, append, device, dtype, cache_len):
    import tileflash

    b, h, hk, d = 1, 16, 8, 128
    k_cache = torch.randn(b, cache_len, hk, d, device=device, dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    q = torch.randn(b, 1, h, d, device=device, dtype=dtype)
    kn, vn = torch.randn(b, 1, hk, d, device=device, dtype=dtype), torch.randn(b, 1, hk, d, device=device, dtype=dtype)
    used = cache_len - 1  # one free slot: every append writes the same position (the call repeats)
    if name == "tileflash":
        seqlens = torch.full((b,), used, dtype=torch.int32, device=device)
        if append:
            return lambda: tileflash.flash_attn_with_kvcache(q, k_cache, v_cache, kn, vn, cache_seqlens=seqlens,
                                                             causal=True)
        return lambda: tileflash.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=seqlens, causal=True)
    if not name.startswith("sdpa"):
        return None
    sdpa = _sdpa(name)
    kc, vc = k_cache.transpose(1, 2), v_cache.transpose(1, 2)    # (b, hk, L, d) views
    qt, kt, vt = q.transpose(1, 2), kn.transpose(1, 2), vn.transpose(1, 2)
    pos = torch.tensor([used], device=device)

    def step():
        if append:
            kc.index_copy_(2, pos, kt)
            vc.index_copy_(2, pos, vt)
        n = used + 1 if append else used
        return sdpa(qt, kc[:, :, :n], vc[:, :, :n], False)
    return step


def measure(device, dtype, calls, cache_len, cases=CASES, profile=None, repeats=5):
    """Rows of {case, provider, us_call, us_issue} for the cases and every provider that runs here.

    A case's providers take turns: each of `repeats` rounds times every provider once (`calls`
    calls), starting one provider later than the round before (so that none always follows the
    same one), and each provider's median round is reported, so that a drift of the machine's speed
    during the run (on the H200 machine host timings moved by up to 2x between and within
    processes) touches every provider alike."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    rows = []
    prov = _providers(device)
    for case in cases:
        steps, failed = {}, {}
        for name, (layout, fn) in prov.items():
            try:
                if case.startswith("decode"):
                    step = _decode_case(name, case.endswith("append"), device, dtype, cache_len)
                elif name == "tf_det" and case == "fwd":
                    continue  # (deterministic= is the backward's choice: the forward is tileflash's row)
                else:
                    step = _dense_case(case, layout, fn, device, dtype)
                if step is None:
                    continue
                step()  # warm-up: compiles, plans
                sync()
                steps[name] = step
            except Exception as e:  # noqa: BLE001 -- a provider that cannot take a case is reported, not fatal
                failed[name] = f"{type(e).__name__}: {str(e)[:80]}"
        times = {name: [] for name in steps}
        names = list(steps)
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(_round(steps[name], calls, sync))
        for name in prov:
            if name in failed:
                rows.append(dict(case=case, provider=name, us_call=float("nan"), us_issue=float("nan"),
                                 status=failed[name]))
            elif name in times:
                rows.append(dict(case=case, provider=name, us_call=statistics.median(t[0] for t in times[name]),
                                 us_issue=statistics.median(t[1] for t in times[name]), status="ok"))
        if profile is not None and "tileflash" in steps:
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(calls):
                steps["tileflash"]()
            pr.disable()
            sync()
            s = io.StringIO()
            pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
            profile.append(f"== {case} ({calls} calls) ==\n{s.getvalue()}")
    return rows


def format_rows(rows):
    base = {r["case"]: r["us_call"] for r in rows if r["provider"] == "sdpa" and r["status"] == "ok"}
    lines = [f"{'case':14} {'provider':11} {'us/call':>9} {'issue us':>9} {'x sdpa':>7}"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['case']:14} {r['provider']:11} {r['status']}")
            continue
        ratio = r["us_call"] / base[r["case"]] if r["case"] in base else float("nan")
        lines.append(f"{r['case']:14} {r['provider']:11} {r['us_call']:9.1f} {r['us_issue']:9.1f} {ratio:7.2f}")
    return "\n".join(lines)


def run(args) -> int:
    """Entry of ``tileflash bench --host`` (arguments parsed by ``tileflash.bench.bench``)."""
    from tileflash.bench.demo import environment
    from tileflash.bench.providers import tiled_cpu_path

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cache_len = 8192
    calls = args.calls or (200 if device == "cuda" else 20)
    if device == "cpu":
        print("No CUDA GPU in use: timing the tiled CPU path (host and compute together), fp32", flush=True)
    profile = [] if args.profile else None
    ctx = tiled_cpu_path() if device == "cpu" else contextlib.nullcontext()
    with ctx:
        if args.rounds < 1:
            raise SystemExit(f"tileflash bench --host: --rounds must be at least 1, got {args.rounds}")
        rows = measure(device, dtype, calls, cache_len, cases=CASES if device == "cuda" else CPU_CASES,
                       profile=profile, repeats=args.rounds)
    env = environment(device)
    print(format_rows(rows))
    print(f"us/call: {calls} calls back to back, then one sync (median of {args.rounds} rounds, the providers taking "
          f"turns in a rotated order); "
          f"issue us: until the last call "
          f"returned. B=1 N=128 (@2k: 2048) H=16/8 D=128 causal; decode B=1 L={cache_len} H=16/8 D=128, {dtype}. "
          f"{env['device_name']}, torch {env['torch']}, triton {env['triton']}, {env['date']}, git {env['git']}")
    if profile is not None:
        with open(args.profile, "w") as f:
            f.write("\n".join(profile))
        print(f"wrote {args.profile}")
    return 0
