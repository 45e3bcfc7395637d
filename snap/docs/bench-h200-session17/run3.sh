#!/bin/bash
# Session 17, run 3: the forward GPU tests and the forward grid at f4117be (the causal persistent rule).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run3
timeout 200 python3 -m pytest -q -n 8 tests/test_forward_sm90.py > $OUT/run3/tests.log 2>&1
echo "tests rc=$?" >> $OUT/run3/tests.log; tail -3 $OUT/run3/tests.log
for dt in float16 bfloat16; do
  TILEFLASH_GIT=f4117be timeout 170 python3 -m tileflash bench --providers tileflash sdpa_cudnn sdpa_flash \
      --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --modes fwd --dtype $dt --out $OUT/run3/fwd-$dt \
      > $OUT/run3/bench-$dt.log 2>&1
  echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run3/fwd-float16 $OUT/run3/fwd-bfloat16 \
    > $OUT/run3/report.md 2>&1; tail -40 $OUT/run3/report.md
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
