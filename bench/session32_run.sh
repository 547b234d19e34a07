#!/bin/bash
# Session 32's device calls (bench/BENCHMARKS.md, "Session 32"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1: $SRC = the staged dense product (gemv_staged_kernel; MOESERVE_GEMV_STAGED=0 off, wait:
#   not for weights marked fetch_early) with session 31's bench/gpu_pending.patch applied
#   (merge_project's interleaved tiles), $BEFORE_SRC = the commit before both. The touched tests,
#   the gemv bench (auto = staged against streamed), greedy ids staged off against on, B = 1
#   rotating (Qwen3: before / off / on, so off against before is the patch; V2-Lite, which has no
#   merge_project: off / on / wait), timelines off and on.
if [ $PHASE = 1 ]; then
  snapshots_ready $BEFORE_SRC
  build_before 5
  TESTS="test_cuda_gemv test_cuda_merge_project test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
    test_cuda_mla_absorb test_cuda_fused"
  JOBS=11 build_after ms_kernel_trace $TESTS
  models_beside_tests $TESTS
  gtest gemv-bench 150 env MOESERVE_BENCH_GEMV=1 /tmp/b/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  wait
  ids_alike MOESERVE_GEMV_STAGED=0 - off on
  b1_rounds "before off:MOESERVE_GEMV_STAGED=0 on" "off:MOESERVE_GEMV_STAGED=0 on wait:MOESERVE_GEMV_STAGED=wait"
  timelines_off_on MOESERVE_GEMV_STAGED=0
  log done
fi

# PHASE=2: the session's final tree: every single-GPU test program, the ceilings, B = 1 three
#   rounds, B = 64, the 8k prefills, the engine's step, timelines: the figures for "where the
#   targets stand".
if [ $PHASE = 2 ]; then
  target_figures
fi
