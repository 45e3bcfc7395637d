#!/bin/bash
# Session 24, run 4: the D = 64 causal forward of up to 1k rows on a 2-slot ring (was 3): the
# forward GPU tests of that kernel; gluon_check against the 3-slot ring, fp16 and bf16; the D = 64
# forward cells of the grid (tileflash bench, both dtypes) with cuDNN and SDPA-flash.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run4
timeout 120 python3 -m pytest -q -n 12 tests/test_forward_sm90.py -k "64-64 or matches_reference" > $OUT/run4/tests.log 2>&1
echo "tests rc=$?"; tail -n 1 $OUT/run4/tests.log
for dt in float16 bfloat16; do
  timeout 60 python3 scripts/gluon_check.py --dtype $dt --d 64 --causal yes --sizes 512 1024 --configs 64/64/3/4 64/64/2/4 \
      > $OUT/run4/fwd64-$dt.log 2>&1
  echo "check $dt rc=$?"; grep "gluon 64\|^| 64" $OUT/run4/fwd64-$dt.log | cut -c1-110
  timeout 80 python3 -m tileflash bench --modes fwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
      --seqlens 1024 2048 --head-dim 64 --out $OUT/run4/fwd-d64-$dt > $OUT/run4/fwd-d64-$dt.log 2>&1
  echo "bench $dt rc=$?"; grep "^tileflash\|^sdpa" $OUT/run4/fwd-d64-$dt.log | grep " True " | cut -c1-90
done
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
