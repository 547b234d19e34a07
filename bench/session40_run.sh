#!/bin/bash
# Session 40's device calls (bench/BENCHMARKS.md, "Session 40"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1: $SRC (main with session 40's A staging of the grouped FP8 mma.sync product, and session 39's
#   pending BlockDiv patch applied) against $BEFORE_SRC (the session's starting tree): both built with the
#   grouped FP8 test program; its bench (V3's EP8 experts at 64 and 256 tokens) both ways; the opcode mix of
#   both objects; the GPU tests the change touches; greedy ids of the V3 shard both ways; B = 1, 16, 64 of the
#   shard at L = 2 and 5 (a layer = (t5 - t2) / 3), rotated rounds.
if [ $PHASE = 1 ]; then
  build_before 5 test_cuda_grouped_gemm_fp8
  JOBS=11 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_gemv test_cuda_grouped_gemm_fp8 test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_moe_route test_cuda_attention_moe
  v3_model v3-2 2 & v3_model v3-5 5 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_grouped_gemm_fp8 test_cuda_gemv
  wait
  sass_mix /tmp/b after; sass_mix /tmp/before before
  for r in 0 1; do fp8_bench_both 64,256 -$r; done
  v3_ids_both
  for r in 0 1; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "64 1536 16" "1 4096 16" "16 4096 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "64 1536 16" "1 4096 16" "16 4096 16"
  done
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route test_cuda_attention_moe
  for r in 2; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "64 1536 16" "1 4096 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "64 1536 16" "1 4096 16"
  done
  log done
fi

# PHASE=2 (needs `83734a3`: its stage variants and MOESERVE_FP8_WGMMA_STAGES were dropped in `619d325`): the
#   wgmma FP8 product's pipeline depth (MOESERVE_FP8_WGMMA_STAGES: BM 64 at 4 (the default), 5 (two blocks
#   an SM) or 10 (one), BM 128 at 4 or 8): the grouped FP8 test under each, its bench (V3's EP8 experts at 64, 256
#   and 1024 tokens, the dense FP8 linears) under each, the V3 shard at B = 64, 128 and 256 under each; the opcode
#   mix of both grouped FP8 objects; timelines of the shard's B = 1 and B = 64 decode (the default).
if [ $PHASE = 2 ]; then
  JOBS=15 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_grouped_gemm_fp8 test_cuda_fixtures
  v3_model v3-2 2 & v3_model v3-5 5 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  sass_mix /tmp/b mma grouped_gemm_fp8; sass_mix /tmp/b wgmma grouped_gemm_fp8_wgmma
  for st in 4 5 10 8; do
    MOESERVE_FP8_WGMMA_STAGES=$st gtest fp8-test-s$st 200 /tmp/b/tests/test_cuda_grouped_gemm_fp8
    MOESERVE_FP8_WGMMA_STAGES=$st MOESERVE_BENCH_FP8_GROUPED=1 MOESERVE_BENCH_FP8_TOKENS=64,256,1024 gtest fp8-bench-s$st 120 \
      /tmp/b/tests/test_cuda_grouped_gemm_fp8 --gtest_filter='*FP8GroupedBench'
  done
  wait
  SD="s4:MOESERVE_FP8_WGMMA_STAGES=4 s5:MOESERVE_FP8_WGMMA_STAGES=5 s10:MOESERVE_FP8_WGMMA_STAGES=10 s8:MOESERVE_FP8_WGMMA_STAGES=8"
  for r in 0 1; do
    SIDES="$(SIDES="$SD" rotated $r)" bench_sides v3-2 "64 1536 16" "128 1536 16" "256 128 16"
    SIDES="$(SIDES="$SD" rotated $r)" bench_sides v3-5 "64 1536 16" "128 1536 16" "256 128 16"
    [ $r = 0 ] && { trace v3-2 1 4096 final; trace v3-2 64 1536 final; }
  done
  run_gpu_tests /tmp/b test_cuda_fixtures
  log done
fi

# PHASE=3: the session's tree ($SRC) against $BEFORE_SRC (its wgmma FP8 product before the per-tile cleanup): the
#   grouped FP8 bench both ways (V3's EP8 experts at 64 and 256 tokens, the dense FP8 linears), every GPU test
#   program, greedy ids of the V3 shard both ways, the V3 shard's figures at L = 2 and 5 (B = 1, 16 at 4096 keys,
#   64 and 128 at 1536, 256 at 128; the 4096-token prefill of the B = 1 runs), B = 128 and 256 both ways, Qwen3 and
#   V2-Lite at B = 1, the opcode mix of the FP8 objects.
if [ $PHASE = 3 ]; then
  build_before 4 test_cuda_grouped_gemm_fp8
  JOBS=12 build_after ms_kernel_trace ms_cuda_ceilings $(gpu_tests_of $SRC)
  v3_model v3-2 2 & v3_model v3-5 5 & model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_grouped_gemm_fp8 test_cuda_gemv test_cuda_fixtures
  wait
  sass_mix /tmp/b wgmma grouped_gemm_fp8_wgmma; sass_mix /tmp/b gemv gemv
  fp8_bench_both 64,256
  v3_ids_both
  SIDES=final bench_sides v3-2 "1 4096 16" "16 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
  SIDES=final bench_sides v3-5 "1 4096 16" "16 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
  SIDES="before after" bench_sides v3-2 "128 1536 16" "256 128 16"; SIDES="before after" bench_sides v3-5 "128 1536 16" "256 128 16"
  SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  log done
fi
