#!/bin/bash
# Session 21, run 2: the fused mode with FA3's dQ layout as the only fused layout (the session-13
# per-consumer layout removed): its GPU tests, then the whole backward fused (ordered, through
# TILEFLASH_GLUON_FUSED=1) and unordered against the split default, cuDNN and FA2 over D=128 N 1k-16k,
# with three schedule variants (launcher alone).
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run2
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run2/versions.txt
timeout 200 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "fused" > $OUT/run2/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run2/tests.log; grep -E 'FAILED|Error' $OUT/run2/tests.log | head -10
V="DQ_OWN_FIRST=1 DQ_FIRST=0 DQ_BUFS=1,STAGES=3"
timeout 330 python3 scripts/fused_bwd_check.py --d 128 --sizes 1024 2048 4096 8192 16384 --variants $V > $OUT/run2/d128.log 2>&1
echo "d128 rc=$?"
grep -E "variant" $OUT/run2/d128.log | cut -c1-200
tail -14 $OUT/run2/d128.log
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
