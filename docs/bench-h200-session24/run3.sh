#!/bin/bash
# Session 24, run 3: delta computed in the Triton dQ kernel too (the route without the Gluon
# backward: other GPUs, varlen, the optional features). (a) the Triton backward's GPU tests and the
# Gluon routing/delta tests; (b) the A/B of the Triton route (TILEFLASH_GLUON_BWD=0) and the bf16
# A/B of the Gluon route; (c) the D = 64 causal 1k forward on other tiles of its 64-row kernel;
# (d) the D = 96 backward (padded, now with delta in the dQ kernel) against cuDNN and SDPA-flash.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run3
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run3/versions.txt
timeout 240 python3 -m pytest -q -n 12 tests/test_backward.py tests/test_features.py tests/test_dropout.py tests/test_grid_limit.py \
    "tests/test_backward_sm90.py::test_gluon_dq_kernel_computes_delta" \
    "tests/test_backward_sm90.py::test_repeated_backward_calls_take_the_cached_launchers" > $OUT/run3/tests.log 2>&1
echo "tests rc=$?"; tail -n 2 $OUT/run3/tests.log
TILEFLASH_GLUON_BWD=0 timeout 150 python3 scripts/dq_delta_ab.py --dtype float16 --d 64 128 --sizes 1024 4096 > $OUT/run3/ab-triton.log 2>&1
echo "ab triton rc=$?"
timeout 80 python3 scripts/dq_delta_ab.py --dtype bfloat16 --d 128 --sizes 1024 2048 > $OUT/run3/ab-gluon-bf16.log 2>&1
echo "ab bf16 rc=$?"
timeout 80 python3 scripts/gluon_check.py --d 64 --causal yes --sizes 1024 --configs 64/128/3/4 64/128/2/4 64/64/2/4 64/64/4/4 \
    > $OUT/run3/fwd64.log 2>&1
echo "fwd rc=$?"
timeout 100 python3 -m tileflash bench --modes bwd --dtype float16 --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 --out $OUT/run3/bwd-d96 > $OUT/run3/bwd-d96.log 2>&1
echo "bench d96 rc=$?"
grep -A12 "^| D | causal" $OUT/run3/ab-triton.log | cut -c1-140
grep -A8 "^| D | causal" $OUT/run3/ab-gluon-bf16.log | cut -c1-140
grep "gluon 64\|^| 64" $OUT/run3/fwd64.log | cut -c1-120
grep "tileflash\|sdpa" $OUT/run3/bwd-d96.log | grep -v "it/s" | cut -c1-100
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
