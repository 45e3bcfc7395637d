#!/bin/bash
# Session 19, run 1: where the backward's host time goes and whether it reaches the bench's numbers;
# what each path does with batch·heads > 65535, before (snap/ = HEAD) and after the flat-grid change.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > $OUT/run1/smi.txt 2>&1
timeout 200 python3 scripts/bwd_host_breakdown.py > $OUT/run1/host.log 2>&1
echo "host rc=$?"
(cd snap && PYTHONPATH=. timeout 150 python3 ../scripts/grid_limit_probe.py > $OUT/run1/grid-before.log 2>&1; echo "grid before rc=$?")
timeout 200 python3 scripts/grid_limit_probe.py > $OUT/run1/grid-after.log 2>&1
echo "grid after rc=$?"
tail -28 $OUT/run1/host.log; for f in before after; do echo "== $f"; grep -v "^ \|^Traceback" $OUT/run1/grid-$f.log | head -14; done
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
