#!/bin/bash
# Session 20, run 1: the read floor of a decode step (scripts/decode_floor.py) and the decode GPU tests
# (the grid check moved before the append; the kernel is unchanged).
set -u
export PYTHONPATH=.
mkdir -p $OUT/run1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv > $OUT/run1/gpu.txt 2>&1
timeout 300 python3 scripts/decode_floor.py --shapes 1:8192 16:8192 1:32768 16:65536 --out $OUT/run1/floor.json > $OUT/run1/floor.log 2>&1
echo "floor rc=$?"
timeout 200 python3 -m pytest -q -n 8 tests/test_kvcache.py tests/test_grid_limit.py > $OUT/run1/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/run1/tests.log
tail -8 $OUT/run1/floor.log
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
