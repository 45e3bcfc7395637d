#!/bin/bash
# Session 25, run 1: both grids (tileflash bench, D 64/128 x N 1k-16k x causal, fp16 and bf16)
# against cuDNN and SDPA-flash at the commit with the 2-slot ring for D = 64 causal <= 1k forwards
# (b383795), after that ring's GPU test (64-64 tiles) and the compile-count test fixed in 935cf52.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run1/versions.txt
timeout 90 python3 -m pytest -q -n 8 tests/test_forward_sm90.py -k "64-64 or compile_for_sm90" > $OUT/run1/tests.log 2>&1
echo "tests rc=$?"; tail -n 1 $OUT/run1/tests.log
for mode in fwd bwd; do
  for dt in float16 bfloat16; do
    timeout 125 python3 -m tileflash bench --modes $mode --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
        --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --out $OUT/run1/$mode-$dt > $OUT/run1/$mode-$dt.log 2>&1
    echo "bench $mode $dt rc=$?"
  done
done
python3 scripts/grid_report.py $OUT/run1/fwd-float16 $OUT/run1/fwd-bfloat16 > $OUT/run1/report-fwd.md 2>&1; tail -n 4 $OUT/run1/report-fwd.md
python3 scripts/grid_report.py $OUT/run1/bwd-float16 $OUT/run1/bwd-bfloat16 > $OUT/run1/report-bwd.md 2>&1; tail -n 4 $OUT/run1/report-bwd.md
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
