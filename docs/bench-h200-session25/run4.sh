#!/bin/bash
# Session 25, run 4: the forward grid again (fp16, bf16), at a tree whose kernels are run 1's (PTX
# identical), for a second sample of the forward median in one session (run 1: 1.0489x cuDNN).
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run4
for dt in float16 bfloat16; do
  timeout 105 python3 -m tileflash bench --modes fwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
      --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --out $OUT/run4/fwd-$dt > $OUT/run4/fwd-$dt.log 2>&1
  echo "bench fwd $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run4/fwd-float16 $OUT/run4/fwd-bfloat16 > $OUT/run4/report-fwd.md 2>&1; tail -n 3 $OUT/run4/report-fwd.md
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
