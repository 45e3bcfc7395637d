#!/bin/bash
# Session 20, run 6: the Gluon GPU tests at the final launcher code (_DescRunner.make takes triton's
# runner as its fallback and checks make_tensordesc_arg's signature).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run6
timeout 400 python3 -m pytest -q -n 8 tests/test_forward_sm90.py tests/test_backward_sm90.py -rs > $OUT/run6/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/run6/tests.log; grep -E 'FAILED|descriptor_runner' $OUT/run6/tests.log | head
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
