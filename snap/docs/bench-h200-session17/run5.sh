#!/bin/bash
# Session 17, run 5: the final forward code (4f0bb72): the public-route GPU tests (every routed kernel,
# including the new D = 64 non-causal persistent rule), then the fp16 D = 64 half of the grid. The
# rest of the grid is run 3's (f4117be): a refused machine start left too little device time.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run5
timeout 100 python3 -m pytest -q -n 8 tests/test_forward_sm90.py -k "matches_reference" > $OUT/run5/tests.log 2>&1
echo "tests rc=$?" >> $OUT/run5/tests.log; tail -2 $OUT/run5/tests.log
TILEFLASH_GIT=4f0bb72 timeout 85 python3 -m tileflash bench --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 1024 2048 4096 8192 16384 --head-dim 64 --modes fwd --dtype float16 --out $OUT/run5/fwd-float16 \
    > $OUT/run5/bench-float16.log 2>&1
echo "bench rc=$?"; grep -E "^(tileflash|sdpa_cudnn|sdpa_flash) " $OUT/run5/bench-float16.log
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
