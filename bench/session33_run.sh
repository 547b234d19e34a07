#!/bin/bash
# Session 33's device calls (bench/BENCHMARKS.md, "Session 33"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1: the batch-1 experts kernel asks L2 for the next layer's KV rows before it waits for the
#   routing (MOESERVE_WARM_KV: 0 off, 1 on, last under evict_last). The touched tests, greedy ids
#   off against on, B = 1 rotating over off / on / last, timelines off and on.
if [ $PHASE = 1 ]; then
  TESTS="test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
    test_cuda_moe_combine_norm"
  JOBS=15 build_after ms_kernel_trace $TESTS
  models_beside_tests $TESTS
  wait
  ids_alike MOESERVE_WARM_KV=0 - off on
  b1_rounds "off:MOESERVE_WARM_KV=0 on last:MOESERVE_WARM_KV=last wrap:MOESERVE_WARM_KV=wrap" "off:MOESERVE_WARM_KV=0 on last:MOESERVE_WARM_KV=last wrap:MOESERVE_WARM_KV=wrap"
  timelines_off_on MOESERVE_WARM_KV=0
  log done
fi

# PHASE=2: the session's final tree: every single-GPU test program, the ceilings, B = 1 three
#   rounds, B = 64, the 8k prefills, the engine's step, timelines: the figures for "where the
#   targets stand".
if [ $PHASE = 2 ]; then
  target_figures
fi
