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
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $TESTS
  gtest gemv-bench 150 env MOESERVE_BENCH_GEMV=1 /tmp/b/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  wait
  ids_alike MOESERVE_GEMV_STAGED=0 - off on
  b1_rounds "before off:MOESERVE_GEMV_STAGED=0 on" "off:MOESERVE_GEMV_STAGED=0 on wait:MOESERVE_GEMV_STAGED=wait"
  trace qwen3 1 4096 off MOESERVE_GEMV_STAGED=0; trace qwen3 1 4096 on
  trace v2lite 1 4096 off MOESERVE_GEMV_STAGED=0; trace v2lite 1 4096 on
  log done
fi

# PHASE=2: the session's final tree: every single-GPU test program, the ceilings, B = 1 three
#   rounds, B = 64, the 8k prefills, the engine's step, timelines: the figures for "where the
#   targets stand".
if [ $PHASE = 2 ]; then
  JOBS=15 every_test_program
  b1_rounds final final
  SIDES=final bench_sides qwen3 "64 256 16" "1 8192 2"; SIDES=final bench_sides v2lite "64 256 16" "1 8192 2"
  for m in qwen3 v2lite; do for o in 16 528; do offline $m $o final-$m; done; done
  trace qwen3 1 4096 final; trace v2lite 1 4096 final
  log done
fi
