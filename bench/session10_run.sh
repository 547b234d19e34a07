#!/usr/bin/env bash
# Session 10's GPU calls (device tool, nvidia-h200), from the repository root; build and model
# directories under .b4/ (ignored), so a warm machine reuses them.
# PHASE=1 (ran on 68d2eb2, which still had MOESERVE_DECODE_CLUSTER): $SRC (session 9's GPU-pending
#   kernels applied, both off by default): their tests and
#   kernel benches, then bench-one-batch at B = 1 with each one's variable set and unset (one
#   binary), an op trace of the eager B = 1 step, and the machine's ceilings.
# Carry [".deps", "$SRC"]. Logs go to /tmp/logs, which the caller tars into $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s10} PHASE=${PHASE:-1}
RESULTS=$L

[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
if [ $PHASE = 1 ]; then
  JOBS=14 build_after ms_cuda_ceilings test_cuda_gemv test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 60 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  gtest gemv 300 /tmp/b/tests/test_cuda_gemv --gtest_filter='CudaGemv.*-CudaGemv.Bench'
  gtest cluster 200 /tmp/b/tests/test_cuda_attention_moe \
    --gtest_filter='CudaOps.GqaAttentionMatchesCpu:CudaOps.ClusteredGqaDecodeMatchesCpuAndMergeKernel:CudaOps.CapturedDecodeAttentionMatchesCpu'
  MOESERVE_BENCH_GEMV=1 gtest gemv_bench 120 /tmp/b/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  MOESERVE_BENCH_ATTENTION=1 gtest cluster_bench 120 /tmp/b/tests/test_cuda_attention_moe --gtest_filter=CudaOps.DecodeClusterBench
  wait
  SIDES="off bulk:MOESERVE_GEMV_VARIANT=bulk cluster:MOESERVE_DECODE_CLUSTER=1 both:MOESERVE_GEMV_VARIANT=bulk,MOESERVE_DECODE_CLUSTER=1 off both:MOESERVE_GEMV_VARIANT=bulk,MOESERVE_DECODE_CLUSTER=1"
  bench_sides qwen3 "1 4096 16"; bench_sides v2lite "1 4096 16"
  SIDES="off both:MOESERVE_GEMV_VARIANT=bulk,MOESERVE_DECODE_CLUSTER=1" bench_sides qwen3 "64 256 16"
  SIDES="trace:--trace-ops,--disable-cuda-graph" bench_sides qwen3 "1 4096 4"
  SIDES="tboth:MOESERVE_GEMV_VARIANT=bulk,MOESERVE_DECODE_CLUSTER=1,--trace-ops,--disable-cuda-graph" bench_sides qwen3 "1 4096 4"
  grep -A30 'The last decode step' $L/bench.log >> "$OUT/summary.log"
  log done
fi
# PHASE=2: $SRC (bulk copies by default for small dense products) against $BEFORE_SRC: the gemv
#   tests and bench (now with the lm_heads), the ceilings with the cost of a kernel boundary, the
#   fixtures and engine graphs, then B = 1 decode before / after and with the register kernel.
if [ $PHASE = 2 ]; then
  build_before
  BB=$!
  JOBS=12 build_after ms_cuda_ceilings test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 60 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  gtest gemv 300 /tmp/b/tests/test_cuda_gemv --gtest_filter='CudaGemv.*-CudaGemv.Bench'
  gtest fixtures 120 /tmp/b/tests/test_cuda_fixtures
  gtest engine_graphs 200 /tmp/b/tests/test_cuda_engine_graphs
  MOESERVE_BENCH_GEMV=1 gtest gemv_bench 150 /tmp/b/tests/test_cuda_gemv --gtest_filter=CudaGemv.Bench
  wait; wait $BB; log "before built rc=$?"
  SIDES="before after reg:MOESERVE_GEMV_VARIANT=default before after"
  bench_sides qwen3 "1 4096 16"; bench_sides v2lite "1 4096 16"
  SIDES="before after" bench_sides qwen3 "64 256 16"; SIDES="before after" bench_sides v2lite "64 256 16"
  log done
fi
# PHASE=3: $SRC (main with MOESERVE_SMEM_CARVEOUT, helper-47's warp-specialized grouped GEMM shapes
#   merged): B = 1 and 64 decode with and without one shared-memory carveout for every kernel;
#   each new grouped GEMM shape tested alone (a hang costs its own timeout), timed, and the 8k
#   prefills with each shape that passed.
if [ $PHASE = 3 ]; then
  JOBS=14 build_after test_cuda_grouped_gemm test_cuda_attention_moe
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  for c in "" 100; do
    MOESERVE_SMEM_CARVEOUT=$c MOESERVE_BENCH_ATTENTION=1 gtest attn_bench_c$c 90 /tmp/b/tests/test_cuda_attention_moe --gtest_filter='CudaOps.DecodeAttentionBench'
  done
  OK=""
  for t in ws128x256x64 wsg128x256x64 ws128x128x64 wspp128x128x64 wsppg128x128x64; do
    MOESERVE_GROUPED_TEST_TILES=$t gtest gg_$t 100 /tmp/b/tests/test_cuda_grouped_gemm \
      --gtest_filter='CudaGroupedGemm.RaggedGroupsMatchHost:CudaGroupedGemm.TileShapeByName:CudaGroupedGemm.MoeExpertsMatchCpuAtPrefillSizes'
    grep -q '^\[  PASSED  \] 3 tests' $L/gg_$t.log && OK="$OK,$t"
  done
  log "passed:$OK"
  MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=wgmma128x128x64,wgmma128x256x64$OK gtest gg_bench 150 \
    /tmp/b/tests/test_cuda_grouped_gemm --gtest_filter=CudaGroupedGemm.GroupedGemmBench
  wait
  SIDES="off c100:MOESERVE_SMEM_CARVEOUT=100 off c100:MOESERVE_SMEM_CARVEOUT=100"
  bench_sides qwen3 "1 4096 16"; bench_sides v2lite "1 4096 16"
  SIDES="off c100:MOESERVE_SMEM_CARVEOUT=100" bench_sides qwen3 "64 256 16"; SIDES="off c100:MOESERVE_SMEM_CARVEOUT=100" bench_sides v2lite "64 256 16"
  SIDES="main"; for t in ${OK//,/ }; do SIDES="$SIDES $t:MOESERVE_GROUPED_GEMM_TILE=$t"; done
  bench_sides qwen3 "1 8192 2"; bench_sides v2lite "1 8192 2"
  log done
fi
# PHASE=4: $SRC (main with helper-48's integer FP8 dequantisation, the default; MOESERVE_FP8_DEQUANT=cvt
#   is the old kernels in the same binary): the FP8 tests (also on mma.sync alone), the FP8 grouped
#   bench, the fixtures, then DeepSeek-V3's EP8 shard (L = 2 / 5) decode at B = 64, 128 (1536 keys)
#   and 256 (128) with int and cvt alternating, and an op trace of a B = 64 step each way.
if [ $PHASE = 4 ]; then
  JOBS=14 build_after test_cuda_grouped_gemm_fp8 test_cuda_fixtures test_cuda_engine_graphs test_cuda_fp8_gemm
  (for l in 2 5; do model v3ep8-$l deepseek-v3 $l --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; done) &
  MG=$!
  gtest fp8 240 /tmp/b/tests/test_cuda_grouped_gemm_fp8 --gtest_filter='CudaGroupedGemmFp8.*-*Bench'
  MOESERVE_FP8_WGMMA=0 gtest fp8_mma 200 /tmp/b/tests/test_cuda_grouped_gemm_fp8 --gtest_filter='CudaGroupedGemmFp8.*-*Bench'
  MOESERVE_BENCH_FP8_GROUPED=1 gtest fp8_bench 150 /tmp/b/tests/test_cuda_grouped_gemm_fp8 --gtest_filter='*FP8GroupedBench'
  gtest fixtures 120 /tmp/b/tests/test_cuda_fixtures
  gtest engine_graphs 200 /tmp/b/tests/test_cuda_engine_graphs
  gtest fp8_gemm 120 /tmp/b/tests/test_cuda_fp8_gemm
  wait $MG
  SIDES="int cvt:MOESERVE_FP8_DEQUANT=cvt int cvt:MOESERVE_FP8_DEQUANT=cvt"
  for l in 2 5; do bench_sides v3ep8-$l "64 1536 16" "128 1536 16"; done
  SIDES="int cvt:MOESERVE_FP8_DEQUANT=cvt"
  for l in 2 5; do bench_sides v3ep8-$l "256 128 16"; done
  SIDES="tint:--trace-ops,--disable-cuda-graph tcvt:MOESERVE_FP8_DEQUANT=cvt,--trace-ops,--disable-cuda-graph" bench_sides v3ep8-2 "64 1536 4"
  grep -A16 'The last decode step' $L/bench.log >> "$OUT/summary.log"
  log done
fi
# PHASE=5: the session's final tree $SRC: the ceilings; CUPTI kernel timelines (bench/kernel_trace.cpp)
#   of Qwen3's and V2-Lite's graphed decode steps at B = 1 (4096 in) and Qwen3's at B = 64 (256 in);
#   bench-one-batch (8k prefills, B = 1, B = 64) twice; then every single-GPU test program.
if [ $PHASE = 5 ]; then
  TESTS=$(gpu_tests_of $SRC)
  FIRST="test_cuda_fixtures test_cuda_engine_graphs test_cuda_gemv test_cuda_grouped_gemm test_cuda_flash_prefill test_cuda_mla_prefill"
  JOBS=15 build_after ms_cuda_ceilings $TESTS
  cmake --build /tmp/b --target ms_kernel_trace >> $L/build.log 2>&1; log "kernel trace library rc=$?"
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 60 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  wait
  for run in "qwen3 1 4096" "v2lite 1 4096" "qwen3 64 256"; do
    read -r m b i <<< "$run"
    CUDA_INJECTION64_PATH=/tmp/b/libms_kernel_trace.so MS_KERNEL_TRACE=$L/kt-$m-$b.tsv timeout 60 $B bench-one-batch \
      --model-path /tmp/$m --device cuda --batch-size $b --input-len $i --output-len 16 > $L/kt-$m-$b.log 2>&1
    log "kernel trace $m B=$b rc=$? $(grep -E 'Decode\.  median' $L/kt-$m-$b.log) $(wc -l < $L/kt-$m-$b.tsv) lines"
    python3 $SRC/bench/kernel_trace_summary.py $L/kt-$m-$b.tsv --timeline 0 > $L/kts-$m-$b.txt 2>&1
    grep -E '^graph|median replay' $L/kts-$m-$b.txt | head -8 >> "$OUT/summary.log"
  done
  SIDES="main main" bench_sides qwen3 "1 8192 2" "1 4096 16" "64 256 16"
  SIDES="main main" bench_sides v2lite "1 8192 2" "1 4096 16" "64 256 16"
  for t in $FIRST $TESTS; do [ $(left) -gt 40 ] && run_gpu_tests /tmp/b $t; done
  log done
fi
