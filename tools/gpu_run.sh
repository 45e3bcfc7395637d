#!/bin/bash
# One device call on a CUDA machine: versions, then the stages named on the command line, each
# under its own time limit, logs and results under $OUT (the device tool brings them back).
#
#   tests        the CUDA test suite (pytest -n 14; every CPU-only case skips itself there); the log names
#                every test (-v), so a run cut off by TESTS_LIMIT shows which ran (and, interrupted at the limit,
#                still prints the failures' tracebacks and summary); TESTS_ARGS picks files
#                (split on spaces, no quoting; default: all of tests/), TESTS_K a -k expression
#   grid-DTYPE   the D 64/128 x N 1k-16k x causal grid, forward and backward (GRID_MODES=bwd: one), against
#                cuDNN and SDPA-flash (and FA4 when it imports: below), then tools/grid_report.py
#   host         tileflash bench --host (per-call host cost) with cProfile statistics of tileflash's calls
#   layers       tools/host_layers.py (host time of each layer of the call path)
#   autograd     tools/host_autograd.py (forward + backward host time against a bare autograd function)
#   growth       tools/decode_growth.py (a growing-cache decode loop: tileflash against SDPA, cProfile)
#   hf           tools/hf_bench.py (a ~1B Llama through transformers: generate and train against sdpa)
#   ptx          tools/compile_check.py --ptx-digests with the machine's triton (compare trees)
#   ab           tools/fused_ab.py (backward designs: split, fused ordered/unordered, FA4, cuDNN; AB_ARGS)
#   diag         tools/hf_diag.py (where a transformers B=1 generate's time goes, variants)
#   lse3         the checks of the 2026-12-04 session's unrun work: its GPU tests (LSE scratch, LSE_EARLY=3
#                bits and schedules), then tools/fused_ab.py with LSE_EARLY=3 for the fused and dK/dV kernels
#   ab64         tools/fused_ab.py at D = 64 with the fused kernel's tile candidates of a compile sweep
#   alt          the fused-mode GPU tests (DQ_ALT variants included), then tools/fused_ab.py at D = 64 with DQ_ALT
#                (the consumers take turns at whole dQ parts) at the route's 64-row and at 128-row Q blocks
#   late         tools/fused_ab.py at D = 64 with DQ_LATE, then the fused-schedule GPU tests
#   msplit       the fused-schedule GPU tests (DQ_MSPLIT variants included), then tools/fused_ab.py at D = 64
#                with DQ_MSPLIT (FA4's row split of dQ, 128-row Q blocks), alone and with DQ_FIRST, and the
#                128-row column halves with DQ_FIRST, beside the route's config, FA4 and cuDNN
#   perhead      the fused-mode GPU tests (the per-head launch order's included), then tools/fused_ab.py with
#                the route's unordered config (PER_HEAD since e00c8c0: a head's K blocks launched together)
#                beside the same kernel in the old 2-D grid (PER_HEAD false), FA4 and cuDNN
#   cast         tools/cast_ab.py (the fused backward's dQ scale-and-cast: torch.mul against our kernel), the
#                scale_cast GPU tests, then tools/bwd_kernels.py at 2k with the debug switch scale_cast=0 and 1
#   zero         the delta kernel zeroing the fused backward's dQ sums: its GPU tests, tools/bwd_kernels.py at
#                2k and 16k (fused against fused_memset), tools/fused_ab.py at 1k (split against fused)
#   followup     the GPU checks the 2026-12-06 08:10 UTC session left (testing.md): GPU tests, the fused step's host time,
#   host36       the checks the 2026-12-06 10:08 UTC session left (testing.md): the drop-in and kvcache fake tests on
#                CUDA (the review's fixes, CPU-tested only), then tileflash bench --host --rounds 9, twice
#   ptrab        launches taking raw pointers as integers (debug switch ptr_ints, default 1 since 6a6b43e): tools/host_ab.py --switch
#                ptr_ints twice (bitwise check of both arms first), tileflash bench --host --rounds 9, then the
#                GPU tests of every planned launch with the switch on (options, kvcache, backward_sm90, forward_sm90; TESTS_K)
#   thread       tools/host_thread.py (pieces of the replayed backward on the main thread against another thread)
#   ncusrc       tools/ncu_attn.sh with NCU_SOURCE=1 on the 16k backward cases (ours and FA4's, D 64/128):
#                where the stall samples sit, per SASS instruction (tools/ncu_source.py)
#
# FA4 (flash-attn-4) joins the grid when .fa4/fa4-site.tar.xz is carried: a site folder of its
# wheels (flash-attn-4 4.0.0b36, nvidia-cutlass-dsl 4.8.1 + libs-base, libs-core (cutlass.cute's Python)
# and libs-cu13, quack-kernels 0.6.5, apache-tvm-ffi, torch-c-dlpack-ext, protobuf) packed with xz;
# it and any other .fa4/*.tar.xz (e.g. a package added later) are unpacked to /tmp/fa4.
# tools/fa4_site.sh builds it (here, where PyPI is reachable).
#
# Usage (repository root): OUT=dir bash tools/gpu_run.sh tests grid-float16 grid-bfloat16
# Pass TILEFLASH_GIT=<sha> from the working machine: `git rev-parse` in the device's copy can name an older commit
# (its git metadata is not the tree's; seen 2026-12-06).
set -u
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TILEFLASH_GIT=${TILEFLASH_GIT:-unknown}
mkdir -p "$OUT"
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" \
    | tee "$OUT/versions.txt"
