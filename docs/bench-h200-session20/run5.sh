#!/bin/bash
# Session 20, run 5: the forward and backward grids (tileflash bench, D 64/128 x N 1k-16k x causal,
# fp16 and bf16) against cuDNN and SDPA-flash at 9e169d1 (the kernels of the eighteenth session's grids;
# the launches now encode their TMA descriptors once per address). The tree sent adds only this script.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run5
for mode in fwd bwd; do
  for dt in float16 bfloat16; do
    TILEFLASH_GIT=9e169d1 timeout 240 python3 -m tileflash bench --modes $mode --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
        --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --out $OUT/run5/$mode-$dt > $OUT/run5/$mode-$dt.log 2>&1
    echo "bench $mode $dt rc=$?"
  done
done
python3 scripts/grid_report.py $OUT/run5/fwd-float16 $OUT/run5/fwd-bfloat16 > $OUT/run5/report-fwd.md 2>&1; tail -4 $OUT/run5/report-fwd.md
python3 scripts/grid_report.py $OUT/run5/bwd-float16 $OUT/run5/bwd-bfloat16 > $OUT/run5/report-bwd.md 2>&1; tail -4 $OUT/run5/report-bwd.md
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
