#!/bin/bash
# Session 41's device calls (bench/BENCHMARKS.md, "Session 41"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1: $SRC (the FP8 products converting codes unscaled and scaling their f32 sums: the streaming
#   product and the grouped mma.sync kernel) against $BEFORE_SRC (the session's starting tree): the changed
#   products' tests first, the grouped FP8 bench both ways (V3's EP8 experts at 64 and 256 tokens, the dense
#   FP8 linears), greedy ids of the V3 shard both ways, B = 1, 16, 64 of the shard at L = 2 and 5 (a layer =
#   (t5 - t2) / 3) in rotated rounds, then every other GPU test program in the time left.
if [ $PHASE = 1 ]; then
  build_before 4 test_cuda_grouped_gemm_fp8
  JOBS=12 build_after ms_kernel_trace ms_cuda_ceilings $(gpu_tests_of $SRC)
  v3_model v3-2 2 & v3_model v3-5 5 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_grouped_gemm_fp8
  wait
  sass_mix /tmp/b mma-after; sass_mix /tmp/before mma-before; sass_mix /tmp/b gemv-after gemv
  fp8_bench_both 64,256
  v3_ids_both
  for r in 0 1; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "16 4096 16" "64 1536 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "16 4096 16" "64 1536 16"
  done
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_ops test_cuda_moe_one_token test_cuda_mla_absorb test_cuda_engine_graphs \
    $(gpu_tests_of $SRC)
  log done
fi

# PHASE=2: the final tree ($SRC: the first call's with the streaming product's last-chunk scale fixed) against
#   $BEFORE_SRC (the session's starting tree): the changed products' tests, then every GPU test program; the V3
#   shard's figures both ways (B = 1 and 16 at 4096 keys with the 4096-token prefill, 64 and 128 at 1536, 256
#   at 128; L = 2 and 5) in rotated rounds; greedy ids of the shard; Qwen3 and V2-Lite at B = 1.
if [ $PHASE = 2 ]; then
  build_before 4
  JOBS=12 build_after ms_cuda_ceilings $(gpu_tests_of $SRC)
  v3_model v3-2 2 & v3_model v3-5 5 & model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_grouped_gemm_fp8 test_cuda_grouped_gemm test_cuda_merge_project \
    test_cuda_mla_decode_wgmma test_cuda_mla_prefill test_cuda_moe_combine_norm test_cuda_moe_prefill test_cuda_moe_route \
    test_cuda_sampling test_cuda_fixtures
  wait
  gen_ids v3-2 - v3-after; B=/tmp/before/moeserve gen_ids v3-2 - v3-before
  for r in 0 1; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "16 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "16 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
  done
  SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  log done
fi

# PHASE=3: the final tree ($SRC) against $BEFORE_SRC (the session's start): the three test programs the
#   second call's time did not reach (mla_absorb, moe_one_token, ops), Qwen3 and V2-Lite at B = 1 (4096 keys,
#   three rounds, the final tree), and more rotated rounds of the V3 shard at B = 1, 16 and 64 (L = 2 and 5).
if [ $PHASE = 3 ]; then
  build_before 4
  JOBS=12 build_after test_cuda_mla_absorb test_cuda_moe_one_token test_cuda_ops
  v3_model v3-2 2 & v3_model v3-5 5 & model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_mla_absorb test_cuda_moe_one_token test_cuda_ops
  wait
  for r in 0 1 2; do SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"; done
  for r in 0 1 2; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "16 4096 16" "64 1536 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "16 4096 16" "64 1536 16"
  done
  log done
fi

# PHASE=4 (for the next session: `git apply bench/gpu_pending.patch` in the $SRC snapshot, main as $BEFORE_SRC):
#   the wgmma FP8 product with the scales on its sums: the grouped FP8 test, the fixtures and graphed engine
#   first; the grouped FP8 bench both ways at 64, 256 and 1024 tokens (the dense FP8 linears at 64 and 256
#   rows run wgmma too); Qwen3 and V2-Lite at B = 1 on main; greedy ids; the shard at B = 1, 64, 128 and 256
#   both ways (L = 2 and 5; B = 1 for the streaming product's shared row-pair scale), rotated rounds.
if [ $PHASE = 4 ]; then
  build_before 4 test_cuda_grouped_gemm_fp8
  JOBS=12 build_after test_cuda_grouped_gemm_fp8 test_cuda_fixtures test_cuda_engine_graphs test_cuda_gemv
  v3_model v3-2 2 & v3_model v3-5 5 & model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_grouped_gemm_fp8 test_cuda_fixtures test_cuda_engine_graphs test_cuda_gemv
  wait
  # Qwen3 and V2-Lite at B = 1 on main's BF16 products (714ec1b: session 39's registers again; this session
  # measured 0.791 / 0.794 ms before it, session 39 0.777 / 0.752).
  for r in 0 1 2; do SIDES=before bench_sides qwen3 "1 4096 16"; SIDES=before bench_sides v2lite "1 4096 16"; done
  sass_mix /tmp/b wgmma-after grouped_gemm_fp8_wgmma; sass_mix /tmp/before wgmma-before grouped_gemm_fp8_wgmma
  fp8_bench_both 64,256,1024
  v3_ids_both
  for r in 0 1 2; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
  done
  log done
fi
