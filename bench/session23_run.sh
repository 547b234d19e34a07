#!/bin/bash
# Session 23's device calls (bench/BENCHMARKS.md, "Session 23"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC and
# $BEFORE_SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# REDUX instructions in each route_cluster_kernel of snapshot $1's gemv.cu (one copy of the top-k
# per kernel: one count of it), into summary.log as label $2.
route_sass() {
  nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -I$1/src -cubin -o /tmp/gemv-$2.cubin $1/src/kernels/cuda/gemv.cu &&
    cuobjdump -sass /tmp/gemv-$2.cubin | awk -v tag=$2 '/Function :/ {f = $3} /REDUX/ {c[f]++}
      END {for (k in c) if (k ~ /route_cluster/) print "sass " tag " REDUX " c[k] " " k}' | sort | tee -a "$OUT/summary.log"
}

# PHASE=1 ($SRC = s23 branch: session 22's pending patch, MOESERVE_GEMV_EARLY_CHUNKS, and the
#   router's cluster warming its tail's instructions before its wait, MOESERVE_ROUTE_WARM; $BEFORE_SRC
#   = main, 94a48c9). Tests; the SASS check that the warm and real passes share one copy of the
#   top-k; B = 1 rotating before / after / nowarm / c4 / c2 (three rounds each model); timelines.
if [ $PHASE = 1 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures test_cuda_moe_route
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  route_sass $SRC after; route_sass $BEFORE_SRC before
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_moe_route
  for c in 2 4; do MOESERVE_GEMV_EARLY_CHUNKS=$c gtest gemv-c$c 60 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Early*'; done
  MOESERVE_ROUTE_WARM=0 gtest moe-route-nowarm 120 /tmp/b/tests/test_cuda_moe_route
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before after nowarm:MOESERVE_ROUTE_WARM=0 c4:MOESERVE_GEMV_EARLY_CHUNKS=4 c2:MOESERVE_GEMV_EARLY_CHUNKS=2"
  for r in 0 2 4; do
    SIDES="$(rotated $r)" bench_sides qwen3 "1 4096 16"
    SIDES="$(rotated $(( r + 1 )))" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  trace qwen3 1 4096 nowarm MOESERVE_ROUTE_WARM=0; trace v2lite 1 4096 nowarm MOESERVE_ROUTE_WARM=0
  trace qwen3 1 4096 c4 MOESERVE_GEMV_EARLY_CHUNKS=4
  log done
fi
# Phases 2-4: $SRC's build with the tests $1 (and the commands $2 after them), the combine + norm bench,
# B = 1 rotating before / after / noslab (MOESERVE_MOE_SLAB_NORM=0), three rounds a model, timelines.
slab_compare() {
  local T=$1
  build_before 5
  JOBS=11 build_after ms_kernel_trace $T
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T
  eval "$2"
  MOESERVE_BENCH_COMBINE_NORM=1 gtest combine-bench 60 /tmp/b/tests/test_cuda_moe_combine_norm --gtest_filter='*Bench*'
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before after noslab:MOESERVE_MOE_SLAB_NORM=0"
  local r
  for r in 0 1 2; do
    SIDES="$(rotated $r)" bench_sides qwen3 "1 4096 16"
    SIDES="$(rotated $(( r + 1 )))" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  trace qwen3 1 4096 noslab MOESERVE_MOE_SLAB_NORM=0; trace v2lite 1 4096 noslab MOESERVE_MOE_SLAB_NORM=0
}

# PHASE=2 ($SRC = branch slab-norm; $BEFORE_SRC = main, 94a48c9): PHASE=1 dropped both its changes (the
#   router's warm pass made the router slower, 5.1 -> 6.2 us; half an early round moved o's time into
#   the split merge's). Now: at batch 1 the one-token experts leave each slot's row as its slabs
#   and the MoE combine + norm sums them in one cluster (MOESERVE_MOE_SLAB_NORM=0: the kernel's own
#   counter and sum, then the one-block norm). Tests (bit-exact against the unfused ops), the
#   combine + norm bench, B = 1 rotating before / after / noslab, timelines, B = 8.
if [ $PHASE = 2 ]; then
  slab_compare "test_cuda_moe_combine_norm test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe test_cuda_ops" \
    'MOESERVE_MOE_SLAB_NORM=0 gtest fixtures-noslab 120 /tmp/b/tests/test_cuda_fixtures'
  SIDES="after before" bench_sides qwen3 "8 4096 16"; SIDES="before after" bench_sides v2lite "8 4096 16"
  log done
fi
# PHASE=3 ($SRC = branch slab-norm, its second commit; $BEFORE_SRC = main): PHASE=2 found the
#   experts kernel 2.1 us (Qwen3) and 4.4 us (V2-Lite) shorter without its counter and sum, but the
#   cluster's sum took 7.5 / 11.3 us after them (slab loads in batches of 8, the small inputs read
#   one after another), and Qwen3's q|k|v 3.4 us more (launched while the experts streamed, its
#   blocks crowded onto the idle multiprocessors). Now: every small input asked for at once, 12
#   slabs in flight, the next kernel let in only after the wait. The same tests and comparison.
if [ $PHASE = 3 ]; then
  slab_compare "test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs" ""
  log done
fi
# PHASE=4 ($SRC = branch slab-norm, its third commit; $BEFORE_SRC = main): PHASE=3 left the step as
#   it was (Qwen3 0.874 / 0.874 / 0.876 ms, V2-Lite a little slower): the cluster's eight
#   multiprocessors took 6.5 / 10.6 us to read the slabs from L2 (one multiprocessor's reads are
#   bound by the loads it keeps in flight). Now H / 128 blocks (16) each sum 128 columns of every
#   slot, whole sectors a warp, store them into the residual, and the last block norms the row.
if [ $PHASE = 4 ]; then
  slab_compare "test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_one_token" ""
  log done
fi
