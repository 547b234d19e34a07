#!/bin/bash
# Session 20's device calls (bench/BENCHMARKS.md, "Session 20"), run from the repository root on
# the GPU machine: PHASE picks the call; the source is a snapshot (git archive) carried as $SRC.
# (The first call ran session19_run.sh's PHASE=6 on main + bench/gpu_pending.patch.)
# PHASE=1 ran on db8f876 (branch gemv-bulk), PHASE=2 on 02f4755 (branch norm-route), PHASE=3 on
# 3910687 (branch gemv-sectors) against main: none was kept, the branches are deleted, and the
# switches they name are not in main. PHASE=4 is for the next session.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1: the copy engine's batch-1 products (MOESERVE_GEMV_BULK=1) with a barrier a row (a warp
#   starts on a row once it lands) and MOESERVE_GEMV_BULK_EARLY rows of each slab asked for before
#   pdl_wait (16, 6, 0): the product's tests in each, the decode-path tests, the product's bench
#   cold, B = 1 alternating off / e16 / e6 / e0 (three rounds each model), timelines.
if [ $PHASE = 1 ]; then
  E16="e16:MOESERVE_GEMV_BULK=1,MOESERVE_GEMV_BULK_EARLY=16" E6="e6:MOESERVE_GEMV_BULK=1,MOESERVE_GEMV_BULK_EARLY=6"
  E0="e0:MOESERVE_GEMV_BULK=1,MOESERVE_GEMV_BULK_EARLY=0"
  JOBS=16 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv
  MOESERVE_GEMV_BULK_EARLY=0 gtest gemv-e0 60 /tmp/b/tests/test_cuda_gemv
  MOESERVE_GEMV_BULK_EARLY=5 gtest gemv-e5 60 /tmp/b/tests/test_cuda_gemv
  export MOESERVE_GEMV_BULK=1
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  MOESERVE_GEMV_BULK_EARLY=0 gtest fixtures-e0 120 /tmp/b/tests/test_cuda_fixtures
  unset MOESERVE_GEMV_BULK
  for e in 16 0; do
    MOESERVE_GEMV_BULK_EARLY=$e MOESERVE_BENCH_GEMV=1 gtest gemv-bench-e$e 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  done
  wait
  for r in 1 2 3; do
    SIDES="off $E16 $E6 $E0" bench_sides qwen3 "1 4096 16"; SIDES="$E0 $E6 $E16 off" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 e16 MOESERVE_GEMV_BULK=1; trace qwen3 1 4096 e6 MOESERVE_GEMV_BULK=1 MOESERVE_GEMV_BULK_EARLY=6
  trace qwen3 1 4096 e0 MOESERVE_GEMV_BULK=1 MOESERVE_GEMV_BULK_EARLY=0
  trace v2lite 1 4096 off; trace v2lite 1 4096 e6 MOESERVE_GEMV_BULK=1 MOESERVE_GEMV_BULK_EARLY=6
  log done
fi
# PHASE=2: the post-attention residual add and norm run whole by each block of the router's
#   cluster (no barrier between blocks; MOESERVE_NORM_ROUTE=0 keeps the norm's kernel): the
#   routing and decode-path tests, B = 1 alternating (three rounds each model), timelines both
#   ways, the ceilings and the targets' other shapes while time lasts.
if [ $PHASE = 2 ]; then
  OFF=off:MOESERVE_NORM_ROUTE=0
  JOBS=16 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe test_cuda_moe_one_token test_cuda_moe_combine_norm
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_moe_one_token test_cuda_moe_combine_norm
  wait
  alternate_b1 "$OFF" on
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_NORM_ROUTE=0; trace v2lite 1 4096 on
  trace v2lite 1 4096 off MOESERVE_NORM_ROUTE=0
  for m in qwen3 v2lite; do offline $m 16 on; offline $m 528 on; done
  SIDES="on" bench_sides qwen3 "64 256 16" "1 8192 2"; SIDES="on" bench_sides v2lite "64 256 16" "1 8192 2"
  log done
fi
# PHASE=3: the batch-1 products' BF16 loads as whole sectors (each lane's 16 k as 8 + 8 at a
#   32-k distance, so that a quad's load reads 64 contiguous bytes): $SRC with it against
#   $BEFORE_SRC = main without it. The ceilings, every test program of a kernel that calls the
#   product, the product's bench cold and hot, B = 1 alternating (three rounds each model),
#   timelines, B = 8, 64 and the 8k prefills.
if [ $PHASE = 3 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_moe_route test_cuda_attention_moe test_cuda_fused test_cuda_ops test_cuda_graphs test_cuda_fp8_gemm
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route \
    test_cuda_attention_moe test_cuda_fused test_cuda_ops test_cuda_graphs test_cuda_fp8_gemm
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  MOESERVE_BENCH_GEMV_HOT=1 MOESERVE_BENCH_GEMV=1 gtest gemv-bench-hot 60 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  alternate_b1 before after
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  SIDES="before after" bench_sides qwen3 "8 4096 16"; SIDES="after before" bench_sides v2lite "8 4096 16"
  SIDES="after" bench_sides qwen3 "64 256 16" "1 8192 2"; SIDES="after" bench_sides v2lite "64 256 16" "1 8192 2"
  log done
fi
# PHASE=4 (for the next session; $SRC = main with bench/gpu_pending.patch applied, $BEFORE_SRC =
#   main): the one-token experts at 48 features a block (Qwen3: 128 blocks, not 96; the default
#   where it fits, MOESERVE_MOE_ONE_TOKEN=ring the 64-feature ring) and, for V2-Lite, q_proj and
#   kv_a_proj as one product (no switch: the tree before is the control). The kernel's tests and
#   the decode-path tests, the experts bench both ways, B = 1 alternating before / after (three
#   rounds each model; Qwen3's experts, V2-Lite's projection), Qwen3 with the old ring on the new
#   tree, timelines, B = 8 and 64, V2-Lite's 8k prefill.
if [ $PHASE = 4 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe test_cuda_mla_absorb
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_mla_absorb
  MOESERVE_BENCH_MOE_ONE_TOKEN=1 gtest one-token-bench 60 /tmp/b/tests/test_cuda_moe_one_token --gtest_filter='*Bench*'
  MOESERVE_MOE_ONE_TOKEN=ring MOESERVE_BENCH_MOE_ONE_TOKEN=1 gtest one-token-bench-ring 60 \
    /tmp/b/tests/test_cuda_moe_one_token --gtest_filter='*Bench*'
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  alternate_b1 before after
  SIDES="ring:MOESERVE_MOE_ONE_TOKEN=ring after" bench_sides qwen3 "1 4096 16"
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  SIDES="before after" bench_sides qwen3 "8 4096 16"; SIDES="after before" bench_sides v2lite "8 4096 16" "64 256 16" "1 8192 2"
  log done
fi
