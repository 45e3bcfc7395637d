#!/bin/bash
# Session 21, run 1: the fused backward with FA3's dQ layout (DQ_WRITER): each consumer computes one
# column half of dS·K over the whole K block, a writer warp adds both halves (ordered or not).
# fused_bwd_check.py --variants: correctness against the split default (rel diff, NaN-poisoned buffers,
# bitwise reruns) and the launcher's time next to the split default, session 13's fused mode, cuDNN, FA2.
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run1/versions.txt
V="DQ_WRITER=1 DQ_WRITER=1,det=0 DQ_WRITER=1,DQ_FIRST=1 DQ_WRITER=1,DQ_FIRST=1,det=0"
timeout 280 python3 scripts/fused_bwd_check.py --d 128 --sizes 4096 16384 --variants $V > $OUT/run1/d128.log 2>&1
echo "d128 rc=$?"
timeout 200 python3 scripts/fused_bwd_check.py --d 64 --sizes 4096 16384 --variants $V > $OUT/run1/d64.log 2>&1
echo "d64 rc=$?"
grep -E "variant|^D=|FAIL|Error" $OUT/run1/d128.log $OUT/run1/d64.log | cut -c1-260
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
