"""What ptxas made of the Hopper Gluon kernels, without a GPU: wgmma waits and loop sizes in the SASS.

Compiles each dispatched configuration of the Gluon forward and backward for sm_90 with the
installed triton (tools/compile_check.py) and disassembles the cubin with the cuobjdump that
ships with triton. Per kernel it prints:
  hgmma   the number of HGMMA (wgmma) instructions;
  waits0  the number of `WARPGROUP.DEPBAR.LE gsb0, 0x0` (wait until no wgmma is in flight). When
          ptxas serializes the wgmmas (its advisory C7515) there is one after every HGMMA, so
          waits0 == hgmma; an asynchronous schedule has a few (docs/perf-notes.md, "Lessons");
  loop    instructions per iteration of the largest innermost loop (the per-block work).
Usage: PYTHONPATH=. python tools/sass_check.py [--json]   (also run by tests/test_backward_sm90.py)
"""

import json
import os
import re
import subprocess
import sys
import tempfile

import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compile_check import compile_gluon, compile_gluon_bwd, compile_gluon_bwd_dq  # noqa: E402

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s*(?:@!?U?P[0-9T]\s+)?([A-Z0-9_]+)(\.[A-Z0-9_.]+)?\s*(.*?);")


def sass(cubin: bytes) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        return subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)


def summary(text: str) -> dict:
    """hgmma, waits0 and the size of the largest innermost loop (a backward branch whose body
    holds no other backward branch) of one kernel's SASS."""
    ins = [(int(m.group(1), 16), m.group(2), m.group(4)) for m in map(_INSTR.match, text.splitlines()) if m]
    loops = []
    for addr, op, rest in ins:
        target = re.match(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            loops.append((int(target.group(1), 16), addr))
    inner = [(lo, hi) for lo, hi in loops if not any(lo < a < hi or (lo == a and hi > b) for a, b in loops
                                                          if (a, b) != (lo, hi) and lo <= a and b <= hi)]
    sizes = [sum(1 for a, _, _ in ins if lo <= a <= hi) for lo, hi in inner]
    return dict(hgmma=sum(op == "HGMMA" for _, op, _ in ins),
                waits0=len(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", text)),
                loop=max(sizes, default=0))


def cases():
    from tileflash.ops.gluon import backward as GB
    from tileflash.ops.gluon import forward as G

    for d in (64, 128):
        for causal in (False, True):
            for n in (1024, 4096, 16384):  # 16k: the three-consumer kernel at D=64, causal too
                cfg = G.config_for(d, causal, n)
                yield f"fwd D={d} causal={causal:d} N={n}", (lambda d=d, c=causal, cfg=cfg: compile_gluon(d, c, cfg))
            cfg = GB.config_for(d, causal, 4096)
            yield f"bwd D={d} causal={causal:d}", (lambda d=d, c=causal, cfg=cfg: compile_gluon_bwd(d, c, cfg))
            cfg = GB.dq_config_for(d, causal)
            yield f"dq D={d} causal={causal:d}", (lambda d=d, c=causal, cfg=cfg: compile_gluon_bwd_dq(d, c, cfg))


def main():
    rows = {}
    for name, build in cases():
        rows[name] = summary(sass(build().asm["cubin"]))
        if "--json" not in sys.argv:
            print(f"{name}: {rows[name]}", flush=True)
    if "--json" in sys.argv:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
