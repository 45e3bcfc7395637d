"""Where a kernel's warps stall, per SASS instruction: a summary of Nsight Compute's source page.

Input: the CSV that ``ncu --import REPORT --page source --csv --print-source sass`` prints for a
report taken with the SourceCounters section (``tools/ncu_attn.sh`` with ``NCU_SOURCE=1`` writes
it as ``src-<case>.csv``). Its rows are SASS instructions; the columns this script reads are found
by name, so that the exact set ncu prints may vary between versions:

* the instruction text: a column named ``Source``;
* the address: the first column whose name contains ``Address`` (optional);
* the samples: the first column whose name contains ``Warp Stall Sampling (All`` (every sample of
  a warp at that instruction, issued or not), and ``Warp Stall Sampling (Not-issued`` if present.

Prints the instructions that hold the most samples (until ``--cover`` of all samples are listed, at
most ``--top`` rows) and the samples summed by opcode (predicates and modifiers stripped:
``@!P0 SYNCS.PHASECHK.TRANS64.TRYWAIT`` counts as ``SYNCS``), so that "barrier stalls are 2x
FA4's" becomes "N% of the samples sit on this wait".

With an ``Instructions Executed`` column it also sums the samples by execution count: every
instruction of one partition's loop runs the same number of times (its warps times its
iterations), so these groups approximate the partitions of a warp-specialized kernel (the two
consumer warpgroups, the producer warp, ...), each with its largest stall reasons (the
``stall_*`` columns, where ncu prints them). A group of a few instructions run once per warp that
holds many samples is warps idling at a barrier, e.g. the warps triton adds to round a
warp-specialized CTA up to whole warpgroups: their stalls delay nobody, although they count in
Nsight Compute's per-kernel "stalled per issued instruction" ratios.

    python tools/ncu_source.py src-nbwd64k16.csv [--top 30] [--cover 0.9]
"""

from __future__ import annotations

import argparse
import csv
import io
import sys
from collections import Counter, namedtuple

Row = namedtuple("Row", "addr sass samples not_issued executed reasons")


def _number(text: str) -> float:
    text = text.strip().replace(",", "")
    if not text or text in ("-", "n/a"):
        return 0.0
    return float(text)


def _find(header, *needles, required=True):
    for i, name in enumerate(header):
        if all(n.lower() in name.lower() for n in needles):
            return i
    if required:
        raise ValueError(f"no column with {' and '.join(repr(n) for n in needles)} in the CSV header "
                         f"{header!r}: was the report taken with --section SourceCounters, and printed "
                         "with --page source --csv --print-source sass?")
    return None


def opcode(sass: str) -> str:
    """The opcode of a SASS instruction, without predicate and modifiers: ``@!P0 BAR.SYNC.DEFER_BLOCKING 0x1``
    -> ``BAR``."""
    words = sass.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0].rstrip(";") if words else ""


def read_rows(text: str):
    """A :data:`Row` (address, instruction, all samples, not-issued samples or None, times executed
    or None, {stall reason: samples}) per instruction of the CSV ``text`` (lines before the header,
    which ncu may print, are skipped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if '"Source"' in line or line.startswith("Source,")
                  or ",Source," in line), None)
    if start is None:
        raise ValueError("no header with a 'Source' column: not ncu's --page source --csv output")
    reader = csv.reader(io.StringIO("\n".join(lines[start:])))
    header = next(reader)
    src = _find(header, "Source")
    addr = _find(header, "Address", required=False)
    all_s = _find(header, "Warp Stall Sampling (All")
    not_issued = _find(header, "Warp Stall Sampling (Not", required=False)
    executed = next((i for i, name in enumerate(header) if name.strip() == "Instructions Executed"), None)
    # per-reason samples (all samples, not the "(Not Issued)" copies): stall_barrier, stall_long_sb, ...
    reasons = [(i, name.strip()[len("stall_"):]) for i, name in enumerate(header)
               if name.strip().startswith("stall_") and "(" not in name]
    rows = []
    for r in reader:
        if len(r) <= max(src, all_s):
            continue
        rows.append(Row(r[addr] if addr is not None else "", r[src].strip(), _number(r[all_s]),
                        _number(r[not_issued]) if not_issued is not None else None,
                        _number(r[executed]) if executed is not None and executed < len(r) else None,
                        {name: _number(r[i]) for i, name in reasons if i < len(r)}))
    return rows


def by_executed(rows, total: float, least: float = 0.005) -> list:
    """Markdown rows of the samples grouped by execution count (two significant digits), largest
    first, groups under ``least`` of the samples left out; [] without an execution-count column."""
    groups = {}
    for r in rows:
        if r.executed is None:
            return []
        g = groups.setdefault(float(f"{r.executed:.2g}"), [0, 0.0, Counter()])
        g[0] += 1
        g[1] += r.samples
        g[2].update(r.reasons)
    out = []
    for ex, (n, samples, reasons) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        if samples < least * total:
            break
        top = ", ".join(f"{name} {v / total:.1%}" for name, v in reasons.most_common(3) if v > 0)
        out.append(f"| {ex:.2g} | {n} | {samples / total:.1%} | {top} |")
    return out


def summarize(rows, top: int = 30, cover: float = 0.9) -> str:
    total = sum(r.samples for r in rows)
    if total <= 0:
        return "no stall samples in the CSV (was the SourceCounters section collected?)"
    out = [f"{len(rows)} instructions, {total:.0f} warp samples", "",
           "| share | cumulative | samples | not issued | address | instruction |", "|---|---|---|---|---|---|"]
    done = 0.0
    for addr, sass, n, ni, _, _ in sorted(rows, key=lambda r: -r.samples)[:top]:
        done += n
        out.append(f"| {n / total:.1%} | {done / total:.1%} | {n:.0f} | {'' if ni is None else f'{ni:.0f}'} | "
                   f"{addr} | `{sass}` |")
        if done >= cover * total:
            break
    by_op = Counter()
    for r in rows:
        by_op[opcode(r.sass)] += r.samples
    out += ["", "| opcode | share | samples |", "|---|---|---|"]
    out += [f"| {op} | {n / total:.1%} | {n:.0f} |" for op, n in by_op.most_common(15)]
    groups = by_executed(rows, total)
    if groups:
        out += ["", "| executed | instructions | share | largest stall reasons (share of all samples) |",
                "|---|---|---|---|"] + groups
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="at most this many instructions")
    ap.add_argument("--cover", type=float, default=0.9, help="stop once this share of the samples is listed")
    a = ap.parse_args(argv)
    with open(a.csv, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        print(summarize(read_rows(text), a.top, a.cover))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
