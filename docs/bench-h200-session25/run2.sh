#!/bin/bash
# Session 25, run 2: run 1's GPU tests again with room (they hit run 1's 90 s limit), then
# Nsight Compute on the current default kernels beside cuDNN's at N = 8k, fp16 (scripts/ncu_attn.sh):
# the D = 64 forward (three consumers), both backwards (Gluon dK/dV + Gluon dQ computing delta).
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run2
timeout 240 python3 -m pytest -q -n 8 tests/test_forward_sm90.py -k "64-64 or compile_for_sm90" > $OUT/run2/tests.log 2>&1
echo "tests rc=$?"; tail -n 1 $OUT/run2/tests.log
OUT=$OUT/run2 timeout 300 bash scripts/ncu_attn.sh g64 c64 g128 c128 bwd64 cbwd64 bwd128 cbwd128 > $OUT/run2/ncu-summary.txt 2>&1
echo "ncu rc=$?"; grep -c "==" $OUT/run2/ncu-summary.txt
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
