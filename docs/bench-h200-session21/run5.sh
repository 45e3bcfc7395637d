#!/bin/bash
# Session 21, run 5: LSE_EARLY in config_for (the split dK/dV kernel loads LSE/delta a block ahead).
# The backward GPU tests, then the backward grid in both dtypes (tileflash, cuDNN, SDPA-flash).
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run5
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run5/versions.txt
timeout 220 python3 -m pytest -q -n 8 tests/test_backward_sm90.py tests/test_backward.py > $OUT/run5/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run5/tests.log; grep -E 'FAILED|Error' $OUT/run5/tests.log | head -10
for dt in float16 bfloat16; do
  timeout 170 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --out $OUT/run5/bwd-$dt > $OUT/run5/bwd-$dt.log 2>&1
  echo "bwd $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run5/bwd-float16 $OUT/run5/bwd-bfloat16 > $OUT/run5/report-bwd.md 2>&1
tail -8 $OUT/run5/report-bwd.md
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
