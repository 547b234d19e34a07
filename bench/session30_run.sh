#!/bin/bash
# Session 30's device calls (bench/BENCHMARKS.md, "Session 30"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# Qwen3's greedy ids with merge_project off (MOESERVE_MERGE_PROJECT=0) against on, then B = 1 rotating.
off_on_qwen3() {
  gen_ids qwen3 MOESERVE_MERGE_PROJECT=0 qwen3-off; gen_ids qwen3 - qwen3-on
  cmp -s $L/gen-qwen3-off.txt $L/gen-qwen3-on.txt && log "generate qwen3 ids equal" || log "generate qwen3 ids DIFFER"
  for r in 0 1 2; do SIDES="$(SIDES="off:MOESERVE_MERGE_PROJECT=0 on" rotated $r)" bench_sides qwen3 "1 4096 16"; done
}

# PHASE=1: the batch-1 GQA split merge inside o's product (merge_project; MOESERVE_MERGE_PROJECT=0:
#   the merge kernel, o's product and the norm as before). Its tests and the models', greedy ids
#   off against on, Qwen3 B = 1 rotating, timelines, the engine's step.
if [ $PHASE = 1 ]; then
  TESTS="test_cuda_merge_project test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs
    test_cuda_moe_combine_norm test_cuda_graphs"
  JOBS=14 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b $TESTS
  wait
  off_on_qwen3
  trace qwen3 1 4096 off MOESERVE_MERGE_PROJECT=0; trace qwen3 1 4096 on
  for o in 16 528 16 528; do offline qwen3 $o on-qwen3; MOESERVE_MERGE_PROJECT=0 offline qwen3 $o off-qwen3; done
  log done
fi

# PHASE=2 and 3: one measurement switch $1 (VAR, set to 1; label $2) of merge_project against the
#   switch off and the merge kernel: its test with and without it, B = 1 rotating, the in-kernel
#   stamps (MOESERVE_MERGE_PROJECT_STAMPS=1: clock64 a block at its start, the wait's return, the
#   merge, the weights' landing and its end, printed at exit) with and without it, timelines.
#   PHASE=2 (75d5f12): the register rows asked of L2 before the wait (MOESERVE_MERGE_PROJECT_PREFETCH;
#   the stamps' buffer was then allocated inside a capture, which a capture forbids). PHASE=3
#   (5697f56): the shared rows, permuted a row, multiplied on the tensor cores (MOESERVE_MERGE_PROJECT_MMA).
switch_call() {
  local var=$1 tag=$2
  JOBS=14 build_after ms_kernel_trace test_cuda_merge_project
  model qwen3 qwen3-30b-a3b 12 &
  gtest merge-project 120 /tmp/b/tests/test_cuda_merge_project
  env $var=1 gtest merge-project-$tag 120 /tmp/b/tests/test_cuda_merge_project
  wait
  for r in 0 1 2; do
    SIDES="$(SIDES="off:MOESERVE_MERGE_PROJECT=0 on $tag:$var=1" rotated $r)" bench_sides qwen3 "1 4096 16"
  done
  SIDES="stamps:MOESERVE_MERGE_PROJECT_STAMPS=1 stamps-$tag:MOESERVE_MERGE_PROJECT_STAMPS=1,$var=1" \
    bench_sides qwen3 "1 4096 16"
  grep -E '^\[stamps\]|^error' $L/bench.log >> $OUT/summary.log
  trace qwen3 1 4096 on; trace qwen3 1 4096 $tag $var=1
  log done
}
[ $PHASE = 2 ] && switch_call MOESERVE_MERGE_PROJECT_PREFETCH pf
[ $PHASE = 3 ] && switch_call MOESERVE_MERGE_PROJECT_MMA mma

# PHASE=4 ($SRC = the session's final tree: merge_project's weights all asked for before the wait,
#   its shared rows' products on the tensor cores, the measurement switches removed; $BEFORE_SRC =
#   the session's start, 9a1e713): every single-GPU test program; the ceilings; greedy ids before
#   and after; B = 1 rotating (Qwen3 also with MOESERVE_MERGE_PROJECT=0) and B = 64, before and
#   after; the engine's step; timelines.
if [ $PHASE = 4 ]; then
  build_all_and_test
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  before_after_figures "before after off:MOESERVE_MERGE_PROJECT=0" "before after"
  trace qwen3 1 4096 after; trace qwen3 1 4096 off MOESERVE_MERGE_PROJECT=0
  log done
fi

# PHASE=5 (the device time left after refused starts did not hold PHASE=4): the final tree alone,
#   MOESERVE_MERGE_PROJECT=0 standing for the session's start (the only path the session changed):
#   the test programs of the kernels and ops it touched and the models', Qwen3's greedy ids off against on, B = 1 rotating,
#   B = 64; V2-Lite (no kernel of its changed) B = 1 and 64 once; a Qwen3 timeline.
if [ $PHASE = 5 ]; then
  TESTS="test_cuda_merge_project test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs
    test_cuda_moe_combine_norm test_cuda_moe_one_token test_cuda_graphs test_cuda_ops"
  JOBS=15 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $TESTS
  wait
  off_on_qwen3
  trace qwen3 1 4096 on
  SIDES="off:MOESERVE_MERGE_PROJECT=0 on" bench_sides qwen3 "64 256 16"
  SIDES=on bench_sides v2lite "1 4096 16" "64 256 16"
  log done
fi

# PHASE=6 (less device time still): the final tree's merge_project, fixtures and graph tests, Qwen3's
#   greedy ids off against on, B = 1 off / on rotating.
if [ $PHASE = 6 ]; then
  TESTS="test_cuda_merge_project test_cuda_fixtures test_cuda_engine_graphs"
  JOBS=15 build_after $TESTS
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b $TESTS
  wait
  off_on_qwen3
  log done
fi
