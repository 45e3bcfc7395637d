"""Benchmark attention providers: time, TFLOP/s, peak memory and error, per shape and mode.

Providers (see ``tileflash/bench/providers.py``): tileflash (default call; tileflash_det with
deterministic=True, tileflash_triton on the Triton kernels only), eager (standard attention),
torch SDPA with its math / efficient / flash / cuDNN backends, compiled FlexAttention, and
flash-attn if it is installed. Absent providers are skipped with a note.

Metrics, per (provider, shape, mode):
  * time: median with p20/p80 (CUDA: triton.testing.do_bench; CPU: wall clock);
  * TFLOP/s = 4·B·H·Sq·Sk·D / time, ×0.5 causal, ×2.5 for bwd, ×3.5 for fwd+bwd;
  * peak memory: extra bytes over the inputs during one call (CUDA: max_memory_allocated;
    CPU: the process's peak RSS growth, VmHWM);
  * max_err: max |out - ref| (fwd) or max |dq - dq_ref| (bwd, fwd+bwd) against an fp32 reference
    on batch 0 and the first kv-head group, so a fast wrong kernel cannot hide.

Default shapes follow flash-attn: batch·seqlen = 16k tokens and nheads·headdim = 2048.
`--device cpu` benchmarks tileflash's tiled CPU path against eager and torch's CPU SDPA.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from tileflash.bench.demo import PeakRSS, _malloc_trim, environment
from tileflash.bench.providers import PROVIDERS, sdpa_backend, sdpa_call, tiled_cpu_path
from tileflash.reference import attention_ref

MODES = ("fwd", "bwd", "fwd+bwd")
FLOP_FACTOR = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
CSV_FIELDS = ["provider", "mode", "batch", "heads", "heads_kv", "seqlen_q", "seqlen_k", "head_dim", "causal",
              "dtype", "status", "ms", "p20", "p80", "tflops", "kv_tb_s", "ms_eager", "kv_tb_s_eager", "timing", "peak_mib", "max_err", "device_name", "torch",
              "triton", "date", "git"]


def flops(shape: dict, mode: str) -> float:
    f = 4.0 * shape["batch"] * shape["heads"] * shape["seqlen"] ** 2 * shape["head_dim"]
    return f * (0.5 if shape["causal"] else 1.0) * FLOP_FACTOR[mode]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    p.add_argument("--providers", nargs="+", default=None, choices=sorted(PROVIDERS),
                   help="default: all (CUDA) or tileflash, eager, sdpa_math, sdpa_flash (CPU)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=["fwd", "bwd"])
    p.add_argument("--seqlens", type=int, nargs="+", default=None)
    p.add_argument("--head-dim", type=int, nargs="+", default=None)
    p.add_argument("--batch", type=int, default=None, help="default: 16384 // seqlen (CUDA), 1 (CPU)")
    p.add_argument("--heads", type=int, default=None, help="default: 2048 // head_dim (CUDA), 4 (CPU)")
    p.add_argument("--heads-kv", type=int, default=None, help="default: = heads (GQA when smaller)")
    p.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    p.add_argument("--dtype", choices=sorted(DTYPES), default=None, help="default: float16 (CUDA), float32 (CPU)")
    p.add_argument("--quick", action="store_true", help="few small shapes and short timing")
    p.add_argument("--out", default=None, help="directory for results.json, results.csv and PNG plots")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--decode", action="store_true",
                   help="decode benchmark: one query token against a KV cache of each --seqlens length; the "
                        "metric is K and V bytes read per second (defaults: batch 16, 32 heads, 8 kv heads, "
                        "headdim 128, bf16 on CUDA). On CUDA every provider's call is timed twice: replayed "
                        "from a CUDA graph (the kernels, as a serving loop that captures its decode step runs "
                        "them; the headline) and called from Python (host launch cost included)")
    p.add_argument("--host", action="store_true",
                   help="host cost per call: microseconds per call issued back to back (forward, forward+backward, "
                        "KV-cache decode read-only and with an append) for tileflash, SDPA and flash-attn/FA4 "
                        "where installed (tileflash/bench/host.py)")
    p.add_argument("--calls", type=int, default=None, help="with --host: calls per timing (default 200 CUDA, 20 CPU)")
    p.add_argument("--profile", default=None, help="with --host: write cProfile statistics of tileflash's calls here")
    p.add_argument("--rounds", type=int, default=5,
                   help="with --host: rounds per case, each timing every provider once in a rotated order; the "
                        "median round is reported (default 5; more narrow a noisy host's spread)")
    p.add_argument("--page-sizes", type=int, nargs="*", default=None,
                   help="with --decode: also time tileflash on a paged cache of each page size (rows "
                        "'tileflash_paged<P>'; default 16 64 256 on CUDA, none on CPU)")
    p.add_argument("--graph-calls", type=int, default=8,
                   help="with --decode on CUDA: calls per captured graph, cycling the rotated caches (default 8), "
                        "so that the graph's own launch is shared by several calls, as in a captured decode step "
                        "of many layers; 1 gives as many calls as rotated caches (one call per graph for caches "
                        "of 240 MB or more)")


def _shapes(args, device):
    quick = args.quick
    if device == "cuda":
        seqlens = args.seqlens or ([1024, 4096] if quick else [512, 1024, 2048, 4096, 8192, 16384])
        dims = args.head_dim or ([128] if quick else [64, 128])
    else:
        seqlens = args.seqlens or ([128, 256] if quick else [256, 512, 1024, 2048])
        dims = args.head_dim or ([32] if quick else [64])
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    out = []
    for d in dims:
        for causal in causals:
            for n in seqlens:
                heads = args.heads or (max(1, 2048 // d) if device == "cuda" else (2 if quick else 4))
                batch = args.batch or (max(1, 16384 // n) if device == "cuda" else 1)
                heads_kv = args.heads_kv or heads
                if heads % heads_kv:
                    raise SystemExit(f"--heads {heads} must be a multiple of --heads-kv {heads_kv}")
                out.append(dict(batch=batch, heads=heads, heads_kv=heads_kv, seqlen=n, head_dim=d, causal=causal))
    return out


def _inputs(shape, dtype, device, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed + shape["seqlen"])
    b, n, h, hk, d = (shape[k] for k in ("batch", "seqlen", "heads", "heads_kv", "head_dim"))
    q = torch.randn(b, n, h, d, generator=g).to(device, dtype)
    k = torch.randn(b, n, hk, d, generator=g).to(device, dtype)
    v = torch.randn(b, n, hk, d, generator=g).to(device, dtype)
    do = torch.randn(b, n, h, d, generator=g).to(device, dtype)
    return q, k, v, do


def _reference(q, k, v, do, causal, mode):
    """fp32 reference on batch 0 and the first kv-head group (all its query heads)."""
    group = q.shape[2] // k.shape[2]
    leaves = [t[:1, :, :n].detach().float().requires_grad_(mode != "fwd")
              for t, n in ((q, group), (k, 1), (v, 1))]
    out, _ = attention_ref(*leaves, causal=causal)
    if mode == "fwd":
        return out.detach()
    return torch.autograd.grad(out, leaves[0], do[:1, :, :group].float())[0]


def _step(fn, q, k, v, do, causal, mode):
    """The callable that is timed, and the tensor it produces for the error check."""
    if mode == "fwd":
        def run():
            return fn(q, k, v, causal)
        return run, lambda: fn(q, k, v, causal)[:1, :, : q.shape[2] // k.shape[2]]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    if mode == "bwd":
        out = fn(*leaves, causal)

        def run():
            return torch.autograd.grad(out, leaves, do, retain_graph=True)
    else:
        def run():
            return torch.autograd.grad(fn(*leaves, causal), leaves, do)
    group = q.shape[2] // k.shape[2]
    return run, lambda: run()[0][:1, :, :group]


def _time(run, device, quick):
    if device == "cuda":
        from triton.testing import do_bench

        ms, p20, p80 = do_bench(run, warmup=10 if quick else 25, rep=30 if quick else 100,
                                quantiles=[0.5, 0.2, 0.8])
        return ms, p20, p80
    run()  # warm-up
    times, t_end = [], time.perf_counter() + (0.3 if quick else 2.0)
    while len(times) < 3 or (time.perf_counter() < t_end and len(times) < 50):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1e3)
    qs = statistics.quantiles(times, n=10, method="inclusive")
    return statistics.median(times), qs[1], qs[7]


def _peak_mib(run, device):
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        res = run()
        torch.cuda.synchronize()
        del res
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    _malloc_trim()
    rss = PeakRSS()
    base = rss.reset()
    res = run()
    del res
    return (rss.peak() - base) / 2**20


def _is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def measure(name, shape, mode, dtype, device, quick):
    """One row: time, TFLOP/s, peak memory and error of a provider on a shape and mode."""
    row = dict(provider=name, mode=mode, batch=shape["batch"], heads=shape["heads"], heads_kv=shape["heads_kv"],
               seqlen_q=shape["seqlen"], seqlen_k=shape["seqlen"], head_dim=shape["head_dim"],
               causal=shape["causal"], dtype=str(dtype).replace("torch.", ""))
    fn = PROVIDERS[name].fn
    try:
        q, k, v, do = _inputs(shape, dtype, device)
        ref = _reference(q, k, v, do, shape["causal"], mode)
        run, probe = _step(fn, q, k, v, do, shape["causal"], mode)
        row["max_err"] = (probe().float() - ref).abs().max().item()
        ms, p20, p80 = _time(run, device, quick)
        row.update(ms=ms, p20=p20, p80=p80, tflops=flops(shape, mode) / ms * 1e-9)
        row["peak_mib"] = _peak_mib(run, device)
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - recorded in the row, the run goes on
        row["status"] = "OOM" if _is_oom(e) else f"error: {type(e).__name__}: {str(e)[:200]}"
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


class _Progress:
    """tqdm when installed, otherwise one line per step."""

    def __init__(self, total):
        self.total, self.i = total, 0
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self.bar = None

    def step(self, label):
        self.i += 1
        if self.bar is not None:
            self.bar.set_description(label)
            self.bar.update(1)
        else:
            print(f"[{self.i}/{self.total}] {label}", file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


@contextlib.contextmanager
def _stop_on_sigterm():
    """Turn SIGTERM (what ``timeout`` sends) into KeyboardInterrupt while the grid runs, so that a
    run stopped by a time limit still writes the cells it measured. Main thread only (signal
    handlers can be set nowhere else); the previous handler comes back afterwards."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def format_table(rows):
    head = f"{'provider':<15}{'mode':<8}{'D':>4}{'causal':>7}{'N':>7}{'ms':>10}{'TFLOP/s':>9}{'MiB':>9}{'max_err':>10}  status"
    lines = [head, "-" * len(head)]
    for r in rows:
        ok = r["status"] == "ok"
        lines.append(
            f"{r['provider']:<15}{r['mode']:<8}{r['head_dim']:>4}{str(r['causal']):>7}{r['seqlen_q']:>7}"
            + (f"{r['ms']:>10.3f}{r['tflops']:>9.2f}{r['peak_mib']:>9.1f}{r['max_err']:>10.2e}" if ok else " " * 38)
            + f"  {r['status']}"
        )
    return "\n".join(lines)


