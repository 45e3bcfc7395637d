"""Bar chart of the units' utilization in Nsight Compute profiles (tools/ncu_attn.sh output).

Usage: python tools/ncu_plot.py OUT.png NAME=FILE[:KERNEL_REGEX] ...
Each NAME=FILE names one profile text file; KERNEL_REGEX picks the kernel in files that hold
several (default: the first). Plots tensor pipe, XU (MUFU: exp2) and issue-slot activity
(percent of peak, per active SM cycle), and prints them as a table.
"""

import re
import sys

METRICS = {"tensor pipe": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
           "XU (exp2)": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "issue slots": "sm__issue_active.avg.pct_of_peak_sustained_active"}


def read(path, kernel=None):
    """{metric: value} of the first kernel section in the file whose header matches kernel."""
    text = open(path).read()
    sections = re.split(r"\n  (?=[^\s].*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", text)
    for sec in sections[1:]:
        if kernel and not re.search(kernel, sec.splitlines()[0]):
            continue
        out = {}
        for name, metric in METRICS.items():
            m = re.search(re.escape(metric) + r"\s+%\s+([\d.]+)", sec)
            if m:
                out[name] = float(m.group(1))
        if len(out) == len(METRICS):
            return out
    raise SystemExit(f"{path}: no kernel matching {kernel!r} with all metrics")


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    rows = []
    for arg in sys.argv[2:]:
        name, spec = arg.split("=", 1)
        path, _, kernel = spec.partition(":")
        rows.append((name, read(path, kernel or None)))
    print("| kernel | " + " | ".join(METRICS) + " |")
    print("|---|" + "---|" * len(METRICS))
    for name, vals in rows:
        print(f"| {name} | " + " | ".join(f"{vals[m]:.1f}%" for m in METRICS) + " |")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(rows)), 3.8))
    width = 0.8 / len(METRICS)
    for i, metric in enumerate(METRICS):
        ax.bar([j + i * width for j in range(len(rows))], [v[metric] for _, v in rows], width, label=metric)
    ax.set_xticks([j + width * (len(METRICS) - 1) / 2 for j in range(len(rows))])
    ax.set_xticklabels([n for n, _ in rows], fontsize=8)
    ax.set_ylabel("% of peak (active cycles)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.set_title("Nsight Compute, H200: what the attention kernels keep busy", fontsize=10)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)
    print(f"wrote {sys.argv[1]}")


if __name__ == "__main__":
    main()
