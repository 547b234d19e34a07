#!/bin/bash
# Session 28's device calls (bench/BENCHMARKS.md, "Session 28"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 (run on 94e5c72; $SRC = main with four changes, all on by default, and their switches:
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

# PHASE=2 (run on 41a5c6d; $SRC = the session's final tree, $BEFORE_SRC = its start, 93831b2): every single-GPU
#   test program; the ceilings; greedy ids of both models before and after (the changes keep the
#   bits); B = 1 rotating and B = 64, before and after; the engine's decode step; timelines.
if [ $PHASE = 2 ]; then
  build_all_and_test
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  before_after_figures "before after" "before after"
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  log done
fi

# PHASE=3 (run on 3ee66a1; $SRC = the final tree with a measurement's switch, MOESERVE_QKV_EARLY=1: Qwen3's q|k|v
#   product marked to fetch its weights early, as o and MLA's q|kv_a are): the fixtures with it;
#   Qwen3 at B = 1 rotating, as is, with the switch, and with every dense product early
#   (MOESERVE_GEMV_PREFETCH=regs); timelines.
if [ $PHASE = 3 ]; then
  JOBS=14 build_after ms_kernel_trace test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12
  MOESERVE_QKV_EARLY=1 gtest fixtures-qkv 120 /tmp/b/tests/test_cuda_fixtures
  MOESERVE_QKV_EARLY=1 gtest graphs-qkv 120 /tmp/b/tests/test_cuda_engine_graphs
  gen_ids qwen3 - on; gen_ids qwen3 MOESERVE_QKV_EARLY=1 qkv
  cmp -s $L/gen-on.txt $L/gen-qkv.txt && log "generate ids equal" || log "generate ids DIFFER"
  for r in 0 1 2 3; do
    SIDES="$(SIDES="after qkv:MOESERVE_QKV_EARLY=1 regs:MOESERVE_GEMV_PREFETCH=regs" rotated $r)" bench_sides qwen3 "1 4096 16"
  done
  trace qwen3 1 4096 after; trace qwen3 1 4096 qkv MOESERVE_QKV_EARLY=1; trace qwen3 1 4096 regs MOESERVE_GEMV_PREFETCH=regs
  for o in 16 528; do offline qwen3 $o after; MOESERVE_QKV_EARLY=1 offline qwen3 $o qkv; done
  log done
fi

# PHASE=4 (run on c4c0511; $SRC = the final tree with the MoE combine + norm's slabs all in flight at once, 22 a
#   thread; MOESERVE_SLAB_BATCH=12, a measurement's switch, the 12 of before): its test (a new
#   case with V2-Lite's 22 slabs a slot) and the models'; greedy ids both ways; B = 1 rotating,
#   V2-Lite (22 slabs a slot: two rounds of loads before) and Qwen3 (12: one round either way);
#   timelines.
if [ $PHASE = 4 ]; then
  JOBS=14 build_after ms_kernel_trace test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs
  model v2lite deepseek-v2-lite 9 & model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs
  MOESERVE_SLAB_BATCH=12 gtest combine-norm-12 120 /tmp/b/tests/test_cuda_moe_combine_norm
  wait
  gen_ids v2lite - b22; gen_ids v2lite MOESERVE_SLAB_BATCH=12 b12
  cmp -s $L/gen-b22.txt $L/gen-b12.txt && log "generate ids equal" || log "generate ids DIFFER"
  b1_rounds "b22 b12:MOESERVE_SLAB_BATCH=12" "b22 b12:MOESERVE_SLAB_BATCH=12"
  trace v2lite 1 4096 b22; trace v2lite 1 4096 b12 MOESERVE_SLAB_BATCH=12
  for o in 16 528; do offline v2lite $o b22; MOESERVE_SLAB_BATCH=12 offline v2lite $o b12; done
  log done
fi

# PHASE=5 (run on ffd055d; $SRC = the final tree with the MoE combine + norm asking for the slabs before the slots'
#   row numbers arrive; MOESERVE_SLAB_ROWS_FIRST=1, a measurement's switch, waits for them as
#   before): its test both ways and the fixtures; B = 1 rotating, both models; Qwen3's timelines.
if [ $PHASE = 5 ]; then
  JOBS=15 build_after ms_kernel_trace test_cuda_moe_combine_norm test_cuda_fixtures
  model v2lite deepseek-v2-lite 9 & model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b test_cuda_moe_combine_norm test_cuda_fixtures
  MOESERVE_SLAB_ROWS_FIRST=1 gtest combine-norm-rf 120 /tmp/b/tests/test_cuda_moe_combine_norm
  wait
  b1_rounds "early rf:MOESERVE_SLAB_ROWS_FIRST=1" "early rf:MOESERVE_SLAB_ROWS_FIRST=1"
  trace qwen3 1 4096 early; trace qwen3 1 4096 rf MOESERVE_SLAB_ROWS_FIRST=1
  log done
fi
