#!/bin/bash
# Session 18's device calls (bench/BENCHMARKS.md, "Session 18"), run from the repository root on
# the GPU machine: PHASE picks the call; the source is a snapshot (git archive) carried as $SRC.
# (The first call ran session17_run.sh's PHASE=6 on main + session 17's pending patch.)
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-2}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=2: the experts kernel ending in the layer's residual add and norm at batch 1
#   (MOESERVE_MOE_ONE_TOKEN_NORM=0 keeps the norm's kernel): its tests and the decode-path
#   tests, B = 1 alternating (three rounds each model), timelines both ways, then the engine's
#   overlapped decode (bench-offline, one prompt, 16 and 528 new tokens; 528 without overlap).
if [ $PHASE = 2 ]; then
  OFF=off:MOESERVE_MOE_ONE_TOKEN_NORM=0
  JOBS=16 build_after ms_kernel_trace test_cuda_moe_one_token test_cuda_moe_combine_norm test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_attention_moe test_cuda_ops
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_one_token test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe test_cuda_ops
  wait
  for r in 1 2 3; do
    SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $OFF" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_MOE_ONE_TOKEN_NORM=0; trace v2lite 1 4096 on
  for m in qwen3 v2lite; do
    offline $m 16 on; offline $m 528 on; offline $m 528 nooverlap --disable-overlap-schedule
  done
  log done
fi
# PHASE=3: the router as one thread-block cluster (MOESERVE_ROUTE_CLUSTER=0: the many-block kernel):
#   the ceilings, the routing and decode-path tests, B = 1 alternating (three rounds each model),
#   timelines both ways, the targets' other shapes (B = 64 at 256 keys, 8k prefill), then every
#   other single-GPU test program while the budget lasts.
if [ $PHASE = 3 ]; then
  OFF=off:MOESERVE_ROUTE_CLUSTER=0
  TESTS=$(gpu_tests_of $SRC)
  JOBS=16 build_after ms_kernel_trace ms_cuda_ceilings $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  wait
  for r in 1 2 3; do
    SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $OFF" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_ROUTE_CLUSTER=0; trace v2lite 1 4096 on
  SIDES="on" bench_sides qwen3 "64 256 16" "1 8192 2"
  SIDES="on" bench_sides v2lite "64 256 16" "1 8192 2"
  for t in $TESTS; do [ $(left) -gt 45 ] && run_gpu_tests /tmp/b $t; done
  log done
fi
# PHASE=4: the final tree's two test programs phase 3 left for want of time (ops, sampling), then
#   the engine's overlapped decode of one prompt (bench-offline, 16 and 528 new tokens) per model.
if [ $PHASE = 4 ]; then
  JOBS=16 build_after test_cuda_ops test_cuda_sampling
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_ops test_cuda_sampling
  wait
  for m in qwen3 v2lite; do offline $m 16 on; offline $m 528 on; done
  log done
fi
# PHASE=5 (ran on 0cec9ad, a branch since deleted: BENCHMARKS, session 18, fifth call): the
#   one-token kernel with each slot's blocks as one cluster (MOESERVE_MOE_ONE_TOKEN=cluster, its
#   default where a slot has at most 16 slabs: Qwen3; =ring the L2 counter form): its test, then
#   Qwen3 B = 1 alternating (three rounds), in the device time the session had left.
if [ $PHASE = 5 ]; then
  JOBS=16 build_after test_cuda_moe_one_token
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b test_cuda_moe_one_token
  wait
  for r in 1 2 3; do SIDES="ring:MOESERVE_MOE_ONE_TOKEN=ring on" bench_sides qwen3 "1 4096 16"; done
  log done
fi
# PHASE=6 (for the next session; $SRC = main with bench/gpu_pending.patch applied): GQA decode's
#   splits as one cluster that merges them (MOESERVE_GQA_CLUSTER_MERGE=16, the patch's default;
#   8; 0 the merge kernel): the attention and decode-path tests, Qwen3 B = 1 alternating 16 / 0
#   (three rounds) and 8 once, B = 8 at 4096 both ways, timelines both ways (V2-Lite's MLA is
#   not affected).
if [ $PHASE = 6 ]; then
  OFF=off:MOESERVE_GQA_CLUSTER_MERGE=0
  JOBS=16 build_after ms_kernel_trace test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route
  wait
  for r in 1 2 3; do SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; done
  SIDES="c8:MOESERVE_GQA_CLUSTER_MERGE=8" bench_sides qwen3 "1 4096 16"
  SIDES="$OFF on" bench_sides qwen3 "8 4096 16"
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_GQA_CLUSTER_MERGE=0
  log done
fi
