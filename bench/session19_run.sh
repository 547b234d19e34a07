#!/bin/bash
# Session 19's device calls (bench/BENCHMARKS.md, "Session 19"), run from the repository root on
# the GPU machine: PHASE picks the call; the source is a snapshot (git archive) carried as $SRC.
# (The first call ran session18_run.sh's PHASE=6 on main + that session's pending patch.)
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1: the post-attention residual add and norm inside the router's cluster
#   (MOESERVE_NORM_ROUTE=0 keeps the norm's kernel): the routing and decode-path tests, B = 1
#   alternating (three rounds each model), timelines both ways, then the engine's overlapped
#   decode (bench-offline, 16 and 528 new tokens) and the targets' other shapes while time lasts.
if [ $PHASE = 1 ]; then
  OFF=off:MOESERVE_NORM_ROUTE=0
  JOBS=16 build_after ms_kernel_trace test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe test_cuda_moe_one_token
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_moe_one_token
  wait
  for r in 1 2 3; do
    SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $OFF" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_NORM_ROUTE=0; trace v2lite 1 4096 on
  for m in qwen3 v2lite; do offline $m 16 on; offline $m 528 on; done
  SIDES="on" bench_sides qwen3 "64 256 16"; SIDES="on" bench_sides v2lite "64 256 16"
  log done
fi
# The decode-path tests with the bulk prefetch; the product's bench cold in each prefetch mode,
# then hot in L2 (the build /tmp/b of phase 2).
gemv_benches() {
  MOESERVE_GEMV_PREFETCH=bulk gtest fixtures-bulk 120 /tmp/b/tests/test_cuda_fixtures
  MOESERVE_GEMV_PREFETCH=bulk gtest engine_graphs-bulk 120 /tmp/b/tests/test_cuda_engine_graphs
  for mode in line bulk none; do
    MOESERVE_GEMV_PREFETCH=$mode MOESERVE_BENCH_GEMV=1 gtest gemv-bench-$mode 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  done
  MOESERVE_BENCH_GEMV_HOT=1 MOESERVE_BENCH_GEMV=1 gtest gemv-bench-hot 60 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
}
# PHASE=2: how the streaming product asks L2 for its first slab before it waits
#   (MOESERVE_GEMV_PREFETCH=line, the default; bulk, since removed; none): the product's tests, its bench cold in
#   each mode and hot in L2, the decode-path tests with bulk, B = 1 alternating line / bulk / none
#   (three rounds each model), timelines of bulk and none.
if [ $PHASE = 2 ]; then
  JOBS=16 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  gemv_benches
  wait
  S3="line:MOESERVE_GEMV_PREFETCH=line bulk:MOESERVE_GEMV_PREFETCH=bulk none:MOESERVE_GEMV_PREFETCH=none"
  for r in 1 2 3; do SIDES="$S3" bench_sides qwen3 "1 4096 16"; SIDES="$S3" bench_sides v2lite "1 4096 16"; done
  trace qwen3 1 4096 bulk MOESERVE_GEMV_PREFETCH=bulk; trace qwen3 1 4096 none MOESERVE_GEMV_PREFETCH=none
  trace qwen3 1 4096 line MOESERVE_GEMV_PREFETCH=line
  log done
fi
# PHASE=3: phase 2's benches again on its warm machine (their paths were wrong there).
if [ $PHASE = 3 ]; then gemv_benches; log done; fi
# PHASE=4 (on d07ae04; the trigger switch was removed after it): when the norm after a MoE block lets the next layer's q|k|v product launch and
#   prefetch (MOESERVE_NORM_TRIGGER=early, the default; moe: after its reads; late: every norm),
#   against no prefetch at all (MOESERVE_GEMV_PREFETCH=none): the norm's and decode-path tests
#   with moe, B = 1 alternating (three rounds each model), timelines of moe and late.
if [ $PHASE = 4 ]; then
  JOBS=16 build_after ms_kernel_trace test_cuda_moe_combine_norm test_cuda_ops test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  export MOESERVE_NORM_TRIGGER=moe
  run_gpu_tests /tmp/b test_cuda_moe_combine_norm test_cuda_ops test_cuda_fixtures test_cuda_engine_graphs
  unset MOESERVE_NORM_TRIGGER
  wait
  S4="early moe:MOESERVE_NORM_TRIGGER=moe late:MOESERVE_NORM_TRIGGER=late none:MOESERVE_GEMV_PREFETCH=none"
  for r in 1 2 3; do SIDES="$S4" bench_sides qwen3 "1 4096 16"; SIDES="$S4" bench_sides v2lite "1 4096 16"; done
  trace qwen3 1 4096 moe MOESERVE_NORM_TRIGGER=moe; trace qwen3 1 4096 late MOESERVE_NORM_TRIGGER=late
  trace v2lite 1 4096 moe MOESERVE_NORM_TRIGGER=moe; trace v2lite 1 4096 none MOESERVE_GEMV_PREFETCH=none
  trace v2lite 1 4096 early
  log done
fi
# PHASE=5: the final tree (no prefetch by default; MOESERVE_GEMV_PREFETCH=line the old way): the
#   ceilings, the tests of what the session touched, B = 1 alternating line / default (three
#   rounds each model), the targets' other shapes, the engine's overlapped decode, a timeline.
if [ $PHASE = 5 ]; then
  LINE=line:MOESERVE_GEMV_PREFETCH=line
  JOBS=16 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_moe_route test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route \
    test_cuda_attention_moe
  wait
  for r in 1 2 3; do SIDES="$LINE on" bench_sides qwen3 "1 4096 16"; SIDES="on $LINE" bench_sides v2lite "1 4096 16"; done
  SIDES="on" bench_sides qwen3 "64 256 16" "1 8192 2"; SIDES="on" bench_sides v2lite "64 256 16" "1 8192 2"
  for m in qwen3 v2lite; do offline $m 16 on; offline $m 528 on; done
  trace qwen3 1 4096 on
  log done
fi
# PHASE=6 (for the next session; $SRC = main with bench/gpu_pending.patch applied): the batch-1
#   dense products with their weights fetched by the copy engine into shared memory
#   (gemv_bulk_kernel, MOESERVE_GEMV_BULK=1: copies before pdl_wait; late: after it; off by
#   default): the product's tests (the bulk variant of every dense BF16 shape) and the decode-path
#   tests with it on, its bench cold and hot in L2, B = 1 alternating off / 1 / late (three rounds
#   each model), timelines.
if [ $PHASE = 6 ]; then
  ON="bulk:MOESERVE_GEMV_BULK=1 late:MOESERVE_GEMV_BULK=late"
  JOBS=16 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv
  export MOESERVE_GEMV_BULK=1
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  unset MOESERVE_GEMV_BULK
  MOESERVE_GEMV_BULK=late gtest fixtures-late 120 /tmp/b/tests/test_cuda_fixtures
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  MOESERVE_BENCH_GEMV_HOT=1 MOESERVE_BENCH_GEMV=1 gtest gemv-bench-hot 60 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  wait
  for r in 1 2 3; do SIDES="off $ON" bench_sides qwen3 "1 4096 16"; SIDES="$ON off" bench_sides v2lite "1 4096 16"; done
  trace qwen3 1 4096 bulk MOESERVE_GEMV_BULK=1; trace qwen3 1 4096 late MOESERVE_GEMV_BULK=late
  trace qwen3 1 4096 off; trace v2lite 1 4096 bulk MOESERVE_GEMV_BULK=1
  log done
fi
