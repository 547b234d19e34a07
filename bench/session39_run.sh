#!/bin/bash
# Session 39's device calls (bench/BENCHMARKS.md, "Session 39"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# Nsight Compute (full set, SASS stall samples) on the grouped FP8 products of FP8GroupedBench at
# $2 tokens (MOESERVE_BENCH_FP8_TOKENS), the first $3 launches matching regex $4 (default: both
# kernels), tag $1, env $NCU_ENV; details, raw metrics and the stall table in $L.
ncu_fp8() {
  env ${NCU_ENV:-} MOESERVE_BENCH_FP8_GROUPED=1 MOESERVE_BENCH_FP8_TOKENS=$2 timeout 240 $NCU --kernel-name-base demangled \
    -k "regex:${4:-grouped_gemm_fp8}" --launch-count $3 --set full --import-source no -o $L/ncu-$1 \
    /tmp/b/tests/test_cuda_grouped_gemm_fp8 --gtest_filter='*FP8GroupedBench' > $L/ncu-$1.log 2>&1
  ncu_export $1
}
# The V3 EP8 shard (FP8 blocks, 32 experts) of $2 layers as /tmp/$1.
v3_model() { model $1 deepseek-v3 $2 --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; }

# An A/B of the V3 shard's FP8 products, $SRC ("after") against $BEFORE_SRC ("before"): both built, the test programs
# named run, both shards (L = 2 and 5) made, the ceilings, greedy ids and B = 1 timelines of the L = 2 shard both ways.
fp8_ab() {
  build_before 5
  JOBS=11 build_after ms_kernel_trace ms_cuda_ceilings "$@"
  v3_model v3-2 2 & v3_model v3-5 5 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b "$@"
  wait
  gen_ids v3-2 - v3-after; B=/tmp/before/moeserve gen_ids v3-2 - v3-before
  cmp -s $L/gen-v3-after.txt $L/gen-v3-before.txt && log "generate v3 ids equal" || log "generate v3 ids DIFFER"
  trace v3-2 1 4096 after; B=/tmp/before/moeserve trace v3-2 1 4096 before
}

# PHASE=1: where DeepSeek-V3's FP8 decode spends its time. The grouped FP8 products' bench (V3's EP8
#   experts at 64, 256 and 1024 tokens, the dense FP8 linears), Nsight Compute on the experts' two
#   products at 64 tokens (mma.sync, BM 32) and 256 (wgmma, BM 64), kernel timelines of the EP8
#   shard's graphed decode at B = 1 (4096 keys) and B = 64 (1536 keys).
if [ $PHASE = 1 ]; then
  JOBS=15 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_grouped_gemm_fp8
  v3_model v3-2 2 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  MOESERVE_BENCH_FP8_GROUPED=1 MOESERVE_BENCH_FP8_TOKENS=64,256,1024 gtest fp8-bench 200 \
    /tmp/b/tests/test_cuda_grouped_gemm_fp8 --gtest_filter='*FP8GroupedBench'
  ncu_fp8 t64 64 2
  ncu_fp8 t256 256 2
  wait
  trace v3-2 1 4096 v3; trace v3-2 64 1536 v3
  SIDES=v3 bench_sides v3-2 "1 4096 16" "64 1536 16"
  log done
fi

# PHASE=2: the FP8 weight-streaming product with raw codes in registers and two rounds in turn ($SRC) against
#   $BEFORE_SRC: the GPU tests it touches, greedy ids of the V3 shard both ways, B = 1 timelines both ways, B = 1
#   at 4096 keys (three rotated rounds) at L = 2 and 5 (a layer = (t5 - t2) / 3), B = 64 once each.
if [ $PHASE = 2 ]; then
  fp8_ab test_cuda_gemv test_cuda_grouped_gemm_fp8 test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_moe_route test_cuda_moe_one_token
  for r in 0 1 2; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16"
  done
  SIDES="after before" bench_sides v3-2 "64 1536 16"; SIDES="after before" bench_sides v3-5 "64 1536 16"
  log done
fi

# PHASE=3: the session's tree: every GPU test program, the ceilings, greedy ids of the V3 shard, B = 1 at 4096 keys
#   of the V3 shard at L = 2 and 5 (two rounds), B = 1 of Qwen3 and V2-Lite (BF16 products: their kernels' registers
#   unchanged) and the V3 timeline.
if [ $PHASE = 3 ]; then
  JOBS=15 build_after ms_kernel_trace ms_cuda_ceilings $(gpu_tests_of $SRC)
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  v3_model v3-2 2 & v3_model v3-5 5 & model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_grouped_gemm_fp8
  wait
  gen_ids v3-2 - v3-final
  for r in 0 1; do SIDES=final bench_sides v3-2 "1 4096 16"; SIDES=final bench_sides v3-5 "1 4096 16"; done
  for r in 0 1; do SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"; done
  trace v3-2 1 4096 final
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  log done
fi

# PHASE=4: Nsight Compute on the session's FP8 weight-streaming products in the V3 shard's eager B = 1 decode (the
#   first three launches of `gemv_kernel<(bool)1` after $NCU_SKIP (12): which of them and what bounds them now).
if [ $PHASE = 4 ]; then
  JOBS=15 build_after
  v3_model v3-2 2
  timeout 300 $NCU --kernel-name-base demangled -k "regex:gemv_kernel<.bool.1" --launch-skip ${NCU_SKIP:-12} --launch-count 3 \
    --set full --import-source no -o $L/ncu-gemv $B bench-one-batch --model-path /tmp/v3-2 --device cuda --batch-size 1 \
    --input-len 256 --output-len 8 --disable-cuda-graph > $L/ncu-gemv.log 2>&1
  ncu_export gemv
  log done
fi

# PHASE=5 (not run: the session's device time was spent): bench/gpu_pending.patch applied in $SRC against $BEFORE_SRC
#   (main): the FP8 products' scale index by a multiply (BlockDiv) instead of two divisions a load. As PHASE=2, and
#   B = 16 at 4096 keys (the experts' two-tile product, whose registers the patch raises 164 -> 195).
if [ $PHASE = 5 ]; then
  fp8_ab test_cuda_gemv test_cuda_grouped_gemm_fp8 test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route
  for r in 0 1 2; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "16 4096 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "16 4096 16"
  done
  log done
fi
