#!/bin/bash
# Session 24, run 4: the D = 64 causal forward of up to 1k rows on a 2-slot ring (was 3): its
# GPU test (the 64-64-2 tile under the fp32 rule, NaN-poisoned), and gluon_check of the new
# default against the 3-slot ring at N = 1k, fp16 and bf16, with cuDNN and SDPA-flash.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run4
timeout 60 python3 -m pytest -q -n 8 tests/test_forward_sm90.py -k "64-64" > $OUT/run4/tests.log 2>&1
echo "tests rc=$?"; tail -n 1 $OUT/run4/tests.log
for dt in float16 bfloat16; do
  timeout 45 python3 scripts/gluon_check.py --dtype $dt --d 64 --causal yes --sizes 1024 --configs 64/64/3/4 \
      > $OUT/run4/fwd64-$dt.log 2>&1
  echo "check $dt rc=$?"; grep "gluon 64\|^| 64" $OUT/run4/fwd64-$dt.log | cut -c1-110
done
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
