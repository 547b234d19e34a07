#!/bin/bash
# Session 36's device calls (bench/BENCHMARKS.md, "Session 36"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# Nsight Compute on the SwiGLU product of the tma shape at one bench point ($1: "<model> <tokens>"), env $2, tag $3:
# the report's details and its SASS lines with their stall samples, in $L (the logs brought back).
ncu_swiglu() {
  env $2 MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=tma128x256x64 MOESERVE_BENCH_GROUPED_POINT="$1" \
    timeout 150 $NCU --kernel-name-base demangled -k 'regex:grouped_gemm_tma_kernel<\(bool\)1>' --launch-skip 3 \
    --launch-count 1 --set full --import-source no -o $L/ncu-$3 \
    /tmp/b/tests/test_cuda_grouped_gemm --gtest_filter=CudaGroupedGemm.GroupedGemmBench > $L/ncu-$3.log 2>&1
  log "ncu $3 rc=$?"
  $NCU -i $L/ncu-$3.ncu-rep --page details --csv > $L/ncu-$3-details.csv 2>&1
  $NCU -i $L/ncu-$3.ncu-rep --page source --print-source sass --csv > $L/ncu-$3-sass.csv 2>&1
}

# PHASE=1 (ran at 23a799f: the session's start, e71bc26, + the VEC=all switch and the bench's point filter): session 35's
#   untimed down-product 16-byte stores end to end (8k prefills, default against MOESERVE_GROUPED_TMA_VEC=0
#   and =all, two rotated rounds), the products' bench from 1024 tokens (tma against wgmma128x128x64; tma with
#   the SwiGLU product's 16-byte stores), Nsight Compute on V2-Lite 8k's SwiGLU product with and without those
#   stores, and the 8k prefills op by op (--trace-ops).
if [ $PHASE = 1 ]; then
  JOBS=15 build_after test_cuda_grouped_gemm test_cuda_moe_prefill test_cuda_fixtures
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  gtest grouped 100 /tmp/b/tests/test_cuda_grouped_gemm
  (export MOESERVE_GROUPED_TMA_VEC=all; gtest grouped-vecall 100 /tmp/b/tests/test_cuda_grouped_gemm)
  F=--gtest_filter=CudaGroupedGemm.GroupedGemmBench
  (export MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=wgmma128x128x64,tma128x256x64
   gtest bench 100 /tmp/b/tests/test_cuda_grouped_gemm $F
   export MOESERVE_GROUPED_TEST_TILES=tma128x256x64 MOESERVE_GROUPED_TMA_VEC=all
   gtest bench-vecall 60 /tmp/b/tests/test_cuda_grouped_gemm $F)
  ncu_swiglu "DeepSeek-V2-Lite 8192" MOESERVE_GROUPED_TMA_VEC=1 pairs
  ncu_swiglu "DeepSeek-V2-Lite 8192" MOESERVE_GROUPED_TMA_VEC=all vec
  wait
  run_gpu_tests /tmp/b test_cuda_moe_prefill test_cuda_fixtures
  for r in 0 1; do
    SIDES="$(SIDES="default pairs:MOESERVE_GROUPED_TMA_VEC=0 vecall:MOESERVE_GROUPED_TMA_VEC=all" rotated $r)" \
      bench_sides qwen3 "1 8192 2"
    SIDES="$(SIDES="default pairs:MOESERVE_GROUPED_TMA_VEC=0 vecall:MOESERVE_GROUPED_TMA_VEC=all" rotated $r)" \
      bench_sides v2lite "1 8192 2"
  done
  SIDES="ops:--trace-ops" bench_sides qwen3 "1 8192 2"; SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A40 "== ops" $L/bench.log | grep -iE "op|ms" | head -80 > $L/ops.txt
  log done
fi

# PHASE=2 (ran at c68e8d1): MLA's rope + cache write at prefill sizes in 16-byte accesses (mla_rope_store_x8_kernel;
#   MOESERVE_MLA_ROPE_X8=0: the warp-a-head kernel): its tests and those of the models, greedy ids with it
#   and without, V2-Lite's 8k prefill with and without (two rotated rounds), the op trace; the ceilings;
#   Nsight Compute on the SwiGLU product (pairs / 16-byte stores; the regex of PHASE 1 matched nothing),
#   the MoE combine + norm, the MLA prefill attention and the new kernel; the tma kernels' SASS.
if [ $PHASE = 2 ]; then
  JOBS=15 build_after ms_cuda_ceilings test_cuda_fused test_cuda_attention_moe test_cuda_fixtures test_cuda_grouped_gemm
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_fused test_cuda_attention_moe test_cuda_fixtures
  o=$(find /tmp/b -name 'grouped_gemm_tma.cu.o' | head -1)
  cuobjdump -sass $o > $L/tma.sass 2>&1; gzip -c $L/tma.sass > $OUT/tma.sass.gz; log "sass $(wc -l < $L/tma.sass) lines"
  ncu_swiglu "DeepSeek-V2-Lite 8192" MOESERVE_GROUPED_TMA_VEC=1 pairs
  ncu_swiglu "DeepSeek-V2-Lite 8192" MOESERVE_GROUPED_TMA_VEC=all vec
  wait
  ids_alike - MOESERVE_MLA_ROPE_X8=0 x8 warp
  for r in 0 1; do
    SIDES="$(SIDES="default warp:MOESERVE_MLA_ROPE_X8=0" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A40 "== ops" $L/bench.log | grep -iE "op|ms" | head -40 > $L/ops.txt
  ncu_prefill combine 'rms_norm_rows_kernel.*MoeAddend'
  ncu_prefill mla 'mla_expanded_ws_kernel'
  ncu_prefill rope 'mla_rope_store_x8_kernel'
  log done
