#!/bin/bash
# Session 25's device calls (bench/BENCHMARKS.md, "Session 25"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC (and
# $BEFORE_SRC where a phase compares two trees).
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# $SRC's moeserve with the kernel tracer and the test programs $1, both random models, those tests run.
build_and_test() {
  JOBS=14 build_after ms_kernel_trace $1
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $1
  wait
}

# PHASE=1 ($SRC = main with the experts' L2 ahead): at batch 1 the one-token experts kernel, while
#   it waits for the router's top-k (~3 us when HBM idles), asks L2 for the leading fraction
#   MOESERVE_L2_AHEAD of every row of the next layer's first product (Qwen3's q|k|v, V2-Lite's
#   q|kv_a). Sides: off (0), half (0.5), full (1, the build's default). Tests; B = 1 rotating;
#   timelines of off and full.
if [ $PHASE = 1 ]; then
  build_and_test "test_cuda_moe_combine_norm test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe"
  OFF=off:MOESERVE_L2_AHEAD=0 HALF=half:MOESERVE_L2_AHEAD=0.5
  b1_rounds "$OFF $HALF full" "$OFF $HALF full"
  for m in qwen3 v2lite; do trace $m 1 4096 full; trace $m 1 4096 off MOESERVE_L2_AHEAD=0; done
  log done
fi

# PHASE=2 ($SRC = main with the L2 ahead off by default and a one-launch argmax; $BEFORE_SRC = the
#   session's start, f253c99). Sides: before; off (the new argmax); p24: the ahead asked for as
#   evict_last into 24 MB of L2 set aside for persisting lines (MOESERVE_L2_AHEAD=1,
#   MOESERVE_L2_AHEAD_PERSIST=24), which the experts' evict-first stream cannot take. Tests (the
#   slabs test with the ahead on both ways); B = 1 rotating; timelines; the engine's decode traced.
if [ $PHASE = 2 ]; then
  build_before 5
  build_and_test "test_cuda_engine_graphs test_cuda_sampling test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_graphs"
  MOESERVE_L2_AHEAD=1 gtest slabs-ahead 60 /tmp/b/tests/test_cuda_moe_combine_norm --gtest_filter='*Slabs*'
  MOESERVE_L2_AHEAD=1 MOESERVE_L2_AHEAD_PERSIST=24 gtest slabs-p24 60 /tmp/b/tests/test_cuda_moe_combine_norm --gtest_filter='*Slabs*'
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  P24=p24:MOESERVE_L2_AHEAD=1,MOESERVE_L2_AHEAD_PERSIST=24
  b1_rounds "before off $P24" "before off $P24"
  trace qwen3 1 4096 off; trace qwen3 1 4096 p24 MOESERVE_L2_AHEAD=1 MOESERVE_L2_AHEAD_PERSIST=24
  trace_offline qwen3 64 off
  log done
fi

# PHASE=3 ($SRC = main with the step's copies as kernels, MOESERVE_COPY_KERNELS=0 the copy engine;
#   bench-one-batch reads its ids back as the engine does): every single-GPU test program, the
#   ceilings; the engine's decode with the copies by kernels or by the copy engine (bench-offline,
#   16 and 528 new tokens: the steady step), traced once each; B = 1 rotating; B = 64.
if [ $PHASE = 3 ]; then
  JOBS=14 build_after ms_cuda_ceilings ms_kernel_trace $(gpu_tests_of $SRC)
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  MOESERVE_COPY_KERNELS=0 gtest engine-graphs-copyeng 120 /tmp/b/tests/test_cuda_engine_graphs
  wait
  for m in qwen3 v2lite; do
    for o in 16 528; do offline $m $o kern; MOESERVE_COPY_KERNELS=0 offline $m $o copyeng; done
  done
  CE=copyeng:MOESERVE_COPY_KERNELS=0
  b1_rounds "$CE kern" "kern $CE"
  SIDES="kern $CE" bench_sides qwen3 "64 256 16"; SIDES="$CE kern" bench_sides v2lite "64 256 16"
  trace_offline qwen3 64 kern; MOESERVE_COPY_KERNELS=0 trace_offline qwen3 64 copyeng
  log done
fi

# PHASE=4 ($SRC as in phase 3): the third call's single samples again — the engine's decode and
#   B = 64, each side three times, rotating; V2-Lite's B = 1 three more rounds.
if [ $PHASE = 4 ]; then
  JOBS=14 build_after
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  wait
  CE=copyeng:MOESERVE_COPY_KERNELS=0
  for r in 0 1 2; do
    for m in qwen3 v2lite; do
      for side in $(SIDES="kern copyeng" rotated $r); do
        for o in 16 528; do
          if [ $side = copyeng ]; then MOESERVE_COPY_KERNELS=0 offline $m $o $side-$r; else offline $m $o $side-$r; fi
        done
      done
    done
    SIDES="$(SIDES="kern $CE" rotated $r)" bench_sides qwen3 "64 256 16"
    SIDES="$(SIDES="kern $CE" rotated $r)" bench_sides v2lite "64 256 16" "1 4096 16"
  done
  log done
fi
