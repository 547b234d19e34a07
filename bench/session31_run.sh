#!/bin/bash
# Session 31's device calls (bench/BENCHMARKS.md, "Session 31"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1 ($SRC = 2cb215e, reverted after it): the next layer's first weight asked of L2 by the
#   batch-1 experts kernel before it waits for the routing (MOESERVE_WARM_NEXT: 0 off, 1 the normal priority, last evict_last). The
#   experts' tests and the models', greedy ids off against on, B = 1 rotating over the three
#   (Qwen3) and off / on (V2-Lite), timelines off and on.
if [ $PHASE = 1 ]; then
  TESTS="test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_combine_norm"
  JOBS=15 build_after ms_kernel_trace $TESTS
  models_beside_tests $TESTS
  wait
  ids_alike MOESERVE_WARM_NEXT=0 - off on
  b1_rounds "off:MOESERVE_WARM_NEXT=0 on last:MOESERVE_WARM_NEXT=last" "off:MOESERVE_WARM_NEXT=0 on"
  timelines_off_on MOESERVE_WARM_NEXT=0
  log done
fi

# PHASE=2 ($SRC = 5d16379, reverted after it): the router inside the post-attention norm's
#   cluster (norm_route_cluster_kernel;
#   MOESERVE_NORM_ROUTE=0: the norm's kernel and the router's as before). Its tests and the
#   models', Qwen3's greedy ids off against on, B = 1 rotating, timelines off and on.
if [ $PHASE = 2 ]; then
  TESTS="test_cuda_norm_route test_cuda_merge_project test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route
    test_cuda_moe_combine_norm test_cuda_graphs"
  JOBS=15 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b $TESTS
  wait
  gen_ids qwen3 MOESERVE_NORM_ROUTE=0 qwen3-off; gen_ids qwen3 - qwen3-on
  cmp -s $L/gen-qwen3-off.txt $L/gen-qwen3-on.txt && log "generate qwen3 ids equal" || log "generate qwen3 ids DIFFER"
  for r in 0 1 2; do SIDES="$(SIDES="off:MOESERVE_NORM_ROUTE=0 on" rotated $r)" bench_sides qwen3 "1 4096 16"; done
  trace qwen3 1 4096 off MOESERVE_NORM_ROUTE=0; trace qwen3 1 4096 on
  for o in 16 528; do offline qwen3 $o on-qwen3; MOESERVE_NORM_ROUTE=0 offline qwen3 $o off-qwen3; done
  log done
fi

# PHASE=3: the session's final tree (its src/ is session 30's final, 976c347's, both experiments
#   reverted): every single-GPU test program, the ceilings, B = 1 three rounds, B = 64, the 8k
#   prefills, the engine's step, timelines: the figures for "where the targets stand".
if [ $PHASE = 3 ]; then
  target_figures
fi

# PHASE=4 (not run in session 31; session 32 measured the patch with its own PHASE=1, and applied it): $SRC = main with bench/gpu_pending.patch
#   applied (merge_project's tiles' mma chains interleaved, the register-row warps given fewer
#   tiles; the same bits), $BEFORE_SRC = main without it: merge_project, fixtures and engine_graphs
#   tests, Qwen3's greedy ids before and after, B = 1 rotating, timelines of both.
if [ $PHASE = 4 ]; then
  snapshots_ready $BEFORE_SRC
  build_before 5
  TESTS="test_cuda_merge_project test_cuda_fixtures test_cuda_engine_graphs"
  JOBS=11 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b $TESTS
  wait
  gen_ids qwen3 - qwen3-after; B=/tmp/before/moeserve gen_ids qwen3 - qwen3-before
  cmp -s $L/gen-qwen3-after.txt $L/gen-qwen3-before.txt && log "generate qwen3 ids equal" || log "generate qwen3 ids DIFFER"
  for r in 0 1 2; do SIDES="$(SIDES="before after" rotated $r)" bench_sides qwen3 "1 4096 16"; done
  trace qwen3 1 4096 after; B=/tmp/before/moeserve trace qwen3 1 4096 before
  log done
fi
