#!/bin/bash
# Session 20, run 4: where the forward's and backward's host time goes with _DescRunner (cProfile).
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run4
timeout 200 python3 scripts/host_profile.py --cprofile --host-only 128:1:1024 > $OUT/run4/cprofile.log 2>&1
echo "rc=$?"
grep -A30 'ncalls' $OUT/run4/cprofile.log | head -120
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
