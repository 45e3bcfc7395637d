#!/bin/bash
# Session 25, run 3: tile sweep for the forward's weakest grid cells (run 1: D = 64 causal 2k / 4k,
# D = 64 non-causal 1k / 2k, all within 0.98-1.03x cuDNN): ring depth of the persistent pair kernel
# (causal; default 3 slots), the three-consumer kernel with 3 slots or persistent, the 2-consumer
# persistent kernel at 2k and with 3 slots at 1k. gluon_check checks each tile's output against the
# Triton kernel on NaN-poisoned buffers and times it beside the default, cuDNN and SDPA-flash.
# fp16 for all, bf16 for the causal cells (device time was short after three refused starts).
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run3
timeout 60 python3 scripts/gluon_check.py --dtype float16 --d 64 --causal yes --sizes 2048 4096 \
    --configs 128/128/2/4/ws/p 128/128/4/4/ws/p > $OUT/run3/c64-float16.log 2>&1; echo "c64 fp16 rc=$?"
timeout 60 python3 scripts/gluon_check.py --dtype float16 --d 64 --causal no --sizes 1024 \
    --configs 128/128/3/4/ws/p 192/128/2/4/c3/p > $OUT/run3/n64-1k-float16.log 2>&1; echo "n64 1k fp16 rc=$?"
timeout 60 python3 scripts/gluon_check.py --dtype float16 --d 64 --causal no --sizes 2048 \
    --configs 128/128/2/4/ws/p 192/128/3/4/c3 192/128/2/4/c3/p > $OUT/run3/n64-2k-float16.log 2>&1; echo "n64 2k fp16 rc=$?"
timeout 60 python3 scripts/gluon_check.py --dtype bfloat16 --d 64 --causal yes --sizes 2048 4096 \
    --configs 128/128/2/4/ws/p 128/128/4/4/ws/p > $OUT/run3/c64-bfloat16.log 2>&1; echo "c64 bf16 rc=$?"
grep -h "gluon .*/\|^| 64" $OUT/run3/*.log | cut -c1-120
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
