#!/bin/bash
# Session 20, run 7: the Gluon GPU tests at the final launcher code (_DescRunner.make also checks the
# wrapper's closure and the C launcher's argument format).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run7
timeout 200 python3 -m pytest -q -n 8 tests/test_forward_sm90.py tests/test_backward_sm90.py -rs > $OUT/run7/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/run7/tests.log; grep -E 'FAILED|descriptor_runner' $OUT/run7/tests.log | head
cd $OUT && tar czf run7.tgz run7 && rm -rf run7
