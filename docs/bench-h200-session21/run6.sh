#!/bin/bash
# Session 21, run 6: the review's tests (fused schedule variants; LSE_EARLY on the carried-dK path) and
# D = 64 non-causal (the backward's worst cells) on 64-row Q blocks without the dK carry, with LSE/delta
# a block ahead; D = 128 non-causal at 8k/16k: LSE_EARLY 0 and 2 against the rule's 1.
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run6
timeout 150 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "variants or lse_early or fused" > $OUT/run6/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run6/tests.log; grep -E 'FAILED|Error' $OUT/run6/tests.log | head -10
timeout 150 python3 scripts/bwd_variant_check.py --d 64 --causal 0 --sizes 1024 4096 16384 \
  --variants BLOCK_M=64,CARRY_DK=0,LSE_EARLY=2 BLOCK_M=64,CARRY_DK=0,LSE_EARLY=2,STAGES=3 \
  > $OUT/run6/d64.log 2>&1
echo "d64 rc=$?"
timeout 100 python3 scripts/bwd_variant_check.py --d 128 --causal 0 --sizes 8192 16384 --variants LSE_EARLY=0 LSE_EARLY=2 \
  > $OUT/run6/d128.log 2>&1
echo "d128 rc=$?"
grep -A20 "^| D" $OUT/run6/d64.log; grep -A10 "^| D" $OUT/run6/d128.log; grep -iE "error|Traceback" $OUT/run6/*.log | head -5
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
