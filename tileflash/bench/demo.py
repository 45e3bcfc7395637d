"""Standard (eager) attention vs tileflash, for growing sequence lengths N.

Eager attention computes softmax(q kᵀ · scale) v with PyTorch ops and materialises the
(N, N) score matrix; tileflash never does. For each N the demo prints, for both: the
max abs error against a higher-precision reference, the median time, the peak memory
of one call, and then the speedup, the memory ratio and the FLOP rate.

On a CUDA GPU it runs the reference benchmark shape (batch 1, 8 heads, head dim 64, float16,
N = 1k ... 16k) and the Triton kernel. Without one it runs tileflash's tiled PyTorch
CPU path in float32 at smaller sizes.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import multiprocessing
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

PROVIDERS = ("eager", "tileflash")

# The reference benchmark shape on the GPU; a smaller one on the CPU, sized so that the whole
# default CPU demo takes well under 2 minutes on 2 cores.
CUDA_CONFIG = dict(batch=1, nheads=8, headdim=64, dtype=torch.float16, sizes=[1024, 2048, 4096, 8192, 16384])
CPU_CONFIG = dict(batch=1, nheads=4, headdim=64, dtype=torch.float32, sizes=[256, 512, 1024, 2048, 4096])

# The reference is computed on a subset of query rows (all heads) so that its
# (batch, nheads, rows, N) score matrix stays below this many elements.
REF_BUDGET = {"cpu": 1 << 24, "cuda": 1 << 27}

SEED = 0
CPU_TIME_TARGET_S = 1.5  # per (provider, N): repeat until about this long ...
CPU_MIN_REPS, CPU_MAX_REPS = 3, 15  # ... within these bounds

CPU_NOTICE = "No CUDA GPU found: running the CPU version (tiled PyTorch path) at smaller sizes"


# ---------------------------------------------------------------------------
# The two providers, both in torch's (batch, nheads, seqlen, headdim) layout
# ---------------------------------------------------------------------------


def standard_attention(q, k, v):
    """Standard attention, the eager baseline: materialises the (N, N) matrix."""
    scale = q.shape[-1] ** -0.5
    attn = torch.matmul(q, k.transpose(-2, -1)) * scale
    attn = torch.softmax(attn, dim=-1)
    return torch.matmul(attn, v)


def tileflash_attention(q, k, v):
    import tileflash

    return tileflash.scaled_dot_product_attention(q, k, v)


FUNCS: Dict[str, Callable] = {"eager": standard_attention, "tileflash": tileflash_attention}


def make_inputs(cfg: dict, n: int, device: str):
    """Deterministic q, k, v of shape (batch, nheads, n, headdim), created directly in cfg's dtype."""
    gen = torch.Generator(device=device).manual_seed(SEED + n)
    shape = (cfg["batch"], cfg["nheads"], n, cfg["headdim"])
    return tuple(torch.randn(shape, generator=gen, device=device, dtype=cfg["dtype"]) for _ in range(3))


def flops(cfg: dict, n: int) -> float:
    """Forward FLOPs of non-causal attention: two (N x N x D) matmuls per head."""
    return 4.0 * cfg["batch"] * cfg["nheads"] * n * n * cfg["headdim"]


# ---------------------------------------------------------------------------
# Reference on a subset of rows
# ---------------------------------------------------------------------------


def reference_rows(cfg: dict, n: int, device: str) -> torch.Tensor:
    """Evenly spaced query rows (always including the first and last) to check against the reference."""
    budget = REF_BUDGET[device] // (cfg["batch"] * cfg["nheads"] * n)
    count = max(2, min(n, budget))
    return torch.linspace(0, n - 1, count, device=device).round().long().unique()


def reference_output(q, k, v, rows, dtype) -> torch.Tensor:
    """softmax(q kᵀ · scale) v for query rows ``rows`` in ``dtype``, shape (batch, nheads, rows, headdim)."""
    from tileflash.reference import attention_ref

    q_sub = q[:, :, rows].to(dtype)
    out, _ = attention_ref(
        q_sub.transpose(1, 2), k.to(dtype).transpose(1, 2), v.to(dtype).transpose(1, 2),
        softmax_scale=q.shape[-1] ** -0.5, causal=False, upcast=True,
    )
    return out.transpose(1, 2).to(dtype)


# ---------------------------------------------------------------------------
# CPU measurements: one fresh process per (provider, N)
# ---------------------------------------------------------------------------


