"""Grid report from `tileflash bench` results: per-cell ratios and the medians, as markdown.

Usage: python3 tools/grid_report.py DIR [DIR ...] [--baseline CSV]
Each DIR holds a results.json. Prints, per (dtype, pass), the TFLOP/s of tileflash, cuDNN,
SDPA-flash and FA4 (where it ran) with tileflash's ratios to each, then a summary: median and
worst ratio per baseline. ``--baseline CSV`` (e.g. docs/data/h200-grid.csv) adds, per cell,
tileflash's ratio to cuDNN in that earlier run, and the median change of that ratio: the way to
check that a change kept the speed (a ratio to cuDNN from the same run, not absolute TFLOP/s,
since absolute numbers drift between runs).
"""

import csv
import json
import statistics
import sys
from pathlib import Path

BASELINES = [("sdpa_cudnn", "cuDNN"), ("sdpa_flash", "SDPA-flash"), ("fa4", "FA4"),
             ("tileflash_det", "deterministic=True")]  # (the last: the default against its bitwise backward)


def _key(r):
    causal = r["causal"] if isinstance(r["causal"], bool) else str(r["causal"]).lower() == "true"
    return (r["dtype"], r["mode"], int(r["head_dim"]), causal, int(r["seqlen_q"]))


def _cells(rows):
    cells = {}
    for r in rows:
        if r.get("status", "ok") == "ok" and r.get("tflops") not in (None, ""):
            cells.setdefault(_key(r), {})[r["provider"]] = float(r["tflops"])
    return cells


def main(argv):
    baseline = None
    if "--baseline" in argv:
        i = argv.index("--baseline")
        with open(argv[i + 1]) as f:
            baseline = _cells(list(csv.DictReader(f)))
        argv = argv[:i] + argv[i + 2:]
    rows = []
    for d in argv:
        rows += json.loads((Path(d) / "results.json").read_text())["results"]
    cells = _cells(rows)
    present = [(p, label) for p, label in BASELINES if any(p in c for c in cells.values())]
    summary, drift = {}, {}
    for dtype, mode in sorted({k[:2] for k in cells}, key=lambda x: (x[0], x[1] != "fwd")):
        print(f"\n**{dtype} {mode}** (TFLOP/s)\n")
        extra = " | ×cuDNN before" if baseline else ""
        print("| D | causal | N | tileflash | " + " | ".join(lb for _, lb in present) + " | "
              + " | ".join(f"×{lb}" for _, lb in present) + extra + " |")
        print("|---" * (4 + 2 * len(present) + bool(baseline)) + "|")
        for k in sorted(k for k in cells if k[:2] == (dtype, mode)):
            c = cells[k]
            t = c.get("tileflash")
            if t is None:
                continue
            n = f"{k[4] // 1024}k" if k[4] >= 1024 else str(k[4])
            vals = [c.get(p) for p, _ in present]
            ratios = [t / x if x else None for x in vals]
            for (p, _), r in zip(present, ratios):
                if r is not None:
                    summary.setdefault((mode, p), []).append((r, k))
            line = (f"| {k[2]} | {'yes' if k[3] else 'no'} | {n} | {t:.0f} | "
                    + " | ".join("—" if x is None else f"{x:.0f}" for x in vals) + " | "
                    + " | ".join("—" if r is None else f"{r:.2f}" for r in ratios))
            if baseline:
                b = baseline.get(k, {})
                before = b["tileflash"] / b["sdpa_cudnn"] if "tileflash" in b and "sdpa_cudnn" in b else None
                now = ratios[0] if present and present[0][0] == "sdpa_cudnn" else None
                if before and now:
                    drift.setdefault(mode, []).append(now / before)
                line += " | " + ("—" if before is None else f"{before:.2f}")
            print(line + " |")
    print("\n| pass | baseline | cells | median ratio | worst ratio (cell) |")
    print("|---|---|---|---|---|")
    for (mode, p), v in sorted(summary.items(), key=lambda x: (x[0][0] != "fwd", x[0][1])):
        r, w = min(v)
        label = dict(BASELINES)[p]
        print(f"| {mode} | {label} | {len(v)} | {statistics.median(x[0] for x in v):.3f} | {r:.3f} "
              f"(D={w[2]}, {'causal' if w[3] else 'non-causal'}, N={w[4]}, {w[0]}) |")
    for mode, v in drift.items():
        print(f"\n{mode}: tileflash/cuDNN now against the baseline run, median {statistics.median(v):.3f}, "
              f"range {min(v):.3f}-{max(v):.3f} over {len(v)} cells")


if __name__ == "__main__":
    main(sys.argv[1:])
