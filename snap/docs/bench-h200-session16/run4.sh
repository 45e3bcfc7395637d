#!/bin/bash
# Session 16, run 4: causal tiles longest first across heads (grid batch·heads x Q blocks) in the
# forward and the dQ kernel. A/B against snap2/ (the tree before, 83e6944), same run, fp16; then the
# GPU tests of the causal kernels.
set -u
export PYTHONPATH=.
for tree in before after before after; do
  dir=.; [ $tree = before ] && dir=snap2
  (cd $dir && TILEFLASH_GIT=$tree timeout 100 python3 -m tileflash bench --modes fwd bwd --causal yes \
      --seqlens 1024 2048 4096 --head-dim 64 128 --dtype float16 --providers tileflash sdpa_cudnn \
      --no-plots) > $OUT/ab-$tree.log 2>&1
  cat $OUT/ab-$tree.log >> $OUT/ab-all.log
  grep -E "^(tileflash|sdpa_cudnn) " $OUT/ab-$tree.log | sed "s/^/$tree /"
done
timeout 240 python3 -m pytest -q -n 8 tests/test_forward_sm90.py tests/test_backward_sm90.py -k "causal or repeated or plan" \
    > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/tests.log; tail -3 $OUT/tests.log
