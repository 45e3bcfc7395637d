#!/bin/bash
# Session 22, run 3: the padded-D copies by one Triton kernel; D=256 backward on tensor descriptors.
# GPU tests of the backward files and test_tma.py; the copy kernel against torch's padded copies;
# then D=96/256 fwd+bwd fp16 and bwd bf16 (tileflash, cuDNN, SDPA-flash).
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run3
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run3/versions.txt
timeout 260 python3 -m pytest -q -n 8 tests/test_backward_sm90.py tests/test_backward.py tests/test_tma.py > $OUT/run3/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run3/tests.log; grep -E 'FAILED|Error' $OUT/run3/tests.log | head -10
timeout 60 python3 - > $OUT/run3/copies.log 2>&1 <<'PY'
import torch
import torch.nn.functional as Fn
from triton.testing import do_bench
from tileflash.ops import backward as B
t = torch.randn(4, 4096, 21, 96, device="cuda", dtype=torch.float16)
p = B._pad_head_dim(t, 128)
assert torch.equal(p[..., :96], t) and not p[..., 96:].any()
g = torch.randn(4, 4096, 21, 128, device="cuda", dtype=torch.float16)
dst = torch.empty_like(t)
byts = t.numel() * 2 + p.numel() * 2
for name, fn in (("pad, Triton kernel", lambda: B._pad_head_dim(t, 128)), ("pad, torch F.pad", lambda: Fn.pad(t, (0, 32))),
                 ("copy back, Triton kernel", lambda: B._copy_cols(g, dst)),
                 ("copy back, torch copy_", lambda: dst.copy_(g[..., :96]))):
    ms = do_bench(fn, warmup=10, rep=50, return_mode="median")
    print(f"{name:<26} {ms * 1e3:7.0f} us  {byts / ms * 1e-9:6.2f} TB/s (read + written)")
PY
cat $OUT/run3/copies.log
timeout 150 python3 -m tileflash bench --modes fwd bwd --dtype float16 --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 256 --out $OUT/run3/d96_d256-float16 > $OUT/run3/d96_d256-float16.log 2>&1
echo "bench fp16 rc=$?"
timeout 100 python3 -m tileflash bench --modes bwd --dtype bfloat16 --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 256 --out $OUT/run3/d96_d256-bfloat16 > $OUT/run3/d96_d256-bfloat16.log 2>&1
echo "bench bf16 rc=$?"
python3 scripts/grid_report.py $OUT/run3/d96_d256-float16 $OUT/run3/d96_d256-bfloat16 > $OUT/run3/report.md 2>&1
grep -B2 -A12 'bwd\*\*' $OUT/run3/report.md | grep -v '^$'; tail -5 $OUT/run3/report.md
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
