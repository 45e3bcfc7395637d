"""Draw the benchmark plots from a results.json written by `tileflash bench --out DIR`.

Three PNGs, one panel per (mode, head dim, causal):
  * tflops.png  — TFLOP/s against seqlen, one line per provider;
  * memory.png  — peak extra memory (MiB) against seqlen: standard attention's
    quadratic memory against FlashAttention's linear, measured;
  * speedup.png — time of a baseline / time of each provider, against seqlen. The baseline is
    the first of eager, sdpa_math, sdpa_flash, sdpa_cudnn that the results hold (a GPU grid run
    without eager gets speedups over SDPA-flash); the y-axis names it.
Decode results (`tileflash bench --decode`) get one PNG instead:
  * decode.png  — KV bytes read per second against the cache length, one panel per batch size
    and timing (replayed from a CUDA graph; called from Python), one line per provider.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


_MODE_ORDER = {"fwd": 0, "bwd": 1, "fwd+bwd": 2}


def _panels(rows):
    keys = {(r["mode"], r["head_dim"], r["causal"]) for r in rows}
    return sorted(keys, key=lambda k: (_MODE_ORDER.get(k[0], 9), k[1], k[2]))


def _series(rows, key, metric):
    mode, d, causal = key
    out = {}
    for r in rows:
        if (r["mode"], r["head_dim"], r["causal"]) != key or r.get("status") != "ok":
            continue
        out.setdefault(r["provider"], []).append((r["seqlen_q"], metric(r, rows)))
    return {p: sorted(v) for p, v in out.items()}


SPEEDUP_BASELINES = ("eager", "sdpa_math", "sdpa_flash", "sdpa_cudnn")


def speedup_baseline(rows) -> str | None:
    """The provider speedup.png divides by: the first of SPEEDUP_BASELINES with a result."""
    present = {r["provider"] for r in rows if r.get("status") == "ok"}
    return next((p for p in SPEEDUP_BASELINES if p in present), None)


def _speedup(r, rows, baseline):
    for e in rows:
        if (e["provider"] == baseline and e.get("status") == "ok" and e["mode"] == r["mode"]
                and e["head_dim"] == r["head_dim"] and e["causal"] == r["causal"]
                and e["seqlen_q"] == r["seqlen_q"] and e["batch"] == r["batch"]):
            return e["ms"] / r["ms"]
    return float("nan")


def _plots(rows):
    """(file name, y label, metric(row, rows), log y) of each PNG; no speedup.png without a baseline."""
    plots = [("tflops.png", "TFLOP/s", lambda r, rows: r["tflops"], False),
             ("memory.png", "peak extra memory (MiB)", lambda r, rows: r["peak_mib"], True)]
    base = speedup_baseline(rows)
    if base is not None:
        plots.append(("speedup.png", f"speedup over {base} (×)", lambda r, rows: _speedup(r, rows, base), False))
    return plots


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("plots need matplotlib: pip install 'tileflash[bench]' (or pass --no-plots)") from e
    return plt


def _title(meta) -> str:
    return (f"{meta.get('device_name', '?')} | torch {meta.get('torch', '?')} | triton {meta.get('triton', '?')} | "
            f"{meta.get('dtype', '?')} | {meta.get('date', '?')} | git {meta.get('git', '?')}")


def make_decode_plots(rows, out_dir) -> list:
    """decode.png: KV TB/s against the cache length per batch size; graph and eager timings side by
    side when the rows have both (CUDA), else the one timing they have."""
    plt = _pyplot()
    ok = [r for r in rows if r.get("mode") == "decode" and r.get("status") == "ok"]
    batches = sorted({r["batch"] for r in ok}, reverse=True)
    graphed = any(r.get("timing") == "cuda_graph" for r in ok)
    cols = [("kv_tb_s", "CUDA graph replay"), ("kv_tb_s_eager", "called from Python")] if graphed else \
        [("kv_tb_s", "called from Python")]
    fig, axes = plt.subplots(max(1, len(batches)), len(cols), figsize=(6 * len(cols), 4 * max(1, len(batches))),
                             squeeze=False)
    for i, b in enumerate(batches):
        for j, (metric, how) in enumerate(cols):
            ax = axes[i][j]
            series = {}
            for r in ok:
                if r["batch"] == b and r.get(metric) is not None:
                    series.setdefault(r["provider"], []).append((r["seqlen_k"], r[metric]))
            for provider, pts in sorted(series.items()):
                xs, ys = zip(*sorted(pts))
                ax.plot(xs, ys, "o-" if not provider.startswith("tileflash_paged") else "o--", label=provider,
                        linewidth=2 if provider == "tileflash" else 1)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("cache length (keys)")
            ax.set_ylabel("KV TB/s (K+V bytes read once / time)")
            ax.set_title(f"decode, batch {b}, {how}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(_title(ok[0] if ok else {}), fontsize=9)
    fig.tight_layout()
    path = Path(out_dir) / "decode.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def make_plots(rows, out_dir) -> list:
    """Write the PNGs into out_dir (three, or two when no baseline for speedup.png ran, or
    decode.png for decode results); return their paths."""
    if rows and all(r.get("mode") == "decode" for r in rows):
        return make_decode_plots(rows, out_dir)
    plt = _pyplot()
    out_dir = Path(out_dir)
    keys = _panels(rows)
    meta = rows[0] if rows else {}
    written = []
    for fname, ylabel, metric, logy in _plots(rows):
        ncol = min(2, max(1, len(keys)))
        nrow = (len(keys) + ncol - 1) // ncol
        fig, axes = plt.subplots(nrow, ncol, figsize=(6 * ncol, 4 * nrow), squeeze=False)
        for ax, key in zip(axes.flat, keys):
            for provider, pts in sorted(_series(rows, key, metric).items()):
                xs, ys = zip(*pts)
                ax.plot(xs, ys, "o-", label=provider, linewidth=2 if provider == "tileflash" else 1)
            ax.set_xscale("log", base=2)
            if logy:
                ax.set_yscale("log")
            ax.set_xlabel("seqlen")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{key[0]}, head_dim={key[1]}, causal={key[2]}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
        for ax in list(axes.flat)[len(keys):]:
            ax.axis("off")
        fig.suptitle(_title(meta), fontsize=9)
        fig.tight_layout()
        path = out_dir / fname
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="directory holding results.json (from `tileflash bench --out DIR`)")


def run(args) -> int:
    path = Path(args.dir) / "results.json"
    if not path.exists():
        print(f"error: {path} not found; run `tileflash bench --out {args.dir}` first", file=sys.stderr)
        return 2
    rows = json.loads(path.read_text())["results"]
    for p in make_plots(rows, args.dir):
        print(f"wrote {p}")
    return 0
