#!/bin/bash
# Session 22, run 6: every test of tests/test_backward_sm90.py at the final kernel code (D_OUT).
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run6
timeout 170 python3 -m pytest -q -n 8 tests/test_backward_sm90.py > $OUT/run6/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run6/tests.log; grep -E 'FAILED|Error' $OUT/run6/tests.log | head -10
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
