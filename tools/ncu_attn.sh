#!/bin/bash
# Nsight Compute on the H200: pipe utilizations, issue activity and warp stall reasons of the
# attention kernels (Gluon forward, cuDNN, the backward), one profile per case (tools/ncu_target.py).
# Usage: OUT=dir bash tools/ncu_attn.sh [case ...]   (cases below; default: all)
# Writes $OUT/ncu-<case>.txt; prints the summary lines. Needs ncu (Nsight Compute) with counters.
# NCU_SOURCE=1 adds, for the 16k backward cases, the stall samples per SASS instruction (src() below).
set -u
export PYTHONPATH=${PYTHONPATH:-.}
# FA4's cases need its site (tools/gpu_run.sh unpacks the carried .fa4 tarballs to /tmp/fa4)
[ -d /tmp/fa4 ] && export PYTHONPATH=$PYTHONPATH:/tmp/fa4:/tmp/fa4/nvidia_cutlass_dsl/dsl_packages
OUT=${OUT:-/tmp/ncu}; mkdir -p "$OUT"
M='regex:^((sm__pipe_.*_cycles_active|sm__inst_executed_pipe_.*|sm__issue_active|smsp__issue_active)\.avg\.pct_of_peak_sustained_active|smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio)$'
run() {  # name kernel-regex target-args...
  local name=$1 kre=$2; shift 2
  ncu --clock-control none -k "regex:$kre" --profile-from-start off \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --metrics "$M" \
      python3 tools/ncu_target.py "$@" > "$OUT/ncu-$name.txt" 2>&1
  echo "== $name"; grep -E "^  [a-zA-Z_].*\\(|Duration|pct_of_peak|stalled|Issue Slots|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued" "$OUT/ncu-$name.txt" | sed 's/  */ /g' | head -60
}
# NCU_SOURCE=1: also per-SASS-instruction stall samples of the case's main kernel (one launch; FA4:
# its FlashAttentionBackwardSm90 kernel), summarised by tools/ncu_source.py into $OUT/src-<case>.md
# (the CSV beside it; the .ncu-rep is deleted unless NCU_KEEP_REP=1)
src() {  # name kernel-regex target-args...
  [ "${NCU_SOURCE:-0}" = 1 ] || return 0
  local name=$1 kre=$2; shift 2
  [ "$kre" = . ] && kre=FlashAttentionBackwardSm90
  ncu --clock-control none -k "regex:$kre" -c 1 --profile-from-start off --section SourceCounters \
      --section WarpStateStats -f -o "$OUT/rep-$name" python3 tools/ncu_target.py "$@" > "$OUT/src-$name.log" 2>&1
  ncu --import "$OUT/rep-$name.ncu-rep" --page source --csv --print-source sass > "$OUT/src-$name.csv" 2>> "$OUT/src-$name.log"
  python3 tools/ncu_source.py "$OUT/src-$name.csv" > "$OUT/src-$name.md" 2>> "$OUT/src-$name.log"
  echo "== source $name"; head -n 16 "$OUT/src-$name.md"
  [ "${NCU_KEEP_REP:-0}" = 1 ] || rm -f "$OUT/rep-$name.ncu-rep"
}
CASES=${*:-"g64 g64ws c64 g128 c128 bwd128 cbwd128"}
for c in $CASES; do case $c in
  g64)    run g64 _attn_fwd gluon --d 64 --n 8192 ;;
  g64ws)  run g64ws _attn_fwd gluon --d 64 --n 8192 --cfg '{"BLOCK_M":128,"BLOCK_N":128,"STAGES":3,"num_warps":4,"WS":true}' ;;
  c64)    run c64 '.' cudnn --d 64 --n 8192 ;;
  g128)   run g128 _attn_fwd gluon --d 128 --n 8192 ;;
  c128)   run c128 '.' cudnn --d 128 --n 8192 ;;
  bwd128) run bwd128 '_attn_bwd_sm90|_bwd_dq' bwd --d 128 --n 8192 ;;
  cbwd128) run cbwd128 '.' cudnn-bwd --d 128 --n 8192 ;;
  bwd64)  run bwd64 '_attn_bwd_sm90|_bwd_dq' bwd --d 64 --n 8192 ;;
  # the fused backward (opt-in, docs/perf-notes.md): one kernel, dQ by ordered TMA reductions
  fbwd128) export TILEFLASH_DEBUG=gluon_fused=1; run fbwd128 '_attn_bwd_sm90' bwd --d 128 --n 8192; unset TILEFLASH_DEBUG ;;
  cbwd64) run cbwd64 '.' cudnn-bwd --d 64 --n 8192 ;;
  # at 16k, D = 128 non-causal: deterministic=False routes to the fused kernel (unordered dQ sums)
  nbwd128k16) run nbwd128k16 '_attn_bwd_sm90' bwd --d 128 --n 16384; src nbwd128k16 '_attn_bwd_sm90' bwd --d 128 --n 16384 ;;
  dbwd128k16) run dbwd128k16 '_attn_bwd_sm90|_bwd_dq' bwd --d 128 --n 16384 --deterministic ;;
  fa4bwd128k16) run fa4bwd128k16 '.' fa4-bwd --d 128 --n 16384; src fa4bwd128k16 '.' fa4-bwd --d 128 --n 16384 ;;
  fa4bwd128) run fa4bwd128 '.' fa4-bwd --d 128 --n 8192 ;;
  # D = 64 at 16k: deterministic=False routes to the fused kernel too (both lengths >= 16384)
  nbwd64k16) run nbwd64k16 '_attn_bwd_sm90' bwd --d 64 --n 16384; src nbwd64k16 '_attn_bwd_sm90' bwd --d 64 --n 16384 ;;
  fa4bwd64k16) run fa4bwd64k16 '.' fa4-bwd --d 64 --n 16384; src fa4bwd64k16 '.' fa4-bwd --d 64 --n 16384 ;;
esac; done
