#!/bin/bash
# Session 35's device calls (bench/BENCHMARKS.md, "Session 35"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC
TMA=MOESERVE_GROUPED_GEMM_TILE=tma128x256x64

# PHASE=1 (ran at c69222a): the persistent grouped GEMM with weight tiles by tensor copies (tma128x256x64). Its
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

# PHASE=2 (ran at ca0e0ec): tma128x256x64 the default from a mean of 256 rows an expert, its units of up to 64 rows
#   split over both consumers (MOESERVE_GROUPED_TMA_HALVES=0: not). The touched tests and those of
#   whole models; greedy ids of both random models with tma against wgmma128x256x64 forced; the
#   products' bench (2k, 4k, 8k tokens) with and without the halves; the 8k prefills of both
#   models, default / no halves / the old default, rotated over two rounds.
if [ $PHASE = 2 ]; then
  OLD=MOESERVE_GROUPED_GEMM_TILE=wgmma128x256x64 FULL=MOESERVE_GROUPED_TMA_HALVES=0
  JOBS=15 build_after test_cuda_grouped_gemm test_cuda_moe_prefill test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_grouped_gemm test_cuda_moe_prefill test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe
  (export $TMA; gtest moe_prefill-tma 200 /tmp/b/tests/test_cuda_moe_prefill; gtest fixtures-tma 200 /tmp/b/tests/test_cuda_fixtures)
  F=--gtest_filter=CudaGroupedGemm.GroupedGemmBench
  (export MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=wgmma128x256x64,tma128x256x64
   gtest bench 200 /tmp/b/tests/test_cuda_grouped_gemm $F
   export MOESERVE_GROUPED_TEST_TILES=tma128x256x64 $FULL; gtest bench-full 200 /tmp/b/tests/test_cuda_grouped_gemm $F)
  wait
  ids_alike "$TMA" "$OLD" tma old
  for r in 0 1; do
    SIDES="$(SIDES="default full:$FULL old:$OLD" rotated $r)" bench_sides qwen3 "1 8192 2"
    SIDES="$(SIDES="default full:$FULL old:$OLD" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  log done
fi

# PHASE=3 (ran at 92fc1bc): the session's final tree (tma128x256x64 the default from a mean of 128 rows, without the
#   halves), labelled final: every GPU test program, the ceilings, B = 1 three rounds, B = 64, the 8k
#   prefills, the engine's step and the B = 1 timelines (target_figures); then the products' bench
#   with the three Hopper shapes (2k, 4k, 8k tokens).
if [ $PHASE = 3 ]; then
  target_figures
  (export MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=wgmma128x128x64,wgmma128x256x64,tma128x256x64
   gtest bench 100 /tmp/b/tests/test_cuda_grouped_gemm --gtest_filter=CudaGroupedGemm.GroupedGemmBench)
  log done
fi

# PHASE=4 (ran at 54cfd77): the tma shape's stores as 16-byte groups of 8 columns transposed over each quad
#   (MOESERVE_GROUPED_TMA_VEC=0: column pairs, as before). Lean (little device time was left): the
#   grouped GEMM's test program alone, built alone; its tests, then its bench with and without.
if [ $PHASE = 4 ]; then
  (configure_tree $SRC /tmp/b && cmake --build /tmp/b -j16 --target test_cuda_grouped_gemm) > $L/build.log 2>&1
  log "built rc=$?"
  gtest grouped 60 /tmp/b/tests/test_cuda_grouped_gemm
  F=--gtest_filter=CudaGroupedGemm.GroupedGemmBench
  (export MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=tma128x256x64
   gtest bench-vec 40 /tmp/b/tests/test_cuda_grouped_gemm $F
   export MOESERVE_GROUPED_TMA_VEC=0; gtest bench-pairs 40 /tmp/b/tests/test_cuda_grouped_gemm $F)
  log done
fi
