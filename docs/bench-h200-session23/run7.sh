#!/bin/bash
# Session 23, run 7: the forward of a padded head dim (64 < D < 128, 128 < D < 256) on the Gluon
# kernel at the next width, on zero-padded copies (no kernel change: routing and the copy kernel,
# moved from backward.py to forward.py). The padded forward and backward GPU tests; then D = 96
# and 192 fwd, fp16 (tileflash, cuDNN, SDPA-flash), and TILEFLASH_GLUON_PAD=0 (the Triton forward)
# in the same run.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run7
timeout 120 python3 -m pytest -q -n 12 tests/test_forward_sm90.py tests/test_backward_sm90.py -k "pad or routing" > $OUT/run7/tests.log 2>&1
echo "tests rc=$?"; tail -1 $OUT/run7/tests.log; grep -E '^FAILED|^ERROR' $OUT/run7/tests.log | head -10
timeout 70 python3 -m tileflash bench --modes fwd --dtype float16 --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 192 --out $OUT/run7/fwd > $OUT/run7/fwd.log 2>&1
echo "bench rc=$?"
TILEFLASH_GLUON_PAD=0 timeout 40 python3 -m tileflash bench --modes fwd --dtype float16 --providers tileflash \
    --seqlens 4096 16384 --head-dim 96 192 --out $OUT/run7/fwd-triton > $OUT/run7/fwd-triton.log 2>&1
echo "triton rc=$?"
python3 scripts/grid_report.py $OUT/run7/fwd > $OUT/run7/report.md 2>&1
grep -A11 'fwd\*\*' $OUT/run7/report.md | grep -v '^$'
python3 -c "
import json
for x in json.load(open('$OUT/run7/fwd-triton/results.json'))['results']:
    print('triton', x['head_dim'], x['causal'], x['seqlen_q'], round(x['tflops']), round(x['peak_mib']))
for x in json.load(open('$OUT/run7/fwd/results.json'))['results']:
    print(x['provider'], x['head_dim'], x['causal'], x['seqlen_q'], round(x['peak_mib']), x['max_err'])
" > $OUT/run7/mem.txt 2>&1; grep -E "triton|16384" $OUT/run7/mem.txt | head -24
cd $OUT && tar czf run7.tgz run7 && rm -rf run7
