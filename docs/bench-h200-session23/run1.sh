#!/bin/bash
# Session 23, run 1: the D = 256 Gluon dK/dV kernel with the columns split between the two
# consumers (backward_sm90._bwd_ws_split_consumer, SPLIT_D). GPU tests at D = 256 first; then the
# kernel times (Gluon split vs the Triton dK/dV kernel, TILEFLASH_GLUON_BWD=0), then the D = 256
# backward grid (tileflash, cuDNN, SDPA-flash), fp16 and bf16, N 4k / 16k.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run1/versions.txt
timeout 240 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "256 or routing or d256 or writes_every" > $OUT/run1/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run1/tests.log; grep -E 'FAILED|Error' $OUT/run1/tests.log | head -10
timeout 120 python3 - > $OUT/run1/kernels.log 2>&1 <<'PY'
import os, torch
from gluon_bwd_probe import kernel_us
from tileflash.ops import backward as B, forward as F
for causal in (False, True):
    for n in (4096, 16384):
        d = 256; b, h = 16384 // n, 2048 // d
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
        out, lse = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
        for arm in ("1", "0"):
            os.environ["TILEFLASH_GLUON_BWD"] = arm
            us = kernel_us(lambda: B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal))
            print("gluon" if arm == "1" else "triton", "causal" if causal else "full", n,
                  {kk: round(t) for kk, t in sorted(us.items(), key=lambda x: -x[1])}, flush=True)
PY
echo "kernels rc=$?"; cut -c1-300 $OUT/run1/kernels.log | tail -8
for dt in float16 bfloat16; do
timeout 90 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 256 --out $OUT/run1/d256-$dt > $OUT/run1/d256-$dt.log 2>&1
echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run1/d256-float16 $OUT/run1/d256-bfloat16 > $OUT/run1/report.md 2>&1
grep -A7 'bwd\*\*' $OUT/run1/report.md | grep -v '^$'
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
