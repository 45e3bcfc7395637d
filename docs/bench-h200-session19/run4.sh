#!/bin/bash
# Session 19, run 4: why the backward's body costs more host time under autograd than alone.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run4
timeout 150 python3 scripts/autograd_host.py > $OUT/run4/autograd.log 2>&1; echo "autograd rc=$?"
tail -16 $OUT/run4/autograd.log
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
