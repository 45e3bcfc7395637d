#!/bin/bash
# Session 19, run 7: the GPU tests at the final code (the flat grid; the LSE's gradient not materialized).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run7
timeout 420 python3 -m pytest -q -n 8 tests/test_backward.py tests/test_backward_sm90.py tests/test_grid_limit.py tests/test_forward_sm90.py tests/test_features.py > $OUT/run7/tests.log 2>&1
echo "tests rc=$?"; tail -4 $OUT/run7/tests.log
cd $OUT && tar czf run7.tgz run7 && rm -rf run7
