#!/bin/bash
# Session 17, run 2: causal calls on the persistent warp-specialized kernel, programs taking pairs of
# Q blocks (n_m - 1 - j, j) of one head (equal work per pair). GPU tests of the persistent schedules,
# then gluon_check (default kernel against the persistent configs, cuDNN and SDPA-flash in the same
# run), causal only, fp16 then bf16.
set -u
export PYTHONPATH=.
mkdir -p $OUT/r
timeout 200 python3 -m pytest -q -n 8 tests/test_forward_sm90.py -k "schedules_and_tiles or plan or persistent" \
    > $OUT/r/tests.log 2>&1; echo "tests rc=$?" >> $OUT/r/tests.log; tail -3 $OUT/r/tests.log
for dt in float16 bfloat16; do
  timeout 150 python3 scripts/gluon_check.py --dtype $dt --causal yes --d 128 --sizes 1024 2048 4096 8192 16384 \
      --configs 128/128/2/4/ws/p > $OUT/r/d128-$dt.log 2>&1
  grep -E "gluon 128|^\|" $OUT/r/d128-$dt.log
done
timeout 150 python3 scripts/gluon_check.py --dtype float16 --causal yes --d 64 --sizes 1024 2048 4096 8192 16384 \
    --configs 128/128/2/4/ws/p 128/128/3/4/ws/p 192/128/2/4/c3/p > $OUT/r/d64-float16.log 2>&1
grep -E "gluon 1|^\|" $OUT/r/d64-float16.log
cd $OUT && tar czf r.tgz r && rm -rf r
