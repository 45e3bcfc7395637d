#!/bin/bash
# Session 20, run 2: the TMA descriptors encoded once per address (forward_sm90._DescRunner):
# the Gluon GPU tests, then host time with the runner on and off in one process (scripts/desc_runner_ab.py).
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run2
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run2/versions.txt
timeout 150 python3 scripts/desc_runner_ab.py --rounds 4 > $OUT/run2/ab.log 2>&1
echo "ab rc=$?"
timeout 330 python3 -m pytest -q -n 8 tests/test_forward_sm90.py tests/test_backward_sm90.py tests/test_backward.py tests/test_tma.py tests/test_features.py > $OUT/run2/tests.log 2>&1
echo "tests rc=$?"; tail -3 $OUT/run2/tests.log; grep -E 'FAILED|Error' $OUT/run2/tests.log | head -10
tail -9 $OUT/run2/ab.log
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
