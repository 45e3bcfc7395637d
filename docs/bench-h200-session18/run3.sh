#!/bin/bash
# Session 18, run 3: the forward grid at 2eaba6a (forward code as 4f0bb72), and a host profile of the
# backward at D=128 causal N=1k (the backward grid's host-bound cell).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run3
timeout 60 python3 scripts/host_profile.py --host-only --cprofile 128:1:1024 64:1:1024 > $OUT/run3/host.log 2>&1
echo "host rc=$?"
for dt in float16 bfloat16; do
  TILEFLASH_GIT=2eaba6a timeout 170 python3 -m tileflash bench --providers tileflash sdpa_cudnn sdpa_flash \
      --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --modes fwd --dtype $dt --out $OUT/run3/fwd-$dt \
      > $OUT/run3/bench-$dt.log 2>&1
  echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run3/fwd-float16 $OUT/run3/fwd-bfloat16 > $OUT/run3/report.md 2>&1; tail -8 $OUT/run3/report.md
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
