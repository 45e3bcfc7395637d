#!/bin/bash
# Session 16, run 2: host time per call, the tree at ba057a9 (snap/) and this one alternated in
# separate processes three times (the host's speed drifts within a run); the GPU tests again.
set -u
export PYTHONPATH=.
ROOT=$(pwd)
for i in 1 2 3; do
  for tree in before after; do
    dir=.; [ $tree = before ] && dir=snap
    echo "## $tree, round $i" >> $OUT/host-ab.log
    (cd $dir && PYTHONPATH=. timeout 60 python3 "$ROOT"/scripts/host_profile.py --host-only 128:0:1024 64:1:1024 128:1:2048 \
        | grep '^| [fb]' ) >> $OUT/host-ab.log 2>&1
  done
done
cat $OUT/host-ab.log | tail -80
timeout 300 python3 -m pytest -q -x tests/test_backward_sm90.py \
    "tests/test_forward_sm90.py::test_repeated_calls_take_the_cached_launcher" \
    "tests/test_forward_sm90.py::test_compile_failure_falls_back_to_triton" > $OUT/tests.log 2>&1
echo "tests rc=$?" >> $OUT/tests.log; tail -3 $OUT/tests.log
