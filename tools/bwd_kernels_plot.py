"""Draw the table that tools/bwd_kernels.py prints last (``| D | N | arm | wall us | main kernel us |
other kernels us |``) as stacked bars: per (D, N) panel, one bar per arm, its main kernel and the
kernels around it, in µs per backward call (lower is better).

    python tools/bwd_kernels_plot.py bwd_kernels.log out.png [--title "..."]
"""

from __future__ import annotations

import argparse
import re

ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\w.+-]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|$")


def parse(text: str) -> list[tuple]:
    """(D, N, arm, wall, main, other) of each row of the table (µs)."""
    rows = [(int(m[1]), int(m[2]), m[3], float(m[4]), float(m[5]), float(m[6]))
            for m in map(ROW.match, text.splitlines()) if m]
    if not rows:
        raise SystemExit("no '| D | N | arm | wall us | main kernel us | other kernels us |' rows found")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    a = ap.parse_args(argv)
    rows = parse(open(a.log).read())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = sorted({(d, n) for d, n, *_ in rows})
    fig, axes = plt.subplots(1, len(cells), figsize=(3.2 * len(cells), 4.2), squeeze=False)
    for ax, (d, n) in zip(axes[0], cells):
        arms = [r for r in rows if (r[0], r[1]) == (d, n)]
        names = [r[2] for r in arms]
        main_us = [r[4] for r in arms]
        other_us = [r[5] for r in arms]
        xs = range(len(arms))
        ax.bar(xs, main_us, color="tab:blue", label="main kernel (split: dK/dV)")
        ax.bar(xs, other_us, bottom=main_us, color="tab:orange", label="other kernels (split: dQ)")
        ax.set_xticks(list(xs), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(f"D={d}, N={n}", fontsize=9)
        ax.set_ylabel("µs per backward call" if (d, n) == cells[0] else "")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower left")
    if a.title:
        fig.suptitle(a.title, fontsize=9)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)
    print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
