#!/bin/bash
# Session 33's device calls (bench/BENCHMARKS.md, "Session 33"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1 (ran at c261dba; its source reverted since): the batch-1 experts kernel asks L2 for the
#   next layer's KV rows before it waits for the routing (MOESERVE_WARM_KV: 0 off, 1 on, last under
#   evict_last, wrap also the next step's first layer). The touched tests, greedy ids off against
#   on, B = 1 rotating over off / on / last / wrap, timelines off and on.
if [ $PHASE = 1 ]; then
  tests_and_models test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_moe_combine_norm
  ids_alike MOESERVE_WARM_KV=0 - off on
  SIDES="off:MOESERVE_WARM_KV=0 on last:MOESERVE_WARM_KV=last wrap:MOESERVE_WARM_KV=wrap"
  b1_rounds "$SIDES" "$SIDES"
  timelines_off_on MOESERVE_WARM_KV=0
  log done
fi

# PHASE=3 (ran at cd4c8f6; its source reverted since): MOESERVE_SMEM_CARVEOUT (every launch_pdl
#   kernel asks for that shared-memory share; off: the driver's choice): the fixtures and engine
#   graphs with 100, B = 1 rotating over off / 100 / 50, B = 64 once a side, timelines off and 100.
if [ $PHASE = 3 ]; then
  tests_and_models test_cuda_fixtures test_cuda_engine_graphs
  gtest fixtures-c100 120 env MOESERVE_SMEM_CARVEOUT=100 /tmp/b/tests/test_cuda_fixtures
  gtest graphs-c100 120 env MOESERVE_SMEM_CARVEOUT=100 /tmp/b/tests/test_cuda_engine_graphs
  SIDES="off c100:MOESERVE_SMEM_CARVEOUT=100 c50:MOESERVE_SMEM_CARVEOUT=50"
  b1_rounds "$SIDES" "$SIDES"
  bench_sides qwen3 "64 256 16"
  SIDES="c50:MOESERVE_SMEM_CARVEOUT=50 c100:MOESERVE_SMEM_CARVEOUT=100 off" bench_sides v2lite "64 256 16"
  for m in qwen3 v2lite; do trace $m 1 4096 off; trace $m 1 4096 c100 MOESERVE_SMEM_CARVEOUT=100; done
  log done
fi

# PHASE=2: the session's final tree, labelled final (the batch-1 products launched with the whole
#   L1 / shared-memory array as shared memory; off: MOESERVE_GEMV_CARVEOUT=0): the test programs
#   of the products and of whole models (device time was short: not every program), the ceilings,
#   B = 1 three rounds final / off, timelines final / off, B = 64, the 8k prefills, the engine's
#   step: the figures for "where the targets stand".
if [ $PHASE = 2 ]; then
  tests_and_models test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_mla_absorb test_cuda_fused test_cuda_merge_project test_cuda_moe_one_token
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  b1_rounds "final off:MOESERVE_GEMV_CARVEOUT=0" "off:MOESERVE_GEMV_CARVEOUT=0 final"
  for m in qwen3 v2lite; do trace $m 1 4096 final; trace $m 1 4096 off MOESERVE_GEMV_CARVEOUT=0; done
  SIDES=final bench_sides qwen3 "64 256 16" "1 8192 2"; SIDES=final bench_sides v2lite "64 256 16" "1 8192 2"
  for m in qwen3 v2lite; do for o in 16 528; do offline $m $o final-$m; done; done
  log done
fi

# PHASE=4 (ran in session 34 at bbcac5b; the patch dropped and deleted since): $SRC = main with
#   bbcac5b's bench/gpu_pending.patch applied (MOESERVE_GEMV_NO_L1: the carveout's products load
#   their weights without L1 lines). Confirms
#   the narrowed carveout (9fbb3c0) against the driver's split and measures the patch: the touched
#   tests, B = 1 rotating over final / nol1 / off (MOESERVE_GEMV_CARVEOUT=0), timelines of each.
if [ $PHASE = 4 ]; then
  tests_and_models test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  gtest fixtures-nol1 120 env MOESERVE_GEMV_NO_L1=1 /tmp/b/tests/test_cuda_fixtures
  SIDES="final nol1:MOESERVE_GEMV_NO_L1=1 off:MOESERVE_GEMV_CARVEOUT=0"
  b1_rounds "$SIDES" "$SIDES"
  for m in qwen3 v2lite; do
    trace $m 1 4096 final; trace $m 1 4096 nol1 MOESERVE_GEMV_NO_L1=1; trace $m 1 4096 off MOESERVE_GEMV_CARVEOUT=0
  done
  log done
fi
