#!/bin/bash
# Session 16, run 5 (final tree): the Gluon GPU tests, then the backward grid (tileflash bench,
# bwd, D 64/128 x N 1k-16k x causal, fp16 and bf16) against cuDNN and SDPA-flash.
set -u
export PYTHONPATH=.
timeout 130 python3 -m pytest -q -n 8 tests/test_backward_sm90.py tests/test_forward_sm90.py > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/tests.log; tail -3 $OUT/tests.log
for dt in float16 bfloat16; do
  timeout 190 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
      --out $OUT/bwd-$dt > $OUT/bwd-$dt.log 2>&1
  echo "bench rc=$?" >> $OUT/bwd-$dt.log; grep -E "^tileflash|rc=" $OUT/bwd-$dt.log
done
