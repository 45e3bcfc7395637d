#!/bin/bash
# 2026-12-05 late session, device call A: the O-offsets forward's GPU checks, then the host targets.
set -u
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
TESTS_LIMIT=240 TESTS_ARGS="tests/test_forward_sm90.py tests/test_options.py tests/test_kvcache.py" bash tools/gpu_run.sh tests host
cp "$OUT/host.log" "$OUT/host1.log"
timeout 120 python3 tools/sdpa_layout.py > "$OUT/sdpa_layout.log" 2>&1; echo "sdpa_layout rc=$?"; cat "$OUT/sdpa_layout.log" | tail -n 6
timeout 120 python3 -m tileflash bench --decode --batch 1 --seqlens 8192 --out "$OUT/decode" > "$OUT/decode.log" 2>&1; echo "decode rc=$?"; tail -n 8 "$OUT/decode.log"
bash tools/gpu_run.sh host
