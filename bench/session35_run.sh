#!/bin/bash
# Session 35's device calls (bench/BENCHMARKS.md, "Session 35"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC
TMA=MOESERVE_GROUPED_GEMM_TILE=tma128x256x64

# PHASE=1: the persistent grouped GEMM with weight tiles by tensor copies (tma128x256x64). Its
#   tests (every ragged case, moe_experts at prefill sizes) on it and on the default shapes, the
#   moe prefill and fixtures tests with it forced, the products' bench against the wgmma shapes,
#   and the 8k prefills of both random models with the default choice against it, twice each.
if [ $PHASE = 1 ]; then
  JOBS=15 build_after test_cuda_grouped_gemm test_cuda_moe_prefill test_cuda_fixtures
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  gtest grouped 200 /tmp/b/tests/test_cuda_grouped_gemm
  (export $TMA; gtest moe_prefill-tma 200 /tmp/b/tests/test_cuda_moe_prefill; gtest fixtures-tma 200 /tmp/b/tests/test_cuda_fixtures)
  MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=wgmma128x128x64,wgmma128x256x64,tma128x256x64 \
    gtest grouped-bench 200 /tmp/b/tests/test_cuda_grouped_gemm --gtest_filter=CudaGroupedGemm.GroupedGemmBench
  wait
  for r in 0 1; do
    SIDES="$(SIDES="default tma:$TMA" rotated $r)" bench_sides qwen3 "1 8192 2"
    SIDES="$(SIDES="default tma:$TMA" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  log done
fi
