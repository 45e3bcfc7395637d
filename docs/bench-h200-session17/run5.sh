#!/bin/bash
# Session 17, run 5: the D = 64 half of the forward grid at 2c7b588 (run 3's rules plus the D = 64
# non-causal persistent rule; the D = 128 rules and kernels are run 3's). No pytest and no D = 128
# cells: a refused machine start left too little device time (the kernel variants ran their GPU tests
# in run 3; the bench checks every cell's output against an fp32 reference).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run5
for dt in float16 bfloat16; do
  TILEFLASH_GIT=2c7b588 timeout 95 python3 -m tileflash bench --providers tileflash sdpa_cudnn sdpa_flash \
      --seqlens 1024 2048 4096 8192 16384 --head-dim 64 --modes fwd --dtype $dt --out $OUT/run5/fwd-$dt \
      > $OUT/run5/bench-$dt.log 2>&1
  echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run5/fwd-float16 $OUT/run5/fwd-bfloat16 > $OUT/run5/report.md 2>&1
cat $OUT/run5/report.md
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
