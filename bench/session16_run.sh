#!/bin/bash
# Session 16's device calls (bench/BENCHMARKS.md, "Session 16"), run from the repository root on
# the GPU machine: PHASE picks the call; the source is a snapshot (git archive) carried as $SRC.
# The switches the sides set existed only in the commits those calls measured, each change
# removed after its call (bench/BENCHMARKS.md, "Session 16"): MOESERVE_MOE_FUSED=0 turned the
# batch-1 fused experts kernel off (084cc79, phase 1; removed in 54b8557), MOESERVE_NORM_ROUTE=0
# the norm made inside the router's kernel (1de0ef4 / 247ed82, phases 4 and 5; removed in 84ccb00).
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC
OFF=off:MOESERVE_MOE_FUSED=0

# PHASE=1: the fused experts kernel: its tests and bench, the decode-path tests, bench-one-batch
#   off / on alternating at B = 1 (Qwen3 takes it; V2-Lite's down rows do not fit shared memory,
#   so it is the control), timelines both ways, the other decode tests, B = 8 and 64 (not taken).
if [ $PHASE = 1 ]; then
  JOBS=15 build_after ms_kernel_trace test_cuda_moe_fused test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_moe_route test_cuda_attention_moe test_cuda_gemv
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  gtest moe_fused 120 /tmp/b/tests/test_cuda_moe_fused
  MOESERVE_BENCH_MOE_FUSED=1 gtest moe_fused_bench 120 /tmp/b/tests/test_cuda_moe_fused --gtest_filter='*Bench*'
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs
  wait
  for r in 1 2 3; do SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $OFF" bench_sides qwen3 "1 4096 16"; done
  SIDES="$OFF on" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_MOE_FUSED=0
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_attention_moe test_cuda_gemv
  SIDES="$OFF on" bench_sides qwen3 "8 4096 16" "64 256 16"
  log done
fi
# PHASE=2: $SRC = main with bench/gpu_pending.patch (the shared expert's products launched right
#   after the router) against $BEFORE_SRC = main: the ceilings, the decode-path tests, V2-Lite
#   (no shared-experts fusion by default: the patch's case) alternating at B = 1 (three rounds), 8
#   and 64, Qwen3 (no shared expert: the control), V2-Lite's timeline with the patch.
if [ $PHASE = 2 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  for r in 1 2 3; do SIDES="before after" bench_sides v2lite "1 4096 16"; SIDES="after before" bench_sides v2lite "1 4096 16"; done
  SIDES="before after" bench_sides qwen3 "1 4096 16"
  SIDES="after before" bench_sides v2lite "8 4096 16" "64 256 16"
  trace v2lite 1 4096 after
  log done
fi
# PHASE=3: the session's final tree: the ceilings, bench-one-batch at the targets' shapes (B = 1
#   three times each, B = 64, the 8k prefills), then every single-GPU test program while time is left.
if [ $PHASE = 3 ]; then
  TESTS=$(gpu_tests_of $SRC)
  JOBS=15 build_after ms_cuda_ceilings $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  wait
  for r in 1 2 3; do SIDES="final" bench_sides qwen3 "1 4096 16"; SIDES="final" bench_sides v2lite "1 4096 16"; done
  SIDES="final" bench_sides qwen3 "64 256 16" "1 8192 2"
  SIDES="final" bench_sides v2lite "64 256 16" "1 8192 2"
  for t in $TESTS; do [ $(left) -gt 60 ] && run_gpu_tests /tmp/b $t; done
  log done
fi
# PHASE=4: the post-attention norm made inside the router's kernel (add_rms_norm_route), on and off
#   in one binary (MOESERVE_NORM_ROUTE=0): its tests, the decode-path tests, bench-one-batch
#   alternating at B = 1 (three rounds each model), 8 and 64, timelines both ways.
if [ $PHASE = 4 ]; then
  NOFF=off:MOESERVE_NORM_ROUTE=0
  JOBS=15 build_after ms_kernel_trace test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs
  MOESERVE_NORM_ROUTE=0 gtest fixtures-off 120 /tmp/b/tests/test_cuda_fixtures
  wait
  for r in 1 2 3; do
    SIDES="$NOFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $NOFF" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_NORM_ROUTE=0
  SIDES="$NOFF on" bench_sides qwen3 "8 4096 16" "64 256 16"
  SIDES="on $NOFF" bench_sides v2lite "8 4096 16" "64 256 16"
  run_gpu_tests /tmp/b test_cuda_attention_moe
  log done
fi
# PHASE=5: phase 4 again after its fix (the first run's norm-in-router launches failed at
#   cudaFuncSetAttribute), cut to the device time left: its tests, then B = 1 alternating.
if [ $PHASE = 5 ]; then
  NOFF=off:MOESERVE_NORM_ROUTE=0
  JOBS=16 build_after test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs
  wait
  for r in 1 2 3; do
    SIDES="$NOFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $NOFF" bench_sides v2lite "1 4096 16"
  done
  log done
fi
