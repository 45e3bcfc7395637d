#!/bin/bash
# Session 23, run 6: head dims 128 < D < 256 (160, 192) through the split-column Gluon backward
# on copies zero-padded to 256 (D_OUT stores). The padded-D GPU tests and the copy kernel's test;
# then D = 192 bwd (tileflash, cuDNN, SDPA-flash) fp16 and bf16, N 4k / 16k, and the Triton
# backward (TILEFLASH_GLUON_BWD=0) in the same run.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run6
timeout 200 python3 -m pytest -q -n 12 tests/test_backward_sm90.py -k "pad or routing or d256 or launches_match or dq_tiles" > $OUT/run6/tests.log 2>&1
echo "tests rc=$?"; tail -1 $OUT/run6/tests.log; grep -E '^FAILED|^ERROR' $OUT/run6/tests.log | head -10
for dt in float16 bfloat16; do
timeout 70 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 192 --out $OUT/run6/d192-$dt > $OUT/run6/d192-$dt.log 2>&1
echo "bench $dt rc=$?"
done
TILEFLASH_GLUON_BWD=0 timeout 50 python3 -m tileflash bench --modes bwd --dtype float16 --providers tileflash \
    --seqlens 4096 16384 --head-dim 192 --out $OUT/run6/d192-triton > $OUT/run6/d192-triton.log 2>&1
echo "triton bwd rc=$?"
python3 scripts/grid_report.py $OUT/run6/d192-float16 $OUT/run6/d192-bfloat16 > $OUT/run6/report.md 2>&1
grep -A7 'bwd\*\*' $OUT/run6/report.md | grep -v '^$'
python3 -c "
import json
for x in json.load(open('$OUT/run6/d192-triton/results.json'))['results']:
    print('triton', x['causal'], x['seqlen_q'], round(x['tflops']), round(x['peak_mib']))
for dt in ('float16', 'bfloat16'):
    for x in json.load(open('$OUT/run6/d192-' + dt + '/results.json'))['results']:
        print(dt, x['provider'], x['causal'], x['seqlen_q'], round(x['peak_mib']), x['max_err'])
" > $OUT/run6/mem.txt 2>&1; grep -E "triton|16384" $OUT/run6/mem.txt | head -20
cd $OUT && tar czf run6.tgz run6 && rm -rf run6
