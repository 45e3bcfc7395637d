#!/bin/bash
# Session 21, run 4: the Q blocks' LSE and delta rows loaded earlier in the backward's consumer loop
# (LSE_EARLY 1: before the Q/dO wait; 2: one block ahead). The dK/dV kernel alone (split default) and
# the fused kernel, against their defaults in the same run; results must be the same bits.
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run4
timeout 250 python3 scripts/bwd_variant_check.py --d 128 64 --sizes 1024 4096 16384 > $OUT/run4/split.log 2>&1
echo "split rc=$?"
timeout 150 python3 scripts/bwd_variant_check.py --fused --d 128 --sizes 4096 16384 > $OUT/run4/fused.log 2>&1
echo "fused rc=$?"
grep -A40 "^| D" $OUT/run4/split.log; grep -A20 "^| D" $OUT/run4/fused.log; grep -iE "error|Traceback" $OUT/run4/*.log | head -5
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
