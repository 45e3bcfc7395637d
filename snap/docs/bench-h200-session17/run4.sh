#!/bin/bash
# Session 17, run 4: D = 64 at N = 1k / 2k (the grid's weakest cells after run 3): the default kernels
# against the persistent warp-specialized variants, causal and not, fp16 and bf16 (gluon_check, cuDNN
# and SDPA-flash in the same run). A sweep for the next decision; no default changes with it.
set -u
export PYTHONPATH=.
for dt in float16 bfloat16; do
  timeout 130 python3 scripts/gluon_check.py --dtype $dt --d 64 --sizes 1024 2048 \
      --configs 128/128/2/4/ws/p 128/128/3/4/ws/p 192/128/2/4/c3/p 192/128/2/4/c3 > $OUT/d64-$dt.log 2>&1
  echo "$dt rc=$?"; grep -E "gluon 1|^\|" $OUT/d64-$dt.log
done