if [ -f .fa4/fa4-site.tar.xz ]; then
  mkdir -p /tmp/fa4 && for t in .fa4/*.tar.xz; do tar -xJf "$t" -C /tmp/fa4; done \
    && export PYTHONPATH=$PYTHONPATH:/tmp/fa4:/tmp/fa4/nvidia_cutlass_dsl/dsl_packages
fi
providers="tileflash sdpa_cudnn sdpa_flash"
python3 -c "import flash_attn.cute" > "$OUT/fa4-import.log" 2>&1 && providers="$providers fa4"
echo "providers: $providers"

# pytest under a time limit: SIGINT at the limit, not timeout's SIGTERM, so that pytest still prints the tracebacks
# of the failures so far and their summary, which a killed run loses (-k 30: killed if not ended 30 s later).
#   limited_pytest LIMIT_S PYTEST_ARGS...
limited_pytest() { local limit=$1; shift; timeout -s INT -k 30 "$limit" python3 -m pytest -p no:cacheprovider "$@"; }
for stage in "$@"; do
  case $stage in
    tests)
      limited_pytest ${TESTS_LIMIT:-400} -v -rf -n 14 ${TESTS_ARGS:-tests} ${TESTS_K:+-k "$TESTS_K"} > "$OUT/tests.log" 2>&1
      echo "tests rc=$? $(tail -n 1 "$OUT/tests.log")"
      # (counted from the per-test lines, which a run cut off by the limit still has)
      echo "tests so far: $(grep -c ' PASSED ' "$OUT/tests.log") passed, $(grep -c ' FAILED ' "$OUT/tests.log") failed," \
           "$(grep -c ' SKIPPED ' "$OUT/tests.log") skipped"; grep ' FAILED ' "$OUT/tests.log" | head -n 20
      sed -n '/short test summary info/,$p' "$OUT/tests.log" | grep '^FAILED' | cut -c1-300 | head -n 20 ;;
    grid-*)
      dt=${stage#grid-}
      for mode in ${GRID_MODES:-fwd bwd}; do
        extra=""; [ $mode = bwd ] && extra=tileflash_det  # the deterministic=True backward beside the default
        timeout ${BENCH_LIMIT:-200} python3 -m tileflash bench --modes $mode --dtype $dt --providers $providers $extra \
            --seqlens 1024 2048 4096 8192 16384 --head-dim 64 128 --no-plots --out "$OUT/$mode-$dt" > "$OUT/$mode-$dt.log" 2>&1
        echo "bench $mode $dt rc=$?"
        python3 tools/grid_report.py "$OUT/$mode-$dt" > "$OUT/report-$mode-$dt.md" 2>&1
        tail -n 3 "$OUT/report-$mode-$dt.md"
      done ;;
    host)
      timeout ${HOST_LIMIT:-120} python3 -m tileflash bench --host --profile "$OUT/host-profile.txt" > "$OUT/host.log" 2>&1
      echo "host rc=$?"; tail -n 12 "$OUT/host.log" ;;
    layers)
      timeout 120 python3 tools/host_layers.py > "$OUT/layers.log" 2>&1
      echo "layers rc=$?"; cat "$OUT/layers.log" | tail -n 14 ;;
    autograd)
      timeout 150 python3 tools/host_autograd.py > "$OUT/autograd.log" 2>&1
      echo "autograd rc=$?"; head -n 10 "$OUT/autograd.log" ;;
    growth)
      timeout 180 python3 tools/decode_growth.py > "$OUT/growth.log" 2>&1
      echo "growth rc=$?"; head -n 4 "$OUT/growth.log" ;;
    hf)
      timeout ${HF_LIMIT:-300} python3 tools/hf_bench.py ${HF_ARGS:-} > "$OUT/hf.log" 2>&1
      echo "hf rc=$?"; tail -n 8 "$OUT/hf.log" ;;
    ab)
      timeout ${AB_LIMIT:-330} python3 tools/fused_ab.py ${AB_ARGS:-} > "$OUT/fused_ab.log" 2>&1
      echo "ab rc=$?"; tail -n 24 "$OUT/fused_ab.log" ;;
    diag)
      PYTHONPATH=$PYTHONPATH:tools timeout 200 python3 tools/hf_diag.py > "$OUT/diag.log" 2>&1
      echo "diag rc=$?"; tail -n 10 "$OUT/diag.log" ;;
    lse3)
      limited_pytest ${TESTS_LIMIT:-300} -q -rf -n 14 tests/test_kvcache.py \
          tests/test_options.py tests/test_backward_sm90.py \
          -k "scratch or without_lse or lse_early or fused_schedule or replay or protocol or growing or prepared_signature" \
          > "$OUT/lse3-tests.log" 2>&1
      echo "lse3 tests rc=$? $(tail -n 1 "$OUT/lse3-tests.log")"
      # D = 128: LSE_EARLY=3 alone, with one dQ staging slot (no spills), and with a 3-deep Q/dO ring too
      timeout ${AB_LIMIT:-240} python3 tools/fused_ab.py --dims 128 --seqlens 4096 16384 --dtypes float16 \
          --fused-cfg '{"LSE_EARLY": 3}' --fused-cfg '{"LSE_EARLY": 3, "DQ_BUFS": 1}' \
          --fused-cfg '{"LSE_EARLY": 3, "DQ_BUFS": 1, "STAGES": 3}' --dkdv-cfg '{"LSE_EARLY": 3}' \
          > "$OUT/lse3-ab128.log" 2>&1
      echo "lse3 ab D=128 rc=$?"; tail -n 8 "$OUT/lse3-ab128.log"
      timeout ${AB_LIMIT:-200} python3 tools/fused_ab.py --dims 64 --seqlens 4096 16384 --dtypes float16 \
          --fused-cfg '{"LSE_EARLY": 3}' --fused-cfg '{"LSE_EARLY": 3, "DQ_BUFS": 1}' --dkdv-cfg '{"LSE_EARLY": 3}' \
          > "$OUT/lse3-ab64.log" 2>&1
      echo "lse3 ab D=64 rc=$?"; tail -n 8 "$OUT/lse3-ab64.log" ;;
    ab64)
      # D = 64 fused unordered candidates from a compile sweep (2026-12-05, perf-notes "Untried levers"):
      # 64-row Q blocks (no spills, 133 KB of shared memory) and with a 3-slot ring (the ring with
      # 128-row blocks needs 265,776 bytes of shared memory: it does not fit). Since 921fa7d the route's
      # non-causal config has 64 rows, so fused_base and the first candidate are the same kernel there.
      timeout ${AB_LIMIT:-240} python3 tools/fused_ab.py --dims 64 --seqlens 4096 8192 16384 --dtypes float16 \
          --fused-cfg '{"BLOCK_M": 64}' --fused-cfg '{"BLOCK_M": 64, "STAGES": 3}' \
          > "$OUT/ab64.log" 2>&1
      echo "ab64 rc=$?"; tail -n 10 "$OUT/ab64.log" ;;
    alt)
      limited_pytest ${TESTS_LIMIT:-150} -q -rf -n 8 tests/test_backward_sm90.py \
          -k "fused_schedule or protocol or unordered or fused_mode" > "$OUT/alt-tests.log" 2>&1
      echo "alt tests rc=$? $(tail -n 1 "$OUT/alt-tests.log")"
      timeout ${AB_LIMIT:-300} python3 tools/fused_ab.py --dims 64 --seqlens ${AB_SEQLENS:-4096 8192 16384} \
          --dtypes float16 --fused-cfg '{"DQ_ALT": true}' --fused-cfg '{"DQ_ALT": true, "BLOCK_M": 128}' \
          > "$OUT/alt-ab.log" 2>&1
      echo "alt ab rc=$?"; tail -n 12 "$OUT/alt-ab.log" ;;
    late)
      # DQ_LATE (a block's dQ halves staged under the next block's first matmuls) at D = 64, then its GPU tests
      timeout ${AB_LIMIT:-200} python3 tools/fused_ab.py --dims 64 --seqlens ${AB_SEQLENS:-8192 16384} \
          --dtypes float16 --fused-cfg '{"DQ_LATE": true}' > "$OUT/late-ab.log" 2>&1
      echo "late ab rc=$?"; tail -n 8 "$OUT/late-ab.log"
      limited_pytest ${TESTS_LIMIT:-120} -q -rf -n 8 tests/test_backward_sm90.py \
          -k "fused_schedule or protocol" > "$OUT/late-tests.log" 2>&1
      echo "late tests rc=$? $(tail -n 1 "$OUT/late-tests.log")" ;;
    msplit)
      limited_pytest ${TESTS_LIMIT:-150} -q -rf -n 8 tests/test_backward_sm90.py \
          -k "fused_schedule or protocol or row_split" > "$OUT/msplit-tests.log" 2>&1
      echo "msplit tests rc=$? $(tail -n 1 "$OUT/msplit-tests.log")"
      timeout ${AB_LIMIT:-360} python3 tools/fused_ab.py --dims 64 --seqlens ${AB_SEQLENS:-2048 8192 16384} \
          --dtypes float16 --fused-cfg '{"BLOCK_M": 128, "DQ_MSPLIT": true}' \
          --fused-cfg '{"BLOCK_M": 128, "DQ_MSPLIT": true, "DQ_FIRST": true}' \
          --fused-cfg '{"BLOCK_M": 128, "DQ_FIRST": true}' > "$OUT/msplit-ab.log" 2>&1
      echo "msplit ab rc=$?"; grep -E "N=|rc=|Error|error" "$OUT/msplit-ab.log" | tail -n 40 ;;
    perhead)   # the fused kernel in the per-head launch order (the unordered default): its GPU tests, then the A/B
      limited_pytest ${TESTS_LIMIT:-150} -q -rf -n 8 tests/test_backward_sm90.py \
          -k "fused_schedule or either_order or per_head_order or protocol" > "$OUT/perhead-tests.log" 2>&1
      echo "perhead tests rc=$? $(tail -n 1 "$OUT/perhead-tests.log")"
      timeout ${AB_LIMIT:-400} python3 tools/fused_ab.py --dims ${AB_DIMS:-64 128} --seqlens ${AB_SEQLENS:-2048 16384} \
          --dtypes float16 --fused-cfg '{"PER_HEAD": false}' > "$OUT/perhead-ab.log" 2>&1
      echo "perhead ab rc=$?"; grep -E "N=|rc=|Error|error" "$OUT/perhead-ab.log" | tail -n 40 ;;
    ncusrc)
      NCU_SOURCE=1 timeout ${NCU_LIMIT:-400} bash tools/ncu_attn.sh ${NCU_CASES:-nbwd64k16 fa4bwd64k16 nbwd128k16 fa4bwd128k16} \
          > "$OUT/ncusrc.log" 2>&1
      echo "ncusrc rc=$?"; grep -A 12 "^== source" "$OUT/ncusrc.log" | head -n 60 ;;
    cast)      # the fused backward's dQ scale-and-cast kernel (the default since 6f72bbd; scale_cast=0: torch.mul): its A/B, its GPU tests,
               # then the backward kernel by kernel with the switch off and on
      timeout 90 python3 tools/cast_ab.py > "$OUT/cast-ab.log" 2>&1
      echo "cast ab rc=$?"; tail -n 6 "$OUT/cast-ab.log"
      limited_pytest ${TESTS_LIMIT:-150} -q -rf -n 8 tests/test_backward_sm90.py \
          -k "scale_cast or repeated_fused" > "$OUT/cast-tests.log" 2>&1
      echo "cast tests rc=$? $(tail -n 1 "$OUT/cast-tests.log")"
      for sw in 0 1; do
        TILEFLASH_DEBUG=scale_cast=$sw PYTHONPATH=$PYTHONPATH:tools timeout 120 python3 tools/bwd_kernels.py --dims 64 128 \
            --seqlens 2048 --iters 10 > "$OUT/cast-bwd-$sw.log" 2>&1
        echo "bwd_kernels scale_cast=$sw rc=$?"; grep -A 5 " fused: wall" "$OUT/cast-bwd-$sw.log"
      done ;;
    zero)      # the delta kernel zeroing the fused backward's dQ sums (no memset launch), scale_cast by default:
               # their GPU tests, the backward kernel by kernel (fused against fused_memset, the old way), then
               # the split pair against the fused kernel at 1k (since ccf0390 the route takes the fused one there non-causal)
      limited_pytest ${TESTS_LIMIT:-200} -q -rf -n 8 tests/test_backward_sm90.py \
          -k "zeroes or delta_launch or scale_cast or repeated_fused or fused_schedule or fused_mode or unordered or either_order" \
          > "$OUT/zero-tests.log" 2>&1
      echo "zero tests rc=$? $(tail -n 1 "$OUT/zero-tests.log")"; grep -E "^FAILED|Error" "$OUT/zero-tests.log" | head -n 10
      PYTHONPATH=$PYTHONPATH:tools timeout 200 python3 tools/bwd_kernels.py --dims 64 128 --seqlens ${ZERO_SEQLENS:-2048 16384} \
          --iters 10 > "$OUT/zero-bwd.log" 2>&1
      echo "bwd_kernels rc=$?"; grep -A 8 "^| D | N" "$OUT/zero-bwd.log" | head -n 40
      timeout ${AB_LIMIT:-200} python3 tools/fused_ab.py --dims 64 128 --seqlens 1024 --dtypes float16 > "$OUT/zero-ab1k.log" 2>&1
      echo "ab 1k rc=$?"; tail -n 8 "$OUT/zero-ab1k.log" ;;
    followup)  # what the 2026-12-06 08:10 UTC session left for the GPU (docs/testing.md): the GPU tests its review
               # fixes touched, the four test files it did not run, then the fused step's host issue time
      limited_pytest ${TESTS_LIMIT:-150} -q -rf -n 8 tests/test_backward_sm90.py \
          -k "zeroes or broken_fused or refuses_buffers or scale_cast or fused" \
          > "$OUT/followup-bwd-tests.log" 2>&1
      echo "followup backward tests rc=$? $(tail -n 1 "$OUT/followup-bwd-tests.log")"
      grep -E "^FAILED" "$OUT/followup-bwd-tests.log" | head -n 20
      limited_pytest ${TESTS_LIMIT2:-300} -q -rf -n 14 tests/test_forward_sm90.py \
          tests/test_forward.py tests/test_kvcache.py > "$OUT/followup-tests.log" 2>&1
      echo "followup tests rc=$? $(tail -n 1 "$OUT/followup-tests.log")"; grep -E "^FAILED" "$OUT/followup-tests.log" | head -n 20
      # (its 4097-head cases ran out of an H100's memory under 14 workers: 2 here)
      limited_pytest 150 -q -rf -n 2 tests/test_grid_limit.py > "$OUT/followup-grid.log" 2>&1
      echo "grid-limit tests rc=$? $(tail -n 1 "$OUT/followup-grid.log")"
      timeout 150 python3 tools/step_kernels.py --batches 2 4 --seqlens 4096 --causal 0 1 --iters 50 \
          > "$OUT/followup-step.log" 2>&1
      echo "step_kernels rc=$?"; tail -n 12 "$OUT/followup-step.log"
      ;;
    host36)
      limited_pytest 240 -q -rf -n 8 tests/test_options.py tests/test_kvcache.py \
          -k "drop_in or query_memory or fit_puts or strides_match_its_fake or like_inputs or split_partials" > "$OUT/host36-tests.log" 2>&1
      echo "host36 tests rc=$? $(tail -n 1 "$OUT/host36-tests.log")"; grep -E "^FAILED" "$OUT/host36-tests.log" | head
      for run in 1 2; do
        timeout ${HOST_LIMIT:-200} python3 -m tileflash bench --host --rounds 9 > "$OUT/host36-$run.log" 2>&1
        echo "host run $run rc=$?"; head -n 25 "$OUT/host36-$run.log" | grep -E "tileflash|tf_sdpa| sdpa "
      done ;;
    ptrab)
      for run in 1 2; do
        timeout 120 python3 tools/host_ab.py --switch ptr_ints > "$OUT/ptrab-$run.log" 2>&1
        echo "host_ab run $run rc=$?"; tail -n 14 "$OUT/ptrab-$run.log"
      done
      timeout ${HOST_LIMIT:-150} python3 -m tileflash bench --host --rounds 9 > "$OUT/ptrab-host.log" 2>&1
      echo "host rc=$?"; head -n 25 "$OUT/ptrab-host.log" | grep -E "tileflash|tf_sdpa| sdpa "
      TILEFLASH_DEBUG=ptr_ints=1 limited_pytest ${TESTS_LIMIT:-280} -q -rf -n 14 tests/test_options.py \
          tests/test_kvcache.py tests/test_backward_sm90.py tests/test_forward_sm90.py \
          -k "${TESTS_K:-not d256 and not writes_every and not compile_for_sm90}" > "$OUT/ptrab-tests.log" 2>&1
      echo "ptrab tests rc=$? $(tail -n 1 "$OUT/ptrab-tests.log")"; grep -E "^FAILED" "$OUT/ptrab-tests.log" | head ;;
    thread)
      timeout 150 python3 tools/host_thread.py > "$OUT/thread.log" 2>&1
      echo "host_thread rc=$?"; tail -n 9 "$OUT/thread.log" ;;
    ptx)
      timeout ${PTX_LIMIT:-400} python3 tools/compile_check.py --ptx-digests "$OUT/ptx.json" > "$OUT/ptx.log" 2>&1
      echo "ptx rc=$? $(tail -n 1 "$OUT/ptx.log")" ;;
    *) echo "unknown stage $stage" ;;
  esac
done
