#!/bin/bash
# Session 21, run 3: where the fused backward's time goes. fused_bwd_check.py --modes at D=128 16k
# (the kernel with no dQ write / a plain TMA store / the unordered and ordered adds, next to the split
# kernels alone), then Nsight Compute on the fused kernel, the split kernels and cuDNN's backward (N=8k).
set -u
export PYTHONPATH=.:scripts
mkdir -p $OUT/run3
timeout 200 python3 scripts/fused_bwd_check.py --d 128 --sizes 16384 --modes > $OUT/run3/modes.log 2>&1
echo "modes rc=$?"
grep -E "us \(" $OUT/run3/modes.log | cut -c1-160
OUT=$OUT/run3 timeout 330 bash scripts/ncu_attn.sh fbwd128 bwd128 cbwd128 > $OUT/run3/ncu-summary.log 2>&1
echo "ncu rc=$?"
grep -E "^==|Duration|Tensor|tensor_op|pipe_tensor|Issue Slots Busy|stalled_(barrier|long_scoreboard|wait|math|mio|short|no_inst|not_sel|selected|sleeping|dispatch|membar|lg|branch|drain|imc|tex)" $OUT/run3/ncu-summary.log | sed 's/  */ /g' | cut -c1-150 | head -90
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
