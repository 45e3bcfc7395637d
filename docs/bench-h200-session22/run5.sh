#!/bin/bash
# Session 22, run 5: D_OUT (the Gluon backward stores a padded call's own gradient columns
# in place). The padded-D GPU tests (split and fused, into wider NaN-poisoned buffers), the
# routing and reference tests of the default kernels; then D=96 bwd, fp16 and bf16.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run5
timeout 200 python3 -m pytest -q -n 8 tests/test_backward_sm90.py -k "pad or routing or matches_reference or writes_every or cached" > $OUT/run5/tests.log 2>&1
echo "tests rc=$?"; tail -2 $OUT/run5/tests.log; grep -E 'FAILED|Error' $OUT/run5/tests.log | head -10
for dt in float16 bfloat16; do
timeout 70 python3 -m tileflash bench --modes bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 --out $OUT/run5/d96-$dt > $OUT/run5/d96-$dt.log 2>&1
echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run5/d96-float16 $OUT/run5/d96-bfloat16 > $OUT/run5/report.md 2>&1
grep -A7 'bwd\*\*' $OUT/run5/report.md | grep -v '^$'
python3 -c "
import json
for dt in ('float16', 'bfloat16'):
    for x in json.load(open('$OUT/run5/d96-' + dt + '/results.json'))['results']:
        print(dt, x['provider'], x['causal'], x['seqlen_q'], round(x['peak_mib']), x['max_err'])
" > $OUT/run5/mem.txt; grep 16384 $OUT/run5/mem.txt
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
