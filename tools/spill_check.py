"""Static register and spill counts of the backward kernels at several block configs, without a GPU.

Compiles `_bwd_dkdv` / `_bwd_dq` for sm_90 with the installed triton and runs triton's bundled
`ptxas -v` on the PTX. Works on older trees too (it detects the pre-feature signature), which
is how the spill growth behind the backward regression was found (docs/perf-notes.md).
Usage: PYTHONPATH=<tree> python tools/spill_check.py HEAD_DIM CAUSAL(0/1)
       PYTHONPATH=<tree> python tools/spill_check.py --gluon
(with triton 3.6, e.g. in a separate virtual environment, see docs/testing.md; newer triton releases
emit PTX newer than the ptxas they bundle).

--gluon: the Hopper Gluon kernels instead (forward and backward, every dispatched configuration
plus the backward's fused, CARRY_DK-flipped and PINGPONG modes, and the dQ kernel), with ptxas's performance advisories: C7515
("wgmma ... serialized") means the asynchronous schedule is not what runs (docs/perf-notes.md, "Lessons").
"""
import os
import re
import subprocess
import sys
import tempfile

import triton

from compile_check import compile_one  # same directory: the kernel signature rules live there

from tileflash.ops.triton import backward as B

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")


def ptxas_report(ptx):
    """ptxas -v output for PTX compiled for sm_90a."""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    out = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"], capture_output=True,
                         text=True)
    os.unlink(f.name)
    return out.stderr + out.stdout


def compile_fn(fn, const, w, s):
    """(registers, spill-store bytes) that ptxas reports for fn compiled for sm_90a."""
    txt = ptxas_report(compile_one(fn, "fp16", const, w, s).asm["ptx"])
    return re.findall(r"Used (\d+) registers", txt), re.findall(r"(\d+) bytes spill stores", txt)


def gluon_report():
    """Registers, spills and performance advisories of the Gluon kernels' configurations."""
    from compile_check import compile_gluon, compile_gluon_bwd, compile_gluon_bwd_dq

    from tileflash.ops.gluon import backward as GB
    from tileflash.ops.gluon import forward as G

    cases = []
    for d in (64, 128):
        for causal in (False, True):
            for n in (1024, 4096):
                cases.append((f"fwd D={d} causal={causal:d} N={n}", lambda d=d, c=causal, n=n:
                              compile_gluon(d, c, G.config_for(d, c, n))))
            base = GB.config_for(d, causal, 4096)
            flip = not base["CARRY_DK"]
            for tag, cfg in (("bwd", base), ("bwd fused (8 warps)", dict(base, WITH_DQ=True, WS=False)),
                             (f"bwd CARRY_DK={flip}", dict(base, CARRY_DK=flip)),
                             ("bwd PINGPONG", dict(base, PINGPONG=True))):
                cases.append((f"{tag} D={d} causal={causal:d}", lambda d=d, c=causal, cfg=cfg:
                              compile_gluon_bwd(d, c, cfg)))
            cases.append((f"dq D={d} causal={causal:d}", lambda d=d, c=causal:
                          compile_gluon_bwd_dq(d, c, GB.dq_config_for(d, c))))
    for name, build in cases:
        try:
            txt = ptxas_report(build().asm["ptx"])
        except Exception as e:  # noqa: BLE001
            print(f"{name}: FAIL {str(e)[:200]}")
            continue
        if "fatal" in txt:
            print(f"{name}: ptxas failed ({txt.strip().splitlines()[-1][:160]})")
            continue
        regs = re.findall(r"Used (\d+) registers", txt)
        spill = re.findall(r"(\d+) bytes spill stores", txt)
        adv = sorted(set(re.findall(r"\((C75\d\d)\)", txt)))
        print(f"{name}: regs {regs} spill-bytes {spill} advisories {adv or 'none'}")


if sys.argv[1:] == ["--gluon"]:
    gluon_report()
    sys.exit(0)
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
