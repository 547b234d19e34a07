#!/bin/bash
# Session 21's device calls (bench/BENCHMARKS.md, "Session 21"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC and
# $BEFORE_SRC. (The first call ran session20_run.sh's PHASE=4.)
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 ($SRC = main; $BEFORE_SRC = main + bench/one_token_clocks.patch as of e4a2ea1, the
#   experts kernel's stamps only, counted by a device epoch, which decode_clocks.patch replaced):
#   main's every single-GPU test program and the ceilings; B = 1 alternating main / w8 (meant as
#   MOESERVE_GEMV_TUNE=8,0,0; it never started: bench_sides splits a side's value at its commas);
#   the experts kernel's phases in the step (the clocks build, both models); timelines; B = 8 and
#   64, the 8k prefills and the engine's overlapped decode.
if [ $PHASE = 1 ]; then
  build_all_and_test
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "clocks build failed"; }
  for m in qwen3 v2lite; do
    MOESERVE_ONE_TOKEN_CLOCKS=1 timeout 60 /tmp/before/moeserve bench-one-batch --model-path /tmp/$m --device cuda \
      --batch-size 1 --input-len 4096 --output-len 16 > $L/clocks-$m.log 2>&1
    log "clocks $m rc=$? $(grep -E 'Decode\.  median' $L/clocks-$m.log)"; grep '\[clocks\]' $L/clocks-$m.log | tail -12 >> $OUT/summary.log
  done
  alternate_b1 main w8:MOESERVE_GEMV_TUNE=8,0,0
  trace qwen3 1 4096 main; trace v2lite 1 4096 main
  SIDES="main" bench_sides qwen3 "8 4096 16" "64 256 16" "1 8192 2"
  SIDES="main" bench_sides v2lite "8 4096 16" "64 256 16" "1 8192 2"
  for m in qwen3 v2lite; do offline $m 16 main; offline $m 528 main; done
  log done
fi
# PHASE=2 ($SRC = main + bench/decode_clocks.patch): the stamps of the batch-1 step's instrumented
#   kernels (products, router, experts, norms, split merge) in the graphed step of both models, the
#   per-block rows into $OUT/clocks-<model>.<file>. Ran twice: with the patch of cc8523e, then with
#   that of the next commit, which adds stamps inside the router's top-k and sort (2: top-k done,
#   5: the expert counts scanned) and the split merge's (2: loaded and merged, 3: warps met).
if [ $PHASE = 2 ]; then
  JOBS=16 build_after
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  wait
  for m in qwen3 v2lite; do
    MOESERVE_CLOCKS_FILE=$OUT/clocks-$m timeout 60 $B bench-one-batch --model-path /tmp/$m --device cuda \
      --batch-size 1 --input-len 4096 --output-len 16 > $L/clocks-$m.log 2>&1
    log "clocks $m rc=$? $(grep -E 'Decode\.  median' $L/clocks-$m.log)"; grep -c '\[clocks\]' $L/clocks-$m.log >> $OUT/summary.log
  done
  log done
fi
# PHASE=3 ($SRC = 8a153cd, branch b1-tails, deleted: neither change was kept; $BEFORE_SRC = main):
#   the router's chosen ids sorted from shared memory (not read back from global memory), and a
#   dense product's slab split over a cluster of 2 or 4 blocks where that spreads its warps more
#   evenly (MOESERVE_GEMV_CLUSTER=1 never splits). Their tests, the product's bench (cluster1/2/4
#   among its variants), B = 1 alternating before / after / after unsplit (three rounds each
#   model), timelines, B = 8.
if [ $PHASE = 3 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace test_cuda_gemv test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe test_cuda_moe_one_token test_cuda_fused test_cuda_graphs test_cuda_fp8_gemm
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe test_cuda_moe_one_token test_cuda_fused test_cuda_graphs test_cuda_fp8_gemm
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  for r in 1 2 3; do
    SIDES="before after unsplit:MOESERVE_GEMV_CLUSTER=1" bench_sides qwen3 "1 4096 16"
    SIDES="unsplit:MOESERVE_GEMV_CLUSTER=1 after before" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  trace qwen3 1 4096 unsplit MOESERVE_GEMV_CLUSTER=1; trace v2lite 1 4096 unsplit MOESERVE_GEMV_CLUSTER=1
  SIDES="before after" bench_sides qwen3 "8 4096 16"; SIDES="after before" bench_sides v2lite "8 4096 16"
  log done
fi
# PHASE=4 (for the next session; $SRC = main + bench/gpu_pending.patch, branch l2-stream): the
#   weights a step streams once read under an evict-first L2 policy, so that they stop flushing
#   the small kernels' code, parameters and activations from L2 (MOESERVE_L2_STREAM=0: normal).
#   The kernels' tests (and the fixtures with the normal policy), the gemv bench both ways, B = 1
#   alternating normal / on (three rounds each model), timelines both ways, B = 8 and 64 both
#   ways, the 8k prefills.
if [ $PHASE = 4 ]; then
  N=normal:MOESERVE_L2_STREAM=0
  JOBS=16 build_after ms_kernel_trace test_cuda_gemv test_cuda_moe_one_token test_cuda_moe_route test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_attention_moe test_cuda_fp8_gemm
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_moe_one_token test_cuda_moe_route test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_attention_moe test_cuda_fp8_gemm
  MOESERVE_L2_STREAM=0 gtest fixtures-normal 120 /tmp/b/tests/test_cuda_fixtures
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  MOESERVE_L2_STREAM=0 MOESERVE_BENCH_GEMV=1 gtest gemv-bench-normal 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  wait
  alternate_b1 $N on
  trace qwen3 1 4096 on; trace qwen3 1 4096 normal MOESERVE_L2_STREAM=0
  trace v2lite 1 4096 on; trace v2lite 1 4096 normal MOESERVE_L2_STREAM=0
  SIDES="$N on" bench_sides qwen3 "8 4096 16" "64 256 16"; SIDES="on $N" bench_sides v2lite "8 4096 16" "64 256 16"
  SIDES="on" bench_sides qwen3 "1 8192 2"; SIDES="on" bench_sides v2lite "1 8192 2"
  log done
fi
