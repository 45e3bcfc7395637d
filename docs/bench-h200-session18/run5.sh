#!/bin/bash
# Session 18, run 5 (b37203a, the final backward): the backward's public-route GPU tests, then the
# causal half of the backward grid (the cells the PDL rule changed), fp16 and bf16.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run5
timeout 60 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "public or cached or pdl or writes_every or bitwise or sdpa_layout" > $OUT/run5/tests.log 2>&1
echo "tests rc=$?" >> $OUT/run5/tests.log; tail -2 $OUT/run5/tests.log
for dt in float16 bfloat16; do
  TILEFLASH_GIT=b37203a timeout 95 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
      --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --causal yes --no-plots --out $OUT/run5/bwd-$dt > $OUT/run5/bwd-$dt.log 2>&1
  echo "bench $dt rc=$?"; grep -E "^tileflash" $OUT/run5/bwd-$dt.log
  (cd $OUT && tar czf run5.tgz run5)
done
cd $OUT && rm -rf run5
