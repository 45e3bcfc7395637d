#!/bin/bash
# Session 24, run 2: both grids (tileflash bench, D 64/128 x N 1k-16k x causal, fp16 and bf16)
# against cuDNN and SDPA-flash at the commit with delta computed in the Gluon dQ kernel, then the
# other GPU test files (forward_sm90, backward, tma).
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run2
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run2/versions.txt
for mode in fwd bwd; do
  for dt in float16 bfloat16; do
    timeout 150 python3 -m tileflash bench --modes $mode --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
        --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --out $OUT/run2/$mode-$dt > $OUT/run2/$mode-$dt.log 2>&1
    echo "bench $mode $dt rc=$?"
  done
done
python3 scripts/grid_report.py $OUT/run2/fwd-float16 $OUT/run2/fwd-bfloat16 > $OUT/run2/report-fwd.md 2>&1; tail -n 4 $OUT/run2/report-fwd.md
python3 scripts/grid_report.py $OUT/run2/bwd-float16 $OUT/run2/bwd-bfloat16 > $OUT/run2/report-bwd.md 2>&1; tail -n 4 $OUT/run2/report-bwd.md
timeout 170 python3 -m pytest -q -n 12 tests/test_forward_sm90.py tests/test_backward.py tests/test_tma.py > $OUT/run2/tests.log 2>&1
echo "tests rc=$?"; tail -n 2 $OUT/run2/tests.log
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
