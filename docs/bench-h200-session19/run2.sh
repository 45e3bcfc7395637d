#!/bin/bash
# Session 19, run 2 (3ad3316): the flat grid past 65535 batch·heads on the GPU; the GPU tests of the
# routes it touches; where the backward's host time goes (run 1's breakdown failed on a bug of mine).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run2
timeout 240 python3 -m pytest -q -n 8 tests/test_grid_limit.py > $OUT/run2/grid-tests.log 2>&1
echo "grid tests rc=$?"; tail -3 $OUT/run2/grid-tests.log
timeout 150 python3 scripts/grid_limit_probe.py > $OUT/run2/grid-probe.log 2>&1
echo "probe rc=$?"; grep -v "^ \|^Traceback" $OUT/run2/grid-probe.log | head -12
timeout 200 python3 scripts/bwd_host_breakdown.py > $OUT/run2/host.log 2>&1
echo "host rc=$?"; tail -50 $OUT/run2/host.log | grep -v "kernels:"
timeout 330 python3 -m pytest -q -n 8 tests/test_forward_sm90.py tests/test_backward_sm90.py tests/test_kvcache.py tests/test_errors.py > $OUT/run2/tests.log 2>&1
echo "tests rc=$?"; tail -4 $OUT/run2/tests.log
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