def write_results(rows, out_dir: Path, skipped: dict):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps({"results": rows, "skipped": skipped}, indent=1))
    with open(out_dir / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def _decode_tileflash(q, k, v, causal):
    import tileflash

    return tileflash.flash_attn_with_kvcache(q, k, v, cache_seqlens=k.shape[1], causal=causal)


def _to_paged(k, v, page, g):
    """The same cache as pages of `page` tokens in a shuffled pool, and its block table."""
    b, n, hk, d = k.shape
    if n % page:
        raise ValueError(f"seqlen {n} is not a multiple of the page size {page}")
    nb = n // page
    perm = torch.randperm(b * nb, generator=g).to(k.device)  # g: a CPU generator
    kp, vp = torch.empty_like(k).view(b * nb, page, hk, d), torch.empty_like(v).view(b * nb, page, hk, d)
    kp[perm], vp[perm] = k.reshape(b * nb, page, hk, d), v.reshape(b * nb, page, hk, d)
    return kp, vp, perm.view(b, nb).int()


def _decode_paged(q, cache, causal):
    import tileflash

    kp, vp, table = cache
    return tileflash.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=table.shape[1] * kp.shape[1],
                                             block_table=table, causal=causal)


def _graph_of(calls):
    """A thunk replaying one CUDA graph of `calls` run in order (e.g. the rotated caches, in turn)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles, allocator pools) outside the capture
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        keep = [c() for c in calls]

    def replay():
        graph.replay()
        return keep
    return replay


def measure_decode(name, shape, dtype, device, quick, graph_calls=8):
    """One decode row: q (B, 1, H, D) against K/V (B, L, Hk, D); KV bytes read per second.

    On CUDA the headline time is a CUDA graph of max(graph_calls, caches) calls, cycling the
    rotated caches (together at least 240 MB, four times the 60 MB L2, so no call finds its cache
    in the L2), divided by the number of calls."""
    b, h, hk, d, n = (shape[k_] for k_ in ("batch", "heads", "heads_kv", "head_dim", "seqlen"))
    row = dict(provider=name, mode="decode", batch=b, heads=h, heads_kv=hk, seqlen_q=1, seqlen_k=n, head_dim=d,
               causal=False, dtype=str(dtype).replace("torch.", ""))
    page = int(name[len("tileflash_paged"):]) if name.startswith("tileflash_paged") else 0
    # an SDPA provider's backend context is entered once around the timing, not per call
    fn = _decode_tileflash if name == "tileflash" else None if page else \
        sdpa_call if name in PROVIDERS and name.startswith("sdpa_") else PROVIDERS[name].fn
    kv_bytes = 2 * b * n * hk * d * torch.finfo(dtype).bits // 8
    # rotate several caches so that their total is at least 240 MB, four times the L2 (60 MB on an
    # H200): else a small cache is timed out of L2, not HBM
    sets = 1 if device == "cpu" else int(min(16, max(1, -(-240e6 // kv_bytes))))
    try:
        g = torch.Generator(device=device).manual_seed(n)  # caches drawn on the device: GBs at long L
        q = torch.randn(b, 1, h, d, generator=g, device=device).to(dtype)
        caches = [(torch.randn(b, n, hk, d, generator=g, device=device).to(dtype),
                   torch.randn(b, n, hk, d, generator=g, device=device).to(dtype)) for _ in range(sets)]
        k, v = caches[0]
        ref, _ = attention_ref(q[:1].float(), k[:1].float(), v[:1].float())
        if page:
            caches = [_to_paged(k_, v_, page, torch.Generator().manual_seed(page)) for k_, v_ in caches]
            row["page_size"] = page

            def call(c):
                return _decode_paged(q, c, False)
        else:
            def call(c):
                return fn(q, c[0], c[1], False)
        row["max_err"] = (call(caches[0])[:1].float() - ref).abs().max().item()
        it = [0]

        def run():
            c = caches[it[0] % sets]
            it[0] += 1
            return call(c)

        ms_eager, p20, p80 = _time(run, device, quick)
        row.update(ms_eager=ms_eager, kv_tb_s_eager=kv_bytes / ms_eager * 1e-9, timing="eager")
        if device == "cuda":
            try:
                n_calls = max(graph_calls, sets)
                replay = _graph_of([lambda c=caches[i % sets]: call(c) for i in range(n_calls)])
                ms, p20, p80 = (t / n_calls for t in _time(replay, device, quick))
                row.update(timing="cuda_graph", graph_calls=n_calls)
            except Exception as e:  # noqa: BLE001 -- a provider that cannot be captured keeps its eager time
                ms = ms_eager
                row["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        else:
            ms = ms_eager
        row.update(ms=ms, p20=p20, p80=p80, kv_tb_s=kv_bytes / ms * 1e-9, tflops=4 * b * h * n * d / ms * 1e-9,
                   peak_mib=_peak_mib(run, device), status="ok", caches_rotated=sets)
    except Exception as e:  # noqa: BLE001
        row["status"] = "OOM" if _is_oom(e) else f"error: {type(e).__name__}: {str(e)[:200]}"
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()
    return row


def run_decode(args, device, meta):
    dtype = DTYPES[args.dtype or ("bfloat16" if device == "cuda" else "float32")]
    names = args.providers or (["tileflash", "sdpa_flash", "sdpa_cudnn", "eager"] if device == "cuda"
                               else ["tileflash", "sdpa_math", "eager"])
    names = [n for n in names if n == "tileflash" or not PROVIDERS[n].unavailable(device)]
    pages = args.page_sizes if args.page_sizes is not None else ([16, 64, 256] if device == "cuda" else [])
    if "tileflash" in names:
        names[names.index("tileflash") + 1:names.index("tileflash") + 1] = [f"tileflash_paged{p}" for p in pages]
    lens = args.seqlens or ([1024, 8192, 65536, 131072] if device == "cuda" else [256, 1024])
    batches = [args.batch] if args.batch else ([16, 1] if device == "cuda" else [2])
    cpu = device == "cpu"
    shapes = [dict(batch=bt, heads=args.heads or (4 if cpu else 32), heads_kv=args.heads_kv or (2 if cpu else 8),
                   head_dim=(args.head_dim or [32 if cpu else 128])[0], seqlen=n) for bt in batches for n in lens]
    rows = []
    prog = _Progress(len(shapes) * len(names))
    with (tiled_cpu_path() if cpu else contextlib.nullcontext()):
        for shape in shapes:
            for name in names:
                prog.step(f"decode {name} B={shape['batch']} L={shape['seqlen']}")
                with sdpa_backend(name):  # (entered once: the rows time SDPA's calls, not its context)
                    rows.append({**measure_decode(name, shape, dtype, device, args.quick, args.graph_calls), **meta})
    prog.close()
    print(f"{'provider':<19}{'B':>4}{'L':>8}{'ms':>10}{'KV TB/s':>9}{'eager ms':>10}{'eager TB/s':>11}"
          f"{'max_err':>10}  status")
    for r in rows:
        ok = r["status"] == "ok"
        print(f"{r['provider']:<19}{r['batch']:>4}{r['seqlen_k']:>8}"
              + (f"{r['ms']:>10.4f}{r['kv_tb_s']:>9.3f}{r['ms_eager']:>10.4f}{r['kv_tb_s_eager']:>11.3f}"
                 f"{r['max_err']:>10.2e}" if ok else " " * 50)
              + f"  {r['status']}" + (f" (timed eager: graph capture failed, {r['graph_error']})"
                                      if r.get("graph_error") else ""))
    timing = ("ms / KV TB/s: replayed from a CUDA graph (kernels only); eager: called from Python, host launch "
              "cost included" if device == "cuda" else "timed eager (called from Python)")
    print("KV TB/s = bytes of K and V in the cache (read once) / time; " + timing + "; "
          + ", ".join(f"{k_} {v_}" for k_, v_ in meta.items()))
    if args.out:
        write_results(rows, Path(args.out), {})
        written = [Path(args.out) / "results.json", Path(args.out) / "results.csv"]
        if not args.no_plots:
            from tileflash.bench.plot import make_decode_plots

            written += make_decode_plots(rows, Path(args.out))
        print("wrote " + ", ".join(str(w) for w in written))
    return 0


def run(args) -> int:
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA GPU is available", file=sys.stderr)
        return 2
    if args.host:
        from tileflash.bench import host

        return host.run(args)
    if device == "cpu":
        print("No CUDA GPU in use: benchmarking the CPU version (tileflash's tiled PyTorch path) at small sizes",
              flush=True)
    if args.decode:
        env = environment(device)
        meta = dict(device_name=env["device_name"], torch=env["torch"], triton=env["triton"], date=env["date"],
                    git=env["git"] if not env.get("git_dirty") else f"{env['git']}-dirty")
        return run_decode(args, device, meta)
    dtype = DTYPES[args.dtype or ("float16" if device == "cuda" else "float32")]
    names = args.providers or (list(PROVIDERS) if device == "cuda" else ["tileflash", "eager", "sdpa_math",
                                                                         "sdpa_flash"])
    skipped = {}
    for n in list(names):
        why = PROVIDERS[n].unavailable(device)
        if why:
            skipped[n] = why
            print(f"note: skipping {n}: {why}", flush=True)
    names = [n for n in names if n not in skipped]
    shapes = _shapes(args, device)
    env = environment(device)
    meta = dict(device_name=env["device_name"], torch=env["torch"], triton=env["triton"], date=env["date"],
                git=env["git"] if not env.get("git_dirty") else f"{env['git']}-dirty")
    rows = []
    prog = _Progress(len(shapes) * len(args.modes) * len(names))
    ctx = tiled_cpu_path() if device == "cpu" else contextlib.nullcontext()
    interrupted = False
    with ctx, _stop_on_sigterm():
        try:
            for mode in args.modes:
                for shape in shapes:
                    for name in names:
                        prog.step(f"{name} {mode} N={shape['seqlen']} D={shape['head_dim']} causal={shape['causal']}")
                        rows.append({**measure(name, shape, mode, dtype, device, args.quick), **meta})
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM (`timeout`): keep and write what was measured
            interrupted = True
    prog.close()
    print(format_table(rows))
    if interrupted:
        print(f"interrupted: {len(rows)} of {prog.total} measurements done; the table above and the files "
              "written below hold only those", flush=True)
    print("TFLOP/s = 4·B·H·Sq·Sk·D / time (×0.5 causal, ×2.5 bwd, ×3.5 fwd+bwd); "
          f"{meta['device_name']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}, git {meta['git']}")
    if args.out:
        out_dir = Path(args.out)
        write_results(rows, out_dir, skipped)
        written = [out_dir / "results.json", out_dir / "results.csv"]
        if not args.no_plots:
            from tileflash.bench.plot import make_plots

            written += make_plots(rows, out_dir)
        print("wrote " + ", ".join(str(p) for p in written))
    return 130 if interrupted else 0
