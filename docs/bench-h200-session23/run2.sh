#!/bin/bash
# Session 23, run 2: D = 256 forward on the warp-specialized Gluon kernel (64-key blocks, 2-slot
# ring). Forward GPU tests (reference at D = 64/128/256, routing, plan signatures) and the
# backward routing test; then D = 256 fwd + bwd (tileflash, cuDNN, SDPA-flash), fp16 and bf16,
# N 4k / 16k, and the forward through the Triton kernel (TILEFLASH_GLUON=0) in the same run.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run2
timeout 200 python3 -m pytest -q -n 8 tests/test_forward_sm90.py -k "256 or routing or plan_matches" > $OUT/run2/tests-fwd.log 2>&1
echo "fwd tests rc=$?"; tail -1 $OUT/run2/tests-fwd.log; grep -E '^FAILED|Error' $OUT/run2/tests-fwd.log | head -10
timeout 100 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "routing" > $OUT/run2/tests-bwd.log 2>&1
echo "bwd tests rc=$?"; tail -1 $OUT/run2/tests-bwd.log; grep -E '^FAILED' $OUT/run2/tests-bwd.log | head -10
for dt in float16 bfloat16; do
timeout 120 python3 -m tileflash bench --modes fwd bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 256 --out $OUT/run2/d256-$dt > $OUT/run2/d256-$dt.log 2>&1
echo "bench $dt rc=$?"
done
TILEFLASH_GLUON=0 timeout 60 python3 -m tileflash bench --modes fwd --dtype float16 --providers tileflash \
    --seqlens 4096 16384 --head-dim 256 --out $OUT/run2/d256-triton-fwd > $OUT/run2/d256-triton-fwd.log 2>&1
echo "triton fwd rc=$?"; grep -E "^\|" $OUT/run2/d256-triton-fwd.log | tail -5
python3 scripts/grid_report.py $OUT/run2/d256-float16 $OUT/run2/d256-bfloat16 > $OUT/run2/report.md 2>&1
grep -A7 '\*\*' $OUT/run2/report.md | grep -v '^$'
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
