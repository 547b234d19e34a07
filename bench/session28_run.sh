#!/bin/bash
# Session 28's device calls (bench/BENCHMARKS.md, "Session 28"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 ($SRC = main with four changes, all on by default, and their switches:
#   MOESERVE_EXPERT_TABLE_EARLY=0 the one-token experts read their weights' addresses after the
#   routing; MOESERVE_SLAB_NORM_CLUSTER=0 the MoE combine + norm meets at a counter and norms in
#   its last block; MOESERVE_BESIDE=0 also MLA's absorption waits for the rope (and the shared
#   expert for the router, as in session 27); MOESERVE_SPLIT_KEYS=n at least n keys a decode
#   split): the tests of the kernels changed and the models'; greedy ids of both models with
#   every switch off against on; B = 1 rotating; timelines.
if [ $PHASE = 1 ]; then
  TESTS="test_cuda_moe_one_token test_cuda_moe_combine_norm test_cuda_mla_absorb test_cuda_moe_route test_cuda_fixtures
    test_cuda_engine_graphs test_cuda_attention_moe test_cuda_fused"
  JOBS=14 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $TESTS
  wait
  OFF="MOESERVE_EXPERT_TABLE_EARLY=0 MOESERVE_SLAB_NORM_CLUSTER=0 MOESERVE_BESIDE=0"
  for m in qwen3 v2lite; do
    gen_ids $m - $m-on; gen_ids $m "$OFF" $m-off
    cmp -s $L/gen-$m-on.txt $L/gen-$m-off.txt && log "generate $m ids equal" || log "generate $m ids DIFFER"
  done
  TC0=tc0:MOESERVE_EXPERT_TABLE_EARLY=0,MOESERVE_SLAB_NORM_CLUSTER=0 TABLE=table:MOESERVE_SLAB_NORM_CLUSTER=0
  b1_rounds "$TC0 $TABLE both sk256:MOESERVE_SPLIT_KEYS=256 sk512:MOESERVE_SPLIT_KEYS=512" \
    "$TC0 nb:MOESERVE_BESIDE=0 both sk128:MOESERVE_SPLIT_KEYS=128 sk256:MOESERVE_SPLIT_KEYS=256"
  trace qwen3 1 4096 tc0 MOESERVE_EXPERT_TABLE_EARLY=0 MOESERVE_SLAB_NORM_CLUSTER=0; trace qwen3 1 4096 both
  trace qwen3 1 4096 sk256 MOESERVE_SPLIT_KEYS=256
  trace v2lite 1 4096 tc0 MOESERVE_EXPERT_TABLE_EARLY=0 MOESERVE_SLAB_NORM_CLUSTER=0; trace v2lite 1 4096 both
  trace v2lite 1 4096 nb MOESERVE_BESIDE=0; trace v2lite 1 4096 sk128 MOESERVE_SPLIT_KEYS=128
  log done
fi
