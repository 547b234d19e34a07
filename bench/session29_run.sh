#!/bin/bash
# Session 29's device calls (bench/BENCHMARKS.md, "Session 29"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1, run on 6b0156b: two changes behind switches (MOESERVE_ROUTE_RANK=0, the router's top-k
#   by one warp; MOESERVE_MLA_MERGE_EXPAND=0, MLA's merge and expansion as two kernels). Tests,
#   greedy ids off against on, B = 1 rotating, timelines, the engine's step.
if [ $PHASE = 1 ]; then
  TESTS="test_cuda_mla_absorb test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
    test_cuda_mla_decode_wgmma"
  JOBS=14 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $TESTS
  wait
  OFF="MOESERVE_ROUTE_RANK=0 MOESERVE_MLA_MERGE_EXPAND=0"
  ids_alike - "$OFF" on off
  b1_rounds "off:MOESERVE_ROUTE_RANK=0 both" \
    "off:MOESERVE_ROUTE_RANK=0,MOESERVE_MLA_MERGE_EXPAND=0 rank:MOESERVE_MLA_MERGE_EXPAND=0 both"
  trace qwen3 1 4096 off MOESERVE_ROUTE_RANK=0; trace qwen3 1 4096 both
  trace v2lite 1 4096 off $OFF; trace v2lite 1 4096 rank MOESERVE_MLA_MERGE_EXPAND=0; trace v2lite 1 4096 both
  for o in 16 528; do
    offline qwen3 $o both-qwen3; MOESERVE_ROUTE_RANK=0 offline qwen3 $o off-qwen3
    offline v2lite $o both-v2lite; MOESERVE_ROUTE_RANK=0 MOESERVE_MLA_MERGE_EXPAND=0 offline v2lite $o off-v2lite
  done
  log done
fi

# PHASE=2 (run on 8997df7; $SRC = main with the router's rank path removed (the first call: slower), the split merge of 17-64
#   splits by one warp a block (combine_lean; MOESERVE_COMBINE_LEAN=0: merge_many's 16 warps, as
#   before), and MLA's merge + expansion taking the same merge): the tests of the kernels changed
#   and the models'; greedy ids; B = 1 rotating; timelines; the engine's step.
if [ $PHASE = 2 ]; then
  TESTS="test_cuda_mla_absorb test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs
    test_cuda_mla_decode_wgmma test_cuda_graphs"
  JOBS=14 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $TESTS
  MOESERVE_COMBINE_LEAN=0 gtest mla-absorb-many 120 /tmp/b/tests/test_cuda_mla_absorb
  wait
  ids_alike - MOESERVE_COMBINE_LEAN=0 lean many
  b1_rounds "many:MOESERVE_COMBINE_LEAN=0 lean" "many:MOESERVE_COMBINE_LEAN=0 lean apart:MOESERVE_MLA_MERGE_EXPAND=0"
  trace qwen3 1 4096 many MOESERVE_COMBINE_LEAN=0; trace qwen3 1 4096 lean
  trace v2lite 1 4096 many MOESERVE_COMBINE_LEAN=0; trace v2lite 1 4096 lean
  trace v2lite 1 4096 apart MOESERVE_MLA_MERGE_EXPAND=0
  for o in 16 528; do
    for m in qwen3 v2lite; do offline $m $o lean-$m; MOESERVE_COMBINE_LEAN=0 offline $m $o many-$m; done
  done
  log done
fi

# PHASE=3 (run on 90ecf58; $SRC = the session's final tree with a measurement's switch (since removed), MOESERVE_MERGE_TRIGGER_EARLY=1: the
#   split merge lets the product after it launch before it waits; $BEFORE_SRC = the session's
#   start, 2770a7c): every single-GPU test program; the ceilings; greedy ids before and after;
#   B = 1 rotating and B = 64, before and after; the engine's step; timelines.
if [ $PHASE = 3 ]; then
  build_all_and_test
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  MOESERVE_MERGE_TRIGGER_EARLY=1 gtest attention-moe-trig 120 /tmp/b/tests/test_cuda_attention_moe
  before_after_figures "before after trig:MOESERVE_MERGE_TRIGGER_EARLY=1" "before after"
  trace qwen3 1 4096 after; trace qwen3 1 4096 trig MOESERVE_MERGE_TRIGGER_EARLY=1; trace v2lite 1 4096 after
  log done
fi