fi

# PHASE=3 (ran at 1499a6d; its two temporary switches are gone since 78faa10): the grouped GEMMs' SwiGLU epilogue in two MUFU instructions (silu_mul; MOESERVE_SILU_EXACT=1: expf and a
#   division, tma shape only) and the MoE combine + norm with its gathered pieces staged in shared memory
#   (MOESERVE_COMBINE_STAGED=0: in registers). Tests of every touched kernel and of the models; the products'
#   bench (tma: fast, fast with 16-byte SwiGLU stores, exact); the combine's bench at 8k tokens both ways;
#   greedy ids fast against exact; the 8k prefills of both models three ways, two rotated rounds; op traces;
#   Nsight Compute on the SwiGLU product again.
if [ $PHASE = 3 ]; then
  T3="test_cuda_grouped_gemm test_cuda_grouped_gemm_fp8 test_cuda_moe_prefill test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe"
  JOBS=15 build_after $T3
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T3
  F=--gtest_filter=CudaGroupedGemm.GroupedGemmBench
  (export MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=tma128x256x64
   gtest bench-fast 60 /tmp/b/tests/test_cuda_grouped_gemm $F
   MOESERVE_GROUPED_TMA_VEC=all gtest bench-fast-vec 60 /tmp/b/tests/test_cuda_grouped_gemm $F
   MOESERVE_SILU_EXACT=1 gtest bench-exact 60 /tmp/b/tests/test_cuda_grouped_gemm $F)
  (export MOESERVE_BENCH_COMBINE_NORM=1; F=--gtest_filter=CudaMoeCombineNorm.CombineNormBench
   gtest combine-staged 60 /tmp/b/tests/test_cuda_moe_combine_norm $F
   MOESERVE_COMBINE_STAGED=0 gtest combine-regs 60 /tmp/b/tests/test_cuda_moe_combine_norm $F)
  ncu_swiglu "DeepSeek-V2-Lite 8192" MOESERVE_GROUPED_TMA_VEC=1 fast
  wait
  ids_alike - MOESERVE_SILU_EXACT=1 fast exact
  S3="default exact:MOESERVE_SILU_EXACT=1 regs:MOESERVE_COMBINE_STAGED=0"
  for r in 0 1; do
    SIDES="$(SIDES="$S3" rotated $r)" bench_sides qwen3 "1 8192 2"
    SIDES="$(SIDES="$S3" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  SIDES="ops:--trace-ops" bench_sides qwen3 "1 8192 2"; SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  log done
fi

# PHASE=4 (ran at 78faa10): the session's final tree (fast silu, 16-byte stores for both tma products, the staged combine, the
#   MLA rope kernel; no temporary switches): the ceilings, the touched test programs and the models', greedy
#   ids, the products' bench (16-byte / pair stores), the 8k prefills three rounds and B = 64 of both models,
#   op traces.
if [ $PHASE = 4 ]; then
  T4="test_cuda_grouped_gemm test_cuda_grouped_gemm_fp8 test_cuda_fused test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs"
  JOBS=15 build_after ms_cuda_ceilings $T4
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $T4
  F=--gtest_filter=CudaGroupedGemm.GroupedGemmBench
  (export MOESERVE_BENCH_GROUPED=1 MOESERVE_GROUPED_TEST_TILES=tma128x256x64
   gtest bench-vec 60 /tmp/b/tests/test_cuda_grouped_gemm $F
   MOESERVE_GROUPED_TMA_VEC=0 gtest bench-pairs 60 /tmp/b/tests/test_cuda_grouped_gemm $F)
  wait
  gen_ids qwen3 - qwen3-final; gen_ids v2lite - v2lite-final
  for r in 0 1 2; do SIDES=final bench_sides qwen3 "1 8192 2"; SIDES=final bench_sides v2lite "1 8192 2"; done
  SIDES=final bench_sides qwen3 "64 256 16"; SIDES=final bench_sides v2lite "64 256 16"
  SIDES="ops:--trace-ops" bench_sides qwen3 "1 8192 2"; SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  log done
fi
