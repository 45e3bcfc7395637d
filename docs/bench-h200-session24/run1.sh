#!/bin/bash
# Session 24, run 1: delta computed inside the Gluon dQ kernel (dQ first, then dK/dV, no delta kernel).
# (a) the Gluon backward's GPU tests; (b) the backward A/B against the delta-kernel route
# (TILEFLASH_DQ_DELTA=0) beside cuDNN, fp16, D 64/128, N 1k-16k; (c) a forward sweep of the
# D = 64 causal short cells (config-only variants).
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run1/versions.txt
timeout 280 python3 -m pytest -q -n 12 -x tests/test_backward_sm90.py > $OUT/run1/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/run1/tests.log
timeout 200 python3 scripts/dq_delta_ab.py --dtype float16 --d 64 128 --sizes 1024 2048 4096 16384 > $OUT/run1/ab.log 2>&1
echo "ab rc=$?"
timeout 100 python3 scripts/gluon_check.py --d 64 --causal yes --sizes 1024 2048 --configs 128/64/3/4/ws 128/64/3/4/ws/p \
    128/64/4/4/ws/p 128/128/3/4/ws/p > $OUT/run1/fwd64.log 2>&1
echo "fwd rc=$?"
grep -A30 "^| D | causal" $OUT/run1/ab.log | cut -c1-150
grep "^kernels" $OUT/run1/ab.log | cut -c1-260
tail -12 $OUT/run1/fwd64.log | cut -c1-200
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
