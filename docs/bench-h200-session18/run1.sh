set -x
export PYTHONPATH=.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > $OUT/smi.txt
timeout 150 python3 -m pytest -q -x tests/test_backward_sm90.py -k "ws_kernel_equals or signatures" > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt
timeout 400 python3 scripts/bwd_order_ab.py --dtype float16 > $OUT/ab.txt 2>&1; tail -30 $OUT/ab.txt
