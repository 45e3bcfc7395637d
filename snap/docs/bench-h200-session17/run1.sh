#!/bin/bash
# Session 17, run 1: causal tiles longest first within groups of heads (forward and dQ kernels).
# The new GPU tests first; then an A/B against snap/ (the tree before, 5961324), trees alternated
# before / after / before / after in one run, fp16, causal, forward and backward, with cuDNN.
set -u
export PYTHONPATH=.
timeout 150 python3 -m pytest -q -n 8 tests/test_forward_sm90.py tests/test_backward_sm90.py -k "tile_order" \
    > $OUT/tests.log 2>&1; echo "tests rc=$?" >> $OUT/tests.log; tail -3 $OUT/tests.log
for tree in before after before after; do
  dir=.; [ $tree = before ] && dir=snap
  (cd $dir && TILEFLASH_GIT=$tree timeout 110 python3 -m tileflash bench --modes fwd bwd --causal yes \
      --seqlens 1024 2048 4096 8192 --head-dim 64 128 --dtype float16 --providers tileflash sdpa_cudnn \
      --no-plots) > $OUT/ab-$tree.log 2>&1
  cat $OUT/ab-$tree.log >> $OUT/ab-all.log
  grep -E "^(tileflash|sdpa_cudnn) " $OUT/ab-$tree.log | sed "s/^/$tree /"
done
# head_group sweep (forward only, fp16, causal): 1 = the per-head order; 0 = the rule's default
for g in 0 1 2 4 8 16 32 64 128; do
  if [ $g = 0 ]; then unset TILEFLASH_HEAD_GROUP; else export TILEFLASH_HEAD_GROUP=$g; fi
  TILEFLASH_GIT=g$g timeout 60 python3 -m tileflash bench --modes fwd --causal yes --seqlens 1024 2048 4096 \
      --head-dim 64 128 --dtype float16 --providers tileflash --no-plots > $OUT/sweep-g$g.log 2>&1
  grep -E "^tileflash " $OUT/sweep-g$g.log | sed "s/^/g$g /"
done
unset TILEFLASH_HEAD_GROUP
