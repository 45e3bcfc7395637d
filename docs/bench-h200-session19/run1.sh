#!/bin/bash
# Session 19, run 1: where the backward's host time goes and whether it reaches the bench's numbers;
# what each path does with batch·heads > 65535 (before any fix).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/run1/smi.txt 2>&1
timeout 200 python3 scripts/bwd_host_breakdown.py > $OUT/run1/host.log 2>&1
echo "host rc=$?"
timeout 200 python3 scripts/grid_limit_probe.py > $OUT/run1/grid.log 2>&1
echo "grid rc=$?"
tail -30 $OUT/run1/host.log; grep -v "^ \|^Traceback" $OUT/run1/grid.log | head -30
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
