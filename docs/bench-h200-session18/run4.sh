#!/bin/bash
# Session 18, run 4 (aa134a4): the backward's GPU tests (with the PDL pair's), then the dQ kernel
# under PDL against the serial pair (scripts/bwd_overlap_ab.py, fp16, the bench's grid).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run4
timeout 150 python3 -m pytest -q -n 8 tests/test_backward_sm90.py > $OUT/run4/tests.log 2>&1
echo "tests rc=$?" >> $OUT/run4/tests.log; tail -3 $OUT/run4/tests.log
timeout 230 python3 scripts/bwd_overlap_ab.py --dtype float16 --chain 10 > $OUT/run4/ab.log 2>&1
echo "ab rc=$?"; tail -25 $OUT/run4/ab.log
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
