#!/bin/bash
# Session 20, run 3: scripts/desc_runner_ab.py again, 8 rounds, every round's figures printed.
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run3
timeout 200 python3 scripts/desc_runner_ab.py --rounds 8 1:512:8:128:1 16:1024:16:128:1 2:2048:8:64:0 > $OUT/run3/ab.log 2>&1
echo "ab rc=$?"
cat $OUT/run3/ab.log | tail -40
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
