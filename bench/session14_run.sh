#!/bin/bash
# Session 14's device calls (bench/BENCHMARKS.md, "Session 14"), run from the repository root on
# the GPU machine: PHASE picks the call. The source is a snapshot (git archive) carried as $SRC, the
# tree before a change as $BEFORE_SRC (phases 2-4). The switches the sides set (MOESERVE_GEMV_STAGES,
# MOESERVE_GQA_FUSED_MERGE) existed only in the commits those calls measured; every change they
# measured was reverted. Everything lands in $L and $OUT/summary.log.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 (the commit 2b4a0fa): the streaming product. Its tests (bit for bit against the register kernel, every launch
#   shape against the host), the per-shape gemv bench (every ring depth), the tests of the decode
#   path, bench-one-batch register / streaming in both orders at B = 1 and 64, the 8k prefills, timelines.
if [ $PHASE = 1 ]; then
  JOBS=15 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route \
    test_cuda_attention_moe test_cuda_mla_absorb test_cuda_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench 150 /tmp/b/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs
  wait
  SIDES="reg:MOESERVE_GEMV_STAGES=1 stream" bench_sides qwen3 "1 4096 16" "64 256 16"
  SIDES="reg:MOESERVE_GEMV_STAGES=1 stream" bench_sides v2lite "1 4096 16" "64 256 16"
  SIDES="stream reg:MOESERVE_GEMV_STAGES=1 s2:MOESERVE_GEMV_STAGES=2 s4:MOESERVE_GEMV_STAGES=4 s8:MOESERVE_GEMV_STAGES=8" \
    bench_sides qwen3 "1 4096 16"
  SIDES="stream reg:MOESERVE_GEMV_STAGES=1" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 stream; trace qwen3 1 4096 reg MOESERVE_GEMV_STAGES=1
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_attention_moe test_cuda_mla_absorb test_cuda_graphs
  SIDES="stream" bench_sides qwen3 "1 8192 2"
  SIDES="stream" bench_sides v2lite "1 8192 2"
  log done
fi
# PHASE=2: $SRC (the BF16 product's lanes load whole 32-byte sectors) against $BEFORE_SRC (main
#   before it): the tests of the products, both trees' gemv bench, bench-one-batch in both orders
#   at B = 1 and 64, timelines, then the other decode-path tests.
# PHASE=3: the same for $SRC = 8 warps for q|k|v and the down product's prefetch (cacb654).
if [ $PHASE = 2 ] || [ $PHASE = 3 ]; then
  [ -e $BEFORE_SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $BEFORE_SRC/tests/fixtures
  mkdir -p .b4/before; ln -sfn $ROOT/.b4/before /tmp/before
  (configure_tree $BEFORE_SRC /tmp/before && cmake --build /tmp/before -j5 --target moeserve test_cuda_gemv) \
    > $L/build-before.log 2>&1 &
  JOBS=11 build_after ms_kernel_trace test_cuda_gemv test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_attention_moe test_cuda_mla_absorb test_cuda_graphs test_cuda_parallel
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_moe_route
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench-after 100 /tmp/b/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench-before 100 /tmp/before/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  SIDES="before after" bench_sides qwen3 "1 4096 16" "64 256 16"
  SIDES="before after" bench_sides v2lite "1 4096 16" "64 256 16"
  SIDES="after before" bench_sides qwen3 "1 4096 16"
  SIDES="after before" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 after
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe test_cuda_mla_absorb test_cuda_graphs
  SIDES="after" bench_sides qwen3 "1 8192 2"
  SIDES="after" bench_sides v2lite "1 8192 2"
  log done
fi
# PHASE=4: $SRC (grouped one-tile products in one wave; the GQA decode merging its own splits)
#   against $BEFORE_SRC, and against itself with MOESERVE_GQA_FUSED_MERGE=0 (one wave only).
if [ $PHASE = 4 ]; then
  [ -e $BEFORE_SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $BEFORE_SRC/tests/fixtures
  mkdir -p .b4/before; ln -sfn $ROOT/.b4/before /tmp/before
  (configure_tree $BEFORE_SRC /tmp/before && cmake --build /tmp/before -j4 --target moeserve) > $L/build-before.log 2>&1 &
  JOBS=12 build_after ms_kernel_trace test_cuda_gemv test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_moe_route test_cuda_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_gemv
  MOESERVE_PDL=0 gtest attn-nopdl 120 /tmp/b/tests/test_cuda_attention_moe
  MOESERVE_BENCH_ATTENTION=1 gtest attn-bench 100 /tmp/b/tests/test_cuda_attention_moe --gtest_filter=CudaOps.DecodeAttentionBench
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before unfused:MOESERVE_GQA_FUSED_MERGE=0 after" bench_sides qwen3 "1 4096 16"
  SIDES="before unfused:MOESERVE_GQA_FUSED_MERGE=0 after" bench_sides v2lite "1 4096 16"
  SIDES="after unfused:MOESERVE_GQA_FUSED_MERGE=0 before" bench_sides qwen3 "1 4096 16" "64 256 16" "8 4096 16"
  SIDES="after before" bench_sides v2lite "1 4096 16" "64 256 16"
  trace qwen3 1 4096 after
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route test_cuda_graphs
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench 100 /tmp/b/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  log done
fi
# PHASE=5: the session's final tree ($SRC; its src is f7eeda8's): every single-GPU test program,
#   then bench-one-batch of both models at B = 1 and 64 and the 8k prefills while time is left.
if [ $PHASE = 5 ]; then
  TESTS=$(gpu_tests_of $SRC)
  JOBS=16 build_after $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  for t in test_cuda_fixtures test_cuda_engine_graphs $TESTS; do [ $(left) -gt 60 ] && run_gpu_tests /tmp/b $t; done
  wait
  SIDES="final" bench_sides qwen3 "1 4096 16" "64 256 16" "1 8192 2"
  SIDES="final" bench_sides v2lite "1 4096 16" "64 256 16" "1 8192 2"
  log done
fi
