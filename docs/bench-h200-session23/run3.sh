#!/bin/bash
# Session 23, run 3: the D = 256 Gluon dQ kernel with dQ's columns split between the consumers
# (backward_sm90._dq_ws_split_consumer, SPLIT_D), after run 1's split dK/dV kernel. The D = 256
# backward GPU tests (reference, NaN-poisoned buffers, determinism, routing); kernel times; then
# the D = 256 backward (tileflash, cuDNN, SDPA-flash), fp16 and bf16, N 4k / 16k.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run3
timeout 240 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "256 or routing or d256 or writes_every or dq_tiles or launches_match" > $OUT/run3/tests.log 2>&1
echo "tests rc=$?"; tail -1 $OUT/run3/tests.log; grep -E '^FAILED|Error' $OUT/run3/tests.log | head -10
timeout 100 python3 - > $OUT/run3/kernels.log 2>&1 <<'PY'
import os, torch
from gluon_bwd_probe import kernel_us
from tileflash.ops import backward as B, forward as F
for causal in (False, True):
    for n in (4096, 16384):
        d = 256; b, h = 16384 // n, 2048 // d
        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
        out, lse = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
        us = kernel_us(lambda: B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal))
        print("causal" if causal else "full", n, {kk: round(t) for kk, t in sorted(us.items(), key=lambda x: -x[1])}, flush=True)
PY
echo "kernels rc=$?"; cut -c1-300 $OUT/run3/kernels.log | tail -4
for dt in float16 bfloat16; do
timeout 90 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 256 --out $OUT/run3/d256-$dt > $OUT/run3/d256-$dt.log 2>&1
echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run3/d256-float16 $OUT/run3/d256-bfloat16 > $OUT/run3/report.md 2>&1
grep -A7 'bwd\*\*' $OUT/run3/report.md | grep -v '^$'
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
