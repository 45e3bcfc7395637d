"""Static register and spill counts of the backward kernels at several block configs, without a GPU.

Compiles `_bwd_dkdv` / `_bwd_dq` for sm_90 with the installed triton and runs triton's bundled
`ptxas -v` on the PTX. Works on older trees too (it detects the pre-feature signature), which
is how the spill growth behind the backward regression was found (docs/perf-notes.md).
Usage: PYTHONPATH=<tree> python scripts/spill_check.py HEAD_DIM CAUSAL(0/1)
(with triton 3.6, e.g. the venv /tmp/t36 described in docs/testing.md).
"""
import os, re, subprocess, sys, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from tileflash.ops import backward as B

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
FP32 = {"LSE", "DELTA", "ALIBI"}; I32 = {"CU_Q", "CU_K"}; I64 = {"SEED"}
FLOATS = {"qk_scale", "sm_scale", "softcap_scale", "softcap2", "dropout_p"}

def compile_fn(fn, const, w, s):
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in const:
            sig[name] = "constexpr"
        elif name in ("ALIBI", "CU_Q", "CU_K", "SEED"):
            sig[name] = "constexpr"; const[name] = None
        elif name.isupper():
            sig[name] = "*fp32" if name in FP32 else "*fp16"; attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in FLOATS:
            sig[name] = "fp32"
        elif name.startswith("rng_stride"):
            sig[name] = "i64"
        else:
            sig[name] = "i32"
            if name.startswith("stride"): attrs[(i,)] = [["tt.divisibility", 16]]
    k = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                       target=GPUTarget("cuda", 90, 128), options=dict(num_warps=w, num_stages=s))
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"])
    out = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", f.name, "-o", "/dev/null"], capture_output=True, text=True)
    txt = out.stderr + out.stdout
    regs = re.findall(r"Used (\d+) registers", txt); spill = re.findall(r"(\d+) bytes spill stores", txt)
    return regs, spill

d, causal = int(sys.argv[1]), sys.argv[2] == "1"
new = "HAS_RIGHT" in B._bwd_dkdv.arg_names
for fam, fn in (("dkdv", B._bwd_dkdv), ("dq", B._bwd_dq)):
    for cfg in [(32, 64, 4, 2), (32, 128, 4, 3), (32, 64, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3),
                (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 3)]:
        bm, bn, w, s = cfg
        const = dict(HEAD_DIM=d, BLOCK_D=d, DOT_PRECISION="tf32", BLOCK_M=bm, BLOCK_N=bn)
        if new:
            const.update(HAS_LEFT=False, HAS_RIGHT=causal, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False, IS_VARLEN=False)
        else:
            const.update(IS_CAUSAL=causal)
        try:
            regs, spill = compile_fn(fn, const, w, s)
            print(f"{'new' if new else 'old'} D={d} causal={causal} {fam} {cfg}: regs {regs} spill-bytes {spill}")
        except Exception as e:
            print(f"{fam} {cfg}: FAIL {str(e)[:100]}")
