#!/bin/bash
# Session 18, run 2: the Gluon GPU tests, then the backward grid (tileflash bench, bwd, D 64/128 x
# N 1k-16k x causal, fp16 and bf16) against cuDNN and SDPA-flash, at c8961c5 (the per-head dK/dV order).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run2
timeout 170 python3 -m pytest -q -n 8 tests/test_backward_sm90.py tests/test_forward_sm90.py > $OUT/run2/tests.log 2>&1
echo "tests rc=$?" >> $OUT/run2/tests.log; tail -3 $OUT/run2/tests.log
for dt in float16 bfloat16; do
  TILEFLASH_GIT=c8961c5 timeout 200 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
      --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --out $OUT/run2/bwd-$dt > $OUT/run2/bwd-$dt.log 2>&1
  echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run2/bwd-float16 $OUT/run2/bwd-bfloat16 > $OUT/run2/report.md 2>&1; tail -40 $OUT/run2/report.md
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
