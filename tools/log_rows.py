"""Rebuild benchmark rows from the table that ``tileflash bench`` prints, for a GPU run whose
results files did not come back (the device tool returns a limited number of files; the logs
did). Writes a CSV in ``results.csv``'s columns (those the printed table lacks, p20/p80 and the
decode columns, left empty; failed rows, which the table prints without numbers, left out) and, with ``--json DIR``, a ``DIR/results.json`` that
``tileflash plot DIR`` draws.

The batch and head counts are not in the printed table: they are the grid's (B·N = 16k tokens,
H = 2048 / D, at least 1 each, ``--tokens`` and ``--width`` to change), as ``tileflash bench`` sets them by
default.

    python tools/log_rows.py fwd-float16.log bwd-float16.log [...] --csv out.csv [--json DIR]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

from tileflash.bench.bench import CSV_FIELDS

# the printed table's footer: "...; NVIDIA H200, torch 2.11.0+cu130, triton 3.6.0, <iso date>, git <sha>"
_FOOTER = re.compile(r";\s*(?P<device>[^,]+), torch (?P<torch>\S+), triton (?P<triton>\S+), (?P<date>\S+), git (?P<git>\S+)")
_DTYPE = re.compile(r"(float16|bfloat16|float32)")



def parse(path: Path, tokens: int, width: int) -> list[dict]:
    """The rows of one bench log (its dtype from the file name, e.g. ``bwd-bfloat16.log``)."""
    text = path.read_text(errors="replace")
    m = _DTYPE.search(path.name)
    if m is None:
        raise SystemExit(f"{path}: the dtype must be in the file name (float16, bfloat16 or float32)")
    foot = _FOOTER.search(text)
    if foot is None:
        raise SystemExit(f"{path}: no footer with the device, versions, date and commit (not a bench log?)")
    rows = []
    for line in text.splitlines():
        c = line.split()
        # provider mode D causal N ms TFLOP/s MiB max_err status
        if len(c) != 10 or c[3] not in ("True", "False") or not c[2].isdigit() or c[9] != "ok":
            continue  # (a failed row has no numbers, and its status may be several words)
        d, n = int(c[2]), int(c[4])
        rows.append(dict(provider=c[0], mode=c[1], batch=max(1, tokens // n), heads=max(1, width // d),
                         heads_kv=max(1, width // d),
                         seqlen_q=n, seqlen_k=n, head_dim=d, causal=c[3] == "True", dtype=m.group(1),
                         status=c[9], ms=float(c[5]), p20=None, p80=None, tflops=float(c[6]), kv_tb_s=None,
                         ms_eager=None, kv_tb_s_eager=None, timing=None, peak_mib=float(c[7]),
                         max_err=float(c[8]), device_name=foot["device"].strip(), torch=foot["torch"],
                         triton=foot["triton"], date=foot["date"], git=foot["git"]))
    if not rows:
        raise SystemExit(f"{path}: no result rows found")
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", type=Path)
    ap.add_argument("--csv", type=Path, required=True)
    ap.add_argument("--json", type=Path, help="also write DIR/results.json (for tileflash plot DIR)")
    ap.add_argument("--tokens", type=int, default=16384, help="B·N of the grid (default 16384)")
    ap.add_argument("--width", type=int, default=2048, help="H·D of the grid (default 2048)")
    a = ap.parse_args(argv)
    rows = [r for p in a.logs for r in parse(p, a.tokens, a.width)]
    with open(a.csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    if a.json is not None:
        a.json.mkdir(parents=True, exist_ok=True)
        (a.json / "results.json").write_text(json.dumps({"results": rows, "skipped": {}}, indent=1))
    print(f"{len(rows)} rows from {len(a.logs)} logs -> {a.csv}", file=sys.stderr)


if __name__ == "__main__":
    main()
