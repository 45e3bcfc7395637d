#!/bin/bash
# 2026-12-05 late session, device call A: the O-offsets forward's GPU checks, the int-length decode
# replays, then the host targets. Carry .abfiles (forward.py before and after 8438d0b) for the A/B.
set -u
# the O-offsets forward is not applied on main until it has run on a GPU: apply it here first
[ -f tools/patches/gluon-forward-own-o-offsets.patch ] && { patch -p1 --forward < tools/patches/gluon-forward-own-o-offsets.patch > /dev/null && echo "patch applied" || echo "PATCH FAILED"; }
cp tileflash/ops/gluon/forward.py .abfiles/forward_new.py 2>/dev/null
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown} PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
TESTS_LIMIT=200 TESTS_ARGS="tests/test_forward_sm90.py tests/test_options.py tests/test_kvcache.py" \
  bash tools/gpu_run.sh tests host
cp "$OUT/host.log" "$OUT/host1.log"
timeout 100 python3 -m tileflash bench --decode --batch 1 --seqlens 8192 --out "$OUT/decode" > "$OUT/decode.log" 2>&1
echo "decode rc=$?"; tail -n 8 "$OUT/decode.log"
timeout 100 python3 tools/sdpa_layout.py > "$OUT/sdpa_layout.log" 2>&1; echo "sdpa_layout rc=$?"; tail -n 6 "$OUT/sdpa_layout.log"
if [ -f .abfiles/forward_old.py ]; then   # forward A/B: after (8438d0b) and before, one process each
  for arm in new old; do
    cp .abfiles/forward_$arm.py tileflash/ops/gluon/forward.py
    timeout 90 python3 -m tileflash bench --modes fwd --providers tileflash --seqlens 8192 --head-dim 64 128 \
      --no-plots --out "$OUT/fab-$arm" > "$OUT/fab-$arm.log" 2>&1; echo "fwd A/B $arm rc=$?"
    grep -E "^tileflash" "$OUT/fab-$arm.log" | head -n 8
  done
  cp .abfiles/forward_new.py tileflash/ops/gluon/forward.py
fi
[ "${SECOND_HOST:-0}" = 1 ] && bash tools/gpu_run.sh host
