#!/bin/bash
# Session 16, run 1: the backward's cached launches (perf-notes §25). GPU tests of the changed host
# paths, host time before (snap/ = the tree at ba057a9) and after, and the backward's small-N cells.
# Usage on the device: TILEFLASH_GIT=<commit> bash docs/bench-h200-session16/run1.sh  (writes to $OUT)
set -u
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/gpu.txt 2>&1
timeout 330 python3 -m pytest -q -x tests/test_backward_sm90.py \
    "tests/test_forward_sm90.py::test_repeated_calls_take_the_cached_launcher" \
    "tests/test_forward_sm90.py::test_compile_failure_falls_back_to_triton" > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/tests.log; tail -3 $OUT/tests.log
(cd snap && PYTHONPATH=. timeout 100 python3 ../scripts/host_profile.py 128:0:1024 64:1:1024 128:1:2048) > $OUT/host-before.log 2>&1
timeout 100 python3 scripts/host_profile.py 128:0:1024 64:1:1024 128:1:2048 > $OUT/host-after.log 2>&1
tail -14 $OUT/host-before.log; tail -14 $OUT/host-after.log
for dt in float16 bfloat16; do
  timeout 120 python3 -m tileflash bench --modes bwd --seqlens 1024 2048 --head-dim 64 128 --causal both \
      --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash --out $OUT/bwd-$dt --no-plots > $OUT/bwd-$dt.log 2>&1
  tail -20 $OUT/bwd-$dt.log
done
