#!/bin/bash
# Session 19, runs 4-5: why the backward body costs more host time under autograd than alone.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run5
timeout 150 python3 scripts/autograd_host.py > $OUT/run5/autograd.log 2>&1; echo "autograd rc=$?"
tail -16 $OUT/run5/autograd.log
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
