#!/bin/bash
# Session 22, run 4: the copy-kernel test fixed to use CUDA tensors on the GPU (run 3 gave it CPU
# tensors, which triton's GPU launcher refuses), with the padded-D GPU tests beside it.
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run4
timeout 150 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "pad_head or padded" > $OUT/run4/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run4/tests.log; grep -E 'FAILED|Error' $OUT/run4/tests.log | head -10
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
