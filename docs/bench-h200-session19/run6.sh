#!/bin/bash
# Session 19, run 6: the delta kernel's tile choices.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run6
timeout 200 python3 scripts/delta_sweep.py > $OUT/run6/delta.log 2>&1; echo "delta rc=$?"
tail -8 $OUT/run6/delta.log
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
