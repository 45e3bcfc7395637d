#!/bin/bash
# Session 23, run 4: the GPU test files at the final kernel code (Hopper forward and backward,
# the Triton backward, TMA), after D = 256 moved to the Gluon kernels in both passes.
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run4
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run4/versions.txt
timeout 420 python3 -m pytest -q -n 12 tests/test_forward_sm90.py tests/test_backward_sm90.py tests/test_backward.py tests/test_tma.py > $OUT/run4/tests.log 2>&1
echo "tests rc=$?"; tail -1 $OUT/run4/tests.log; grep -E '^FAILED|^ERROR' $OUT/run4/tests.log | head -20
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
