#!/bin/bash
# Nsight Compute on decode steps (scripts/ncu_decode.py): per kernel, its time, DRAM bytes read and
# DRAM / SM throughput against peak, grid size. Usage: OUT=dir bash scripts/ncu_decode.sh [ncu_decode.py args]
set -u
export PYTHONPATH=${PYTHONPATH:-.}
OUT=${OUT:-/tmp/ncu}; mkdir -p "$OUT"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread
ncu --clock-control none --profile-from-start off --metrics "$M" python3 scripts/ncu_decode.py "$@" > "$OUT/ncu-decode.txt" 2>&1
grep -E "^== |^  [a-zA-Z_].*\(|gpu__time_duration|dram__|sm__throughput|launch__grid_size" "$OUT/ncu-decode.txt" | sed 's/  */ /g'
