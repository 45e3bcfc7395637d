#!/bin/bash
# Session 22, run 1: head dims 64 < D < 128 through the Gluon backward on zero-padded copies.
# The padded-D GPU tests; then D=96/256 fwd+bwd (tileflash, cuDNN, SDPA-flash), fp16;
# then where the D=256 backward's time goes (kernel times) and the D=256 Triton tiles with TMA.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run1/versions.txt
timeout 200 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "padded or routing" > $OUT/run1/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run1/tests.log; grep -E 'FAILED|Error' $OUT/run1/tests.log | head -10
timeout 200 python3 -m tileflash bench --modes fwd bwd --dtype float16 --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 256 --out $OUT/run1/d96_d256 > $OUT/run1/d96_d256.log 2>&1
echo "bench rc=$?"
timeout 60 python3 - > $OUT/run1/split256.log 2>&1 <<'PY'
import torch
from gluon_bwd_probe import kernel_us
from tileflash.ops import backward as B, forward as F
for d, causal in ((256, False), (256, True), (96, False)):
    n = 4096; b, h = 16384 // n, 2048 // d
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
    out, lse = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
    us = kernel_us(lambda: B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal))
    print(d, causal, {kk[:40]: round(t) for kk, t in sorted(us.items(), key=lambda x: -x[1])})
PY
echo "split rc=$?"; cat $OUT/run1/split256.log | tail -4
timeout 110 python3 scripts/bwd_pair_sweep.py 256 0 4096 --tma both --pairs default 64,64,8,2/64,64,8,2 64,64,8,3/128,32,8,2 > $OUT/run1/sweep256.log 2>&1
echo "sweep rc=$?"; tail -8 $OUT/run1/sweep256.log
python3 scripts/grid_report.py $OUT/run1/d96_d256 > $OUT/run1/report.md 2>&1
tail -12 $OUT/run1/report.md
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
