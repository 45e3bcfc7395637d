"""Issue-5 report from `tileflash bench` results: per-cell ratios and the targets, as markdown.

Usage: python3 scripts/grid_report.py DIR [DIR ...]   (each DIR holds a results.json)
Prints, per (dtype, pass), the table of tileflash / cuDNN / SDPA-flash TFLOP/s with ratios, then
the summary against the targets: median and worst ratio to cuDNN, worst ratio to SDPA-flash.
"""

import json
import statistics
import sys
from pathlib import Path


def main():
    rows = []
    for d in sys.argv[1:]:
        rows += [r for r in json.loads((Path(d) / "results.json").read_text())["results"] if r.get("status") == "ok"]
    cells = {}
    for r in rows:
        key = (r["dtype"], r["mode"], r["head_dim"], r["causal"], r["seqlen_q"])
        cells.setdefault(key, {})[r["provider"]] = r["tflops"]
    summary = {}
    for dtype, mode in sorted({k[:2] for k in cells}, key=lambda x: (x[0], x[1] != "fwd")):
        print(f"\n**{dtype} {mode}** (TFLOP/s)\n")
        print("| D | causal | N | tileflash | cuDNN | SDPA-flash | / cuDNN | / SDPA-flash |")
        print("|---|---|---|---|---|---|---|---|")
        for k in sorted(k for k in cells if k[:2] == (dtype, mode)):
            c = cells[k]
            t, cu, fl = c.get("tileflash"), c.get("sdpa_cudnn"), c.get("sdpa_flash")
            if None in (t, cu, fl):
                continue
            summary.setdefault((mode, k[2] in (64, 128)), []).append((t / cu, t / fl, k))
            n = f"{k[4] // 1024}k" if k[4] >= 1024 else str(k[4])
            print(f"| {k[2]} | {'yes' if k[3] else 'no'} | {n} | {t:.0f} | {cu:.0f} | {fl:.0f} | {t / cu:.2f} | {t / fl:.2f} |")
    print("\n| pass | cells | median / cuDNN | worst / cuDNN | worst / SDPA-flash | median / SDPA-flash |")
    print("|---|---|---|---|---|---|")
    for (mode, grid), v in sorted(summary.items(), key=lambda x: (not x[0][1], x[0][0] != "fwd")):
        cu, fl = [x[0] for x in v], [x[1] for x in v]
        w = min(v)[2]
        label = f"{mode}, D in {{64, 128}}" if grid else f"{mode}, other D"
        print(f"| {label} | {len(v)} | {statistics.median(cu):.2f} | {min(cu):.2f} (D={w[2]}, "
              f"{'causal' if w[3] else 'non-causal'}, N={w[4]}, {w[0]}) | {min(fl):.2f} | {statistics.median(fl):.2f} |")


if __name__ == "__main__":
    main()
