#!/bin/bash
# Session 27's device calls (bench/BENCHMARKS.md, "Session 27"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 (a snapshot of main with `git apply bench/gpu_pending.patch` (session 26's), as $SRC:
#   dense products of one row tile in half slabs where that spreads their blocks more evenly,
#   MOESERVE_GEMV_HALF=0 the whole slabs): the ceilings; the GEMV tests (the bits of both) and the
#   models' tests; the GEMV bench both ways; B = 1 rotating, both models; timelines both ways.
if [ $PHASE = 1 ]; then
  JOBS=14 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench-half 120 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  MOESERVE_BENCH_GEMV=1 MOESERVE_GEMV_HALF=0 gtest gemv-bench-full 120 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  wait
  FULL=full:MOESERVE_GEMV_HALF=0
  b1_rounds "$FULL half" "$FULL half"
  trace qwen3 1 4096 half; trace qwen3 1 4096 full MOESERVE_GEMV_HALF=0
  trace v2lite 1 4096 half; trace v2lite 1 4096 full MOESERVE_GEMV_HALF=0
  log done
fi
