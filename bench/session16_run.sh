#!/bin/bash
# Session 16's device calls (bench/BENCHMARKS.md, "Session 16"), run from the repository root on
# the GPU machine: PHASE picks the call; the source is a snapshot (git archive) carried as $SRC.
# MOESERVE_MOE_FUSED=0 turns the batch-1 fused experts kernel (moe_experts_fused.h) off in the
# same binary, so "off" and "on" sides are one build.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
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
