#!/bin/bash
# Session 25's device calls (bench/BENCHMARKS.md, "Session 25"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC (and
# $BEFORE_SRC where a phase compares two trees).
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# The sides of $SIDES turned left by $1 (rounds rotate them, so that no side always runs first).
rotated() { local a=($SIDES) n; n=${#a[@]}; for ((k = 0; k < n; ++k)); do echo -n "${a[$(( (k + $1) % n ))]} "; done; }
# B = 1 at 4096 keys, three rounds: the sides $1 for /tmp/qwen3 and $2 for /tmp/v2lite (bench_sides'
# syntax), both turned left by the round.
b1_rounds() {
  local r
  for r in 0 1 2; do
    SIDES="$(SIDES="$1" rotated $r)" bench_sides qwen3 "1 4096 16"
    SIDES="$(SIDES="$2" rotated $r)" bench_sides v2lite "1 4096 16"
  done
}

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
