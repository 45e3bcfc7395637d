#!/bin/bash
# Session 23, run 5: the other head dims' grid at the final code: D = 96 and 256, fwd and bwd,
# fp16 and bf16, N 4k / 16k (tileflash, cuDNN, SDPA-flash), in one device call.
set -u
export PYTHONPATH=.:scripts
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p $OUT/run5
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" > $OUT/run5/versions.txt
for dt in float16 bfloat16; do
timeout 140 python3 -m tileflash bench --modes fwd bwd --dtype $dt --providers tileflash sdpa_cudnn sdpa_flash \
    --seqlens 4096 16384 --head-dim 96 256 --out $OUT/run5/d96_d256-$dt > $OUT/run5/d96_d256-$dt.log 2>&1
echo "bench $dt rc=$?"
done
python3 scripts/grid_report.py $OUT/run5/d96_d256-float16 $OUT/run5/d96_d256-bfloat16 > $OUT/run5/report.md 2>&1
grep -A11 '\*\*' $OUT/run5/report.md | grep -v '^$' | cut -c1-110
python3 -c "
import json
for dt in ('float16', 'bfloat16'):
    for x in json.load(open('$OUT/run5/d96_d256-' + dt + '/results.json'))['results']:
        print(dt, x['provider'], x['mode'], x['head_dim'], x['causal'], x['seqlen_q'], round(x['peak_mib']), x['max_err'])
" > $OUT/run5/mem.txt 2>&1; grep 16384 $OUT/run5/mem.txt | head -30
cd $OUT && tar czf run5.tgz run5 && rm -rf run5
