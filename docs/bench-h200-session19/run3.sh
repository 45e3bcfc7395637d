#!/bin/bash
# Session 19, run 3: the autograd engine's share of the backward's host time; the delta-launch test fixed.
set -u
export PYTHONPATH=.
mkdir -p $OUT/run3
timeout 120 python3 scripts/autograd_host.py > $OUT/run3/autograd.log 2>&1; echo "autograd rc=$?"
tail -12 $OUT/run3/autograd.log
timeout 100 python3 -m pytest -q tests/test_backward_sm90.py -k "delta_launch" > $OUT/run3/tests.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/run3/tests.log
TILEFLASH_GIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown) timeout 150 python3 -m tileflash bench --modes bwd --seqlens 1024 2048 --head-dim 64 128 --providers tileflash sdpa_cudnn --dtype float16 --no-plots --out $OUT/run3/bwd > $OUT/run3/bench.log 2>&1; echo "bench rc=$?"; tail -12 $OUT/run3/bench.log
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
