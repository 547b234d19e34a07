#!/bin/bash
# Session 27's device calls (bench/BENCHMARKS.md, "Session 27"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 (a snapshot of main with `patch -p1 < bench/gpu_pending.patch` (session 26's), as $SRC:
#   dense products of one row tile in half slabs where that spreads their blocks more evenly,
#   MOESERVE_GEMV_HALF=0 the whole slabs): the ceilings; the GEMV tests (the bits of both) and the
#   models' tests; the GEMV bench both ways; B = 1 rotating, both models; timelines both ways.
if [ $PHASE = 1 ]; then
  JOBS=14 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench-half 120 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  MOESERVE_BENCH_GEMV=1 MOESERVE_GEMV_HALF=0 gtest gemv-bench-full 120 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  wait
  FULL=full:MOESERVE_GEMV_HALF=0
  b1_rounds "$FULL half" "$FULL half"
  trace qwen3 1 4096 half; trace qwen3 1 4096 full MOESERVE_GEMV_HALF=0
  trace v2lite 1 4096 half; trace v2lite 1 4096 full MOESERVE_GEMV_HALF=0
  log done
fi

# PHASE=2 ($SRC = main with the shared expert's gate|up product beside the router,
#   MOESERVE_BESIDE=0 after it): the tests that run it (its bit-for-bit test in moe_route) and the
#   models'; greedy ids of V2-Lite both ways; B = 1 rotating and B = 8, V2-Lite (Qwen3 has no
#   shared expert); the engine's decode; timelines both ways.
if [ $PHASE = 2 ]; then
  JOBS=14 build_after ms_kernel_trace test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs test_cuda_gemv
  model v2lite deepseek-v2-lite 9 &
  gtest beside 120 /tmp/b/tests/test_cuda_moe_route --gtest_filter='*Beside*'
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs test_cuda_gemv
  wait
  gen_ids v2lite - on; gen_ids v2lite MOESERVE_BESIDE=0 off
  cmp -s $L/gen-on.txt $L/gen-off.txt && log "generate ids equal" || log "generate ids DIFFER"
  OFF=off:MOESERVE_BESIDE=0
  for r in 0 1 2 3; do SIDES="$(SIDES="$OFF on" rotated $r)" bench_sides v2lite "1 4096 16"; done
  SIDES="on $OFF" bench_sides v2lite "8 4096 16"
  for r in 0 1; do
    for side in $(SIDES="on off" rotated $r); do
      for o in 16 528; do
        if [ $side = off ]; then MOESERVE_BESIDE=0 offline v2lite $o $side-$r; else offline v2lite $o $side-$r; fi
      done
    done
  done
  trace v2lite 1 4096 on; trace v2lite 1 4096 off MOESERVE_BESIDE=0
  log done
fi

# PHASE=3 ($SRC = main with the shared expert's down product also beside the routed experts):
#   every single-GPU test program; greedy ids of V2-Lite both ways; B = 1 rotating (V2-Lite) and
#   Qwen3's as a control (no shared expert); B = 64 both models; the engine's decode; timelines.
if [ $PHASE = 3 ]; then
  JOBS=15 build_after ms_kernel_trace $(gpu_tests_of $SRC)
  model v2lite deepseek-v2-lite 9 & model qwen3 qwen3-30b-a3b 12 &
  gtest beside 120 /tmp/b/tests/test_cuda_moe_route --gtest_filter='*Beside*'
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  wait
  gen_ids v2lite - on; gen_ids v2lite MOESERVE_BESIDE=0 off
  cmp -s $L/gen-on.txt $L/gen-off.txt && log "generate ids equal" || log "generate ids DIFFER"
  OFF=off:MOESERVE_BESIDE=0
  for r in 0 1 2; do
    SIDES="$(SIDES="$OFF on" rotated $r)" bench_sides v2lite "1 4096 16"
    SIDES="on" bench_sides qwen3 "1 4096 16"
  done
  trace v2lite 1 4096 on; trace v2lite 1 4096 off MOESERVE_BESIDE=0
  SIDES="on $OFF" bench_sides v2lite "64 256 16"; SIDES="on" bench_sides qwen3 "64 256 16"
  for side in on off; do
    for o in 16 528; do
      if [ $side = off ]; then MOESERVE_BESIDE=0 offline v2lite $o $side; else offline v2lite $o $side; fi
    done
  done
  log done
fi
