#!/bin/bash
# Session 15's device calls (bench/BENCHMARKS.md, "Session 15"), run from the repository root on
# the GPU machine: PHASE picks the call. The source is a snapshot (git archive) carried as $SRC, the
# tree before a change as $BEFORE_SRC (phases 2 and 4). The switches the sides set existed only in
# the commits those calls measured: MOESERVE_L2_PREFETCH (58289e5, phase 1: 0 none, 1 attention's
# o_proj, 2 the routed experts' down weights, 4 their gate|up) and MOESERVE_EARLY_LOADS (358e512,
# phase 3); both changes were reverted or cut down (bench/BENCHMARKS.md, "Session 15").
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1: the L2 prefetches on and off, one binary: the decode-path tests with them on (the
#   default) and off, bench-one-batch alternating the masks at B = 1 and 64, timelines, prefills.
if [ $PHASE = 1 ]; then
  JOBS=15 build_after ms_kernel_trace test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route \
    test_cuda_attention_moe test_cuda_mla_absorb test_cuda_graphs test_cuda_gemv
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs
  MOESERVE_L2_PREFETCH=7 gtest fixtures-all 200 /tmp/b/tests/test_cuda_fixtures
  wait
  M="off:MOESERVE_L2_PREFETCH=0 o:MOESERVE_L2_PREFETCH=1 down:MOESERVE_L2_PREFETCH=2 both:MOESERVE_L2_PREFETCH=3"
  SIDES="$M all:MOESERVE_L2_PREFETCH=7" bench_sides qwen3 "1 4096 16"
  SIDES="$M" bench_sides v2lite "1 4096 16"
  SIDES="both:MOESERVE_L2_PREFETCH=3 down:MOESERVE_L2_PREFETCH=2 o:MOESERVE_L2_PREFETCH=1 off:MOESERVE_L2_PREFETCH=0" \
    bench_sides qwen3 "1 4096 16"
  SIDES="both:MOESERVE_L2_PREFETCH=3 down:MOESERVE_L2_PREFETCH=2 o:MOESERVE_L2_PREFETCH=1 off:MOESERVE_L2_PREFETCH=0" \
    bench_sides v2lite "1 4096 16"
  SIDES="off:MOESERVE_L2_PREFETCH=0 both:MOESERVE_L2_PREFETCH=3" bench_sides qwen3 "64 256 16"
  SIDES="off:MOESERVE_L2_PREFETCH=0 both:MOESERVE_L2_PREFETCH=3" bench_sides v2lite "64 256 16"
  trace qwen3 1 4096 off MOESERVE_L2_PREFETCH=0; trace qwen3 1 4096 both MOESERVE_L2_PREFETCH=3
  trace v2lite 1 4096 off MOESERVE_L2_PREFETCH=0; trace v2lite 1 4096 both MOESERVE_L2_PREFETCH=3
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_attention_moe test_cuda_mla_absorb test_cuda_graphs test_cuda_gemv
  SIDES="off:MOESERVE_L2_PREFETCH=0 both:MOESERVE_L2_PREFETCH=3" bench_sides qwen3 "1 8192 2"
  SIDES="off:MOESERVE_L2_PREFETCH=0 both:MOESERVE_L2_PREFETCH=3" bench_sides v2lite "1 8192 2"
  log done
fi
# PHASE=2: $SRC (dense products load their first round of weights into registers before waiting
#   for the kernel before them; the GQA and MLA decode kernels copy the keys earlier steps wrote
#   before theirs) against $BEFORE_SRC (main before it): tests, bench-one-batch alternating, traces.
if [ $PHASE = 2 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_gemv test_cuda_mla_decode_wgmma test_cuda_flash_prefill test_cuda_moe_route test_cuda_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe test_cuda_gemv
  MOESERVE_PDL=0 gtest fixtures-nopdl 200 /tmp/b/tests/test_cuda_fixtures
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before after" bench_sides qwen3 "1 4096 16"
  SIDES="before after" bench_sides v2lite "1 4096 16"
  SIDES="after before" bench_sides qwen3 "1 4096 16" "64 256 16"
  SIDES="after before" bench_sides v2lite "1 4096 16" "64 256 16"
  SIDES="before after" bench_sides qwen3 "1 4096 16"
  SIDES="before after" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  run_gpu_tests /tmp/b test_cuda_mla_decode_wgmma test_cuda_flash_prefill test_cuda_moe_route test_cuda_graphs
  SIDES="before after" bench_sides qwen3 "1 8192 2"
  SIDES="before after" bench_sides v2lite "1 8192 2"
  log done
fi
# PHASE=3: the two early-load changes of phase 2 apart, one binary (MOESERVE_EARLY_LOADS: 1 the
#   dense products' first weights, 2 the decode kernels' old keys), alternating at B = 1 and 64.
if [ $PHASE = 3 ]; then
  JOBS=15 build_after ms_kernel_trace test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  MOESERVE_EARLY_LOADS=2 gtest fixtures-m2 200 /tmp/b/tests/test_cuda_fixtures
  wait
  M="m0:MOESERVE_EARLY_LOADS=0 m1:MOESERVE_EARLY_LOADS=1 m2:MOESERVE_EARLY_LOADS=2 m3:MOESERVE_EARLY_LOADS=3"
  R="m3:MOESERVE_EARLY_LOADS=3 m2:MOESERVE_EARLY_LOADS=2 m1:MOESERVE_EARLY_LOADS=1 m0:MOESERVE_EARLY_LOADS=0"
  SIDES="$M" bench_sides qwen3 "1 4096 16"; SIDES="$M" bench_sides v2lite "1 4096 16"
  SIDES="$R" bench_sides qwen3 "1 4096 16"; SIDES="$R" bench_sides v2lite "1 4096 16"
  SIDES="$M" bench_sides qwen3 "1 4096 16"; SIDES="$M" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 m2 MOESERVE_EARLY_LOADS=2; trace qwen3 1 4096 m0 MOESERVE_EARLY_LOADS=0
  SIDES="m0:MOESERVE_EARLY_LOADS=0 m2:MOESERVE_EARLY_LOADS=2" bench_sides qwen3 "64 256 16" "8 4096 16"
  SIDES="m0:MOESERVE_EARLY_LOADS=0 m2:MOESERVE_EARLY_LOADS=2" bench_sides v2lite "64 256 16" "8 4096 16"
  log done
fi
# PHASE=4: the session's final tree ($SRC: only the decode kernels' early copies of old keys kept)
#   against $BEFORE_SRC (the session's start): the decode-path tests, bench-one-batch alternating
#   at B = 1 (three rounds), 8 and 64, the other GPU tests while time is left, the 8k prefills.
if [ $PHASE = 4 ]; then
  build_before 5
  TESTS=$(gpu_tests_of $SRC)
  JOBS=11 build_after $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  for r in 1 2 3; do
    SIDES="before after" bench_sides qwen3 "1 4096 16"; SIDES="after before" bench_sides v2lite "1 4096 16"
  done
  SIDES="before after" bench_sides qwen3 "8 4096 16" "64 256 16"
  SIDES="after before" bench_sides v2lite "8 4096 16" "64 256 16"
  for t in $TESTS; do [ $(left) -gt 70 ] && run_gpu_tests /tmp/b $t; done
  SIDES="after" bench_sides qwen3 "1 8192 2"
  SIDES="after" bench_sides v2lite "1 8192 2"
  log done
fi