def _status_bytes(field: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class PeakRSS:
    """Peak resident set size of this process since :meth:`reset`.

    On Linux, writing 5 to /proc/self/clear_refs resets the peak (VmHWM) to the current
    RSS, so the peak growth of a call is exact up to page granularity. Elsewhere it falls
    back to getrusage's ru_maxrss, the peak since the process started (hence the fresh
    process per measurement).
    """

    def __init__(self):
        self.method = "ru_maxrss"
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            if _status_bytes("VmHWM") is not None:
                self.method = "VmHWM"
        except OSError:
            pass

    def peak(self) -> int:
        if self.method == "VmHWM":
            return _status_bytes("VmHWM")
        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale

    def reset(self) -> int:
        """Reset the peak where possible; return the baseline to subtract."""
        if self.method == "VmHWM":
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        return self.peak()


def _malloc_trim() -> None:
    """Return free heap memory to the OS (glibc only; a no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _cpu_worker(provider: str, cfg: dict, n: int, rows: List[int]) -> dict:
    """Runs in a fresh (spawned) process: peak memory of one call, then timing."""
    fn = FUNCS[provider]
    # Warm up on tiny inputs first: lazy initialisation, thread pools and code pages of the
    # libraries are then already resident and not counted as the call's memory. Then hand
    # the freed heap back to the OS, so that the call cannot reuse already-resident pages
    # (which RSS would not see).
    fn(*make_inputs(cfg, 16, "cpu"))
    q, k, v = make_inputs(cfg, n, "cpu")
    _malloc_trim()
    rss = PeakRSS()
    base = rss.reset()  # the inputs are already allocated and resident
    try:
        out = fn(q, k, v)
    except (MemoryError, RuntimeError) as e:  # torch raises RuntimeError for failed CPU allocations
        if isinstance(e, MemoryError) or "memory" in str(e).lower():
            return {"status": "OOM"}
        raise
    peak = rss.peak() - base
    out_rows = out[:, :, rows].double().numpy().copy()
    del out

    times = []
    first = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn(q, k, v)
        times.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - first
        if len(times) >= CPU_MAX_REPS or (len(times) >= CPU_MIN_REPS and elapsed >= CPU_TIME_TARGET_S):
            break
    return {
        "status": "ok",
        "peak_bytes": peak,
        "mem_method": rss.method,
        "time_s": statistics.median(times),
        "reps": len(times),
        "out_rows": out_rows,
    }


@contextlib.contextmanager
def _env(**values):
    """Temporarily set environment variables (inherited by processes spawned meanwhile)."""
    old = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_cpu_cell(provider: str, cfg: dict, n: int, rows: List[int]) -> dict:
    ctx = multiprocessing.get_context("spawn")
    # TRITON_INTERPRET=0: the demo shows the tiled PyTorch path, not Triton's interpreter
    # (the test suite sets TRITON_INTERPRET=1 for its own processes).
    with _env(TRITON_INTERPRET="0"):
        with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
            try:
                return pool.submit(_cpu_worker, provider, cfg, n, rows).result()
            except concurrent.futures.process.BrokenProcessPool:
                return {"status": "killed (out of memory?)"}


def measure_cpu(cfg: dict, n: int, provider: str, rows: torch.Tensor, ref: torch.Tensor) -> dict:
    res = _run_cpu_cell(provider, cfg, n, rows.tolist())
    if res["status"] != "ok":
        return res
    out_rows = torch.from_numpy(res.pop("out_rows"))
    res["max_abs_err"] = (out_rows - ref).abs().max().item()
    return res


# ---------------------------------------------------------------------------
# CUDA measurements, in this process
# ---------------------------------------------------------------------------


def measure_cuda(cfg: dict, n: int, provider: str, qkv, rows: torch.Tensor, ref: torch.Tensor) -> dict:
    import triton.testing

    fn = FUNCS[provider]
    q, k, v = qkv
    try:
        fn(q, k, v)  # warm-up (and Triton compilation) before measuring memory
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()  # holds the inputs (and the reference rows)
        out = fn(q, k, v)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        err = (out[:, :, rows].float() - ref).abs().max().item()
        del out
        ms = triton.testing.do_bench(lambda: fn(q, k, v), return_mode="median")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"status": "OOM"}
    return {"status": "ok", "peak_bytes": peak, "mem_method": "max_memory_allocated",
            "time_s": ms / 1e3, "max_abs_err": err}


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def _git(*args: str) -> Optional[str]:
    try:
        res = subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def environment(device: str) -> dict:
    import triton

    if device == "cuda":
        name = torch.cuda.get_device_name()
    else:
        name = f"{_cpu_name()} ({torch.get_num_threads()} threads)"
    # TILEFLASH_GIT names the commit where git cannot tell, e.g. a copy of the tree whose .git
    # is stale (rows would name the stale commit, marked -dirty)
    forced = os.environ.get("TILEFLASH_GIT")
    status = None if forced else _git("status", "--porcelain")
    return {
        "device": device,
        "device_name": name,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda if device == "cuda" else None,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git": forced or _git("rev-parse", "--short", "HEAD"),
        "git_dirty": None if status is None else bool(status),
    }


def _fmt(value, spec: str, status: str) -> str:
    if status != "ok":
        return "OOM" if status == "OOM" else "ERROR"
    return "-" if value is None else format(value, spec)


def format_table(rows: List[dict], device: str) -> str:
    rate_name, rate_div = ("TFLOP/s", 1e12) if device == "cuda" else ("GFLOP/s", 1e9)
    header = (f"{'N':>6} | {'eager ms':>9} {'tflash ms':>9} {'speedup':>7} | {'eager MiB':>9} {'tflash MiB':>10} "
              f"{'mem ratio':>9} | {'eager err':>9} {'tflash err':>10} | {'eager ' + rate_name:>13} "
              f"{'tflash ' + rate_name:>14}")
    lines = [header, "-" * len(header)]
    for r in rows:
        es, ts = r["eager_status"], r["tileflash_status"]
        both = "ok" if es == ts == "ok" else "-"

        def mib(x):
            return None if x is None else x / 2**20

        def rate(key):
            return None if r[key] is None else r[key] * 1e12 / rate_div

        lines.append(
            f"{r['seqlen']:>6} | {_fmt(r['eager_ms'], '.2f', es):>9} {_fmt(r['tileflash_ms'], '.2f', ts):>9} "
            f"{_fmt(r['speedup'], '.2f', both) + ('x' if both == 'ok' else ''):>7} | "
            f"{_fmt(mib(r['eager_peak_bytes']), '.1f', es):>9} {_fmt(mib(r['tileflash_peak_bytes']), '.1f', ts):>10} "
            f"{_fmt(r['mem_ratio'], '.1f', both) + ('x' if both == 'ok' else ''):>9} | "
            f"{_fmt(r['eager_max_abs_err'], '.1e', es):>9} {_fmt(r['tileflash_max_abs_err'], '.1e', ts):>10} | "
            f"{_fmt(rate('eager_tflops'), '.2f', es):>13} {_fmt(rate('tileflash_tflops'), '.2f', ts):>14}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", metavar="N",
                        help="sequence lengths (default: 1024 ... 16384 on CUDA, 256 ... 4096 on the CPU)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto: CUDA if available, else the CPU (default: auto)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where to write the results as JSON (default: results/demo-<device>.json)")


def run(args: argparse.Namespace) -> int:
    has_cuda = torch.cuda.is_available()
    device = args.device
    if device == "auto":
        device = "cuda" if has_cuda else "cpu"
    if device == "cuda" and not has_cuda:
        print("error: --device cuda, but torch sees no CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    cfg = dict(CUDA_CONFIG if device == "cuda" else CPU_CONFIG)
    sizes = list(args.sizes) if args.sizes else list(cfg["sizes"])
    if any(n < 1 for n in sizes):
        print(f"error: --sizes must be positive, got {sizes}", file=sys.stderr)
        return 2
    out_path = args.out if args.out is not None else Path("results") / f"demo-{device}.json"
    dtype_name = str(cfg["dtype"]).replace("torch.", "")
    ref_dtype = torch.float64 if device == "cpu" else torch.float32

    env = environment(device)
    if device == "cpu":
        print(CPU_NOTICE if not has_cuda else
              "Running the CPU version (tiled PyTorch path) at smaller sizes, as asked (--device cpu)")
    print("tileflash demo: standard (eager) attention vs tileflash, forward, non-causal")
    print(f"device: {env['device_name']} | torch {env['torch']} | triton {env['triton']} | "
          f"batch={cfg['batch']} heads={cfg['nheads']} headdim={cfg['headdim']} {dtype_name} | N = "
          + ", ".join(map(str, sizes)), flush=True)

    t_start = time.perf_counter()
    total = len(sizes) * len(PROVIDERS)
    step = 0
    rows_out: List[dict] = []
    errors: List[str] = []
    mem_method = None
    for n in sizes:
        qkv = make_inputs(cfg, n, device)
        rows = reference_rows(cfg, n, device)
        ref = reference_output(*qkv, rows, ref_dtype)
        if device == "cpu":
            ref, rows = ref.cpu(), rows.cpu()
            del qkv  # the workers make their own copy of the same inputs
        row: dict = {"seqlen": n, "ref_rows": len(rows)}
        for provider in PROVIDERS:
            step += 1
            print(f"[{step:>{len(str(total))}}/{total}] {provider:<9} N={n:<6} ...", end=" ", flush=True)
            t0 = time.perf_counter()
            try:
                if device == "cpu":
                    res = measure_cpu(cfg, n, provider, rows, ref)
                else:
                    res = measure_cuda(cfg, n, provider, qkv, rows, ref)
            except Exception as e:  # keep going: report the failure in the table
                res = {"status": f"error: {type(e).__name__}: {e}"}
                errors.append(f"{provider} N={n}: {type(e).__name__}: {e}")
            ok = res["status"] == "ok"
            if ok:
                mem_method = res.get("mem_method", mem_method)
                print(f"{res['time_s'] * 1e3:.2f} ms, peak +{res['peak_bytes'] / 2**20:.1f} MiB, "
                      f"err {res['max_abs_err']:.1e} ({time.perf_counter() - t0:.1f} s)", flush=True)
            else:
                print(res["status"], flush=True)
            row[f"{provider}_status"] = res["status"]
            row[f"{provider}_ms"] = res["time_s"] * 1e3 if ok else None
            row[f"{provider}_peak_bytes"] = res["peak_bytes"] if ok else None
            row[f"{provider}_max_abs_err"] = res["max_abs_err"] if ok else None
            row[f"{provider}_tflops"] = flops(cfg, n) / res["time_s"] / 1e12 if ok else None
        both = row["eager_status"] == row["tileflash_status"] == "ok"
        row["speedup"] = row["eager_ms"] / row["tileflash_ms"] if both else None
        row["mem_ratio"] = (row["eager_peak_bytes"] / max(row["tileflash_peak_bytes"], 1)) if both else None
        rows_out.append(row)
        if device == "cuda":
            del qkv, ref
            torch.cuda.empty_cache()
    elapsed = time.perf_counter() - t_start

    print()
    print(format_table(rows_out, device))
    if device == "cuda":
        timing = "time: median of triton.testing.do_bench (after warm-up)"
        memory = ("memory: torch.cuda.max_memory_allocated during one call minus the allocated memory "
                  "before it (inputs held), after reset_peak_memory_stats")
    else:
        timing = (f"time: median of {CPU_MIN_REPS}-{CPU_MAX_REPS} runs (time.perf_counter) after a warm-up, "
                  f"{torch.get_num_threads()} threads")
        how = ("VmHWM, reset via /proc/self/clear_refs" if mem_method == "VmHWM" else "ru_maxrss")
        memory = (f"memory: peak RSS growth ({how}) during one call, each (provider, N) in a fresh spawned "
                  "process that holds the inputs, has run a tiny warm-up and trimmed its heap")
    print(timing)
    print(memory)
    checked = ", ".join(f"{r['ref_rows']}/{r['seqlen']}" for r in rows_out)
    print(f"error: max |out - ref| against a {str(ref_dtype).replace('torch.', '')} reference "
          f"(tileflash.reference.attention_ref), all heads, on evenly spaced query rows: {checked}")
    print("FLOP rate = 4*B*H*N^2*D / time; speedup = eager time / tileflash time; "
          "mem ratio = eager peak / tileflash peak")

    result = {
        **env,
        "config": {"batch": cfg["batch"], "nheads": cfg["nheads"], "headdim": cfg["headdim"],
                   "dtype": dtype_name, "causal": False, "reference_dtype": str(ref_dtype).replace("torch.", "")},
        "timing": timing,
        "memory_method": memory,
        "elapsed_s": round(elapsed, 2),
        "rows": rows_out,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results written to {out_path} ({elapsed:.1f} s)")
    if errors:
        print("errors:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tileflash.bench.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
