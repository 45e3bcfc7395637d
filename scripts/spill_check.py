"""Static register and spill counts of the backward kernels at several block configs, without a GPU.

Compiles `_bwd_dkdv` / `_bwd_dq` for sm_90 with the installed triton and runs triton's bundled
`ptxas -v` on the PTX. Works on older trees too (it detects the pre-feature signature), which
is how the spill growth behind the backward regression was found (docs/perf-notes.md).
Usage: PYTHONPATH=<tree> python scripts/spill_check.py HEAD_DIM CAUSAL(0/1)
(with triton 3.6, e.g. the venv /tmp/t36 described in docs/testing.md).
"""
import os
import re
import subprocess
import sys
import tempfile

import triton

from compile_check import compile_one  # same directory: the kernel signature rules live there

from tileflash.ops import backward as B

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")


def compile_fn(fn, const, w, s):
    """(registers, spill-store bytes) that ptxas reports for fn compiled for sm_90a."""
    k = compile_one(fn, "fp16", const, w, s)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    out = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"], capture_output=True,
                         text=True)
    os.unlink(f.name)
    txt = out.stderr + out.stdout
    return re.findall(r"Used (\d+) registers", txt), re.findall(r"(\d+) bytes spill stores", txt)


d, causal = int(sys.argv[1]), sys.argv[2] == "1"
new = "HAS_RIGHT" in B._bwd_dkdv.arg_names
for fam, fn in (("dkdv", B._bwd_dkdv), ("dq", B._bwd_dq)):
    for cfg in [(32, 64, 4, 2), (32, 128, 4, 3), (32, 64, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3),
                (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 3)]:
        bm, bn, w, s = cfg
        const = dict(HEAD_DIM=d, BLOCK_D=d, DOT_PRECISION="tf32", BLOCK_M=bm, BLOCK_N=bn)
        if new:
            const.update(HAS_LEFT=False, HAS_RIGHT=causal, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False,
                         IS_VARLEN=False)
        else:
            const.update(IS_CAUSAL=causal)
        try:
            regs, spill = compile_fn(fn, const, w, s)
            print(f"{'new' if new else 'old'} D={d} causal={causal} {fam} {cfg}: regs {regs} spill-bytes {spill}")
        except Exception as e:  # noqa: BLE001
            print(f"{fam} {cfg}: FAIL {str(e)[:100]}")
