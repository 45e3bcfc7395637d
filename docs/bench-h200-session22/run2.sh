#!/bin/bash
# Session 22, run 2: the padded-D backward with fewer copies (no padded O, no full fill);
# the Gluon backward tests that cover the restructured routing; D=96 bwd bench and kernel times;
# the D=256 Triton backward's tiles with tensor descriptors (non-causal and causal, 4k and 16k).
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run2
timeout 200 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "pad or routing or matches_reference or writes_every or cached or sdpa_layout or fused_mode_through" > $OUT/run2/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run2/tests.log; grep -E 'FAILED|Error' $OUT/run2/tests.log | head -10
timeout 100 python3 -m tileflash bench --modes bwd --dtype float16 --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 --out $OUT/run2/d96 > $OUT/run2/d96.log 2>&1
echo "bench rc=$?"
timeout 40 python3 - > $OUT/run2/split96.log 2>&1 <<'PY'
import torch
from gluon_bwd_probe import kernel_us
from tileflash.ops import backward as B, forward as F
for d, causal in ((96, False),):
    n = 4096; b, h = 16384 // n, 2048 // d
    q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=torch.float16) for _ in range(4))
    out, lse = F.flash_attn_forward(q, k, v, d ** -0.5, causal)
    us = kernel_us(lambda: B.flash_attn_backward(do, q, k, v, out, lse, d ** -0.5, causal))
    print(d, causal, {kk[:40]: round(t) for kk, t in sorted(us.items(), key=lambda x: -x[1])})
PY
cat $OUT/run2/split96.log | tail -1
for c in 0 1; do
timeout 130 python3 scripts/bwd_pair_sweep.py 256 $c 4096 16384 --tma 1 --pairs default 32,64,4,2/128,32,8,2 \
  32,64,8,2/128,32,8,2 64,64,4,2/128,32,8,2 32,128,8,2/128,32,8,2 64,32,4,2/128,32,8,2 \
  64,64,8,2/64,32,4,2 64,64,8,2/64,64,8,2 64,64,8,2/128,64,8,2 64,64,8,2/64,32,8,2 > $OUT/run2/sweep256-$c.log 2>&1
echo "sweep $c rc=$?"; grep -E 'N=16384|best' $OUT/run2/sweep256-$c.log
done
python3 scripts/grid_report.py $OUT/run2/d96 > $OUT/run2/report.md 2>&1
grep -A8 'bwd\*\*' $OUT/run2/report.md
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
