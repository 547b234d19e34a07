#!/bin/bash
# Session 37's device calls (bench/BENCHMARKS.md, "Session 37"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1 (ran at cfd5808; its switch MOESERVE_GATED_GROUPED is gone since 9c8916b): the dense gated MLP of a prefill as one grouped GEMM in SwiGLU form (try_gated_grouped;
#   MOESERVE_GATED_GROUPED=0: cuBLASLt products and the SiLU pass): its test and the models', V2-Lite's 8k
#   prefill both ways (three rotated rounds), the op trace; the MLA attention's bench; Nsight Compute on the
#   MLA prefill attention with its SASS stall samples.
if [ $PHASE = 1 ]; then
  T1="test_cuda_ops test_cuda_fixtures test_cuda_moe_prefill"
  JOBS=15 build_after test_cuda_mla_prefill $T1
  model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T1
  mla_bench ws,ws64 mla-bench
  wait
  ncu_prefill mla 'mla_expanded_ws_kernel'
  for r in 0 1 2; do
    SIDES="$(SIDES="grouped off:MOESERVE_GATED_GROUPED=0" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  log done
fi

# PHASE=2 (ran at eba68ac; the variants wsjoint / n128wsjoint are gone since 6d4cc2b): each tile's finish (the P V wait, rescale, P packing) moved to the next iteration's top in both
#   warp-specialized prefill attentions, so the softmax's exponentials run beside P V ("ws" / "n128ws";
#   "wsjoint" / "n128wsjoint": as before). Tests of both kernels on every variant, their benches, Nsight
#   Compute SASS of the new MLA kernel, both models' 8k prefills both ways (two rotated rounds), op traces.
if [ $PHASE = 2 ]; then
  cp /usr/local/cuda/bin/nvdisasm /usr/local/cuda/bin/cuobjdump $OUT/ 2>/dev/null
  T2="test_cuda_mla_prefill test_cuda_flash_prefill test_cuda_fixtures"
  JOBS=15 build_after $T2
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T2
  mla_bench ws,wsjoint mla-bench
  MOESERVE_BENCH_PREFILL=1 MOESERVE_FLASH_WGMMA_VARIANTS=n128ws,n128wsjoint gtest gqa-bench 120 \
    /tmp/b/tests/test_cuda_flash_prefill --gtest_filter=CudaFlashPrefill.PrefillAttentionBench
  grep "\[bench\]" $L/gqa-bench.log >> $OUT/summary.log
  wait
  ncu_prefill mla 'mla_expanded_ws_kernel'
  S2="top joint:MOESERVE_MLA_EXPANDED_VARIANT=wsjoint,MOESERVE_FLASH_WGMMA_VARIANT=n128wsjoint"
  for r in 0 1; do
    SIDES="$(SIDES="$S2" rotated $r)" bench_sides qwen3 "1 8192 2"
    SIDES="$(SIDES="$S2" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  SIDES="ops:--trace-ops" bench_sides qwen3 "1 8192 2"; SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  log done
fi

# PHASE=3 (ran at cb282e3; same variants): the softmax in fewer instructions (max of the raw scores, the scale folded into each
#   exponential's FFMA, four chains a row for the max and the sum), wgmma descriptors as offsets of
#   the stage's, o's rescale skipped by a warp whose rows kept their max. Tests of every attention
#   kernel (flash_softmax.cuh is shared by prefill and decode) and the models', both benches (ws /
#   wsjoint again), Nsight SASS of the MLA kernel, 8k prefills and B = 1 of both models (two rounds),
#   op traces, greedy ids.
if [ $PHASE = 3 ]; then
  T3="test_cuda_mla_prefill test_cuda_flash_prefill test_cuda_attention_moe test_cuda_mla_decode_wgmma test_cuda_fixtures test_cuda_engine_graphs"
  JOBS=15 build_after $T3
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T3
  mla_bench ws,wsjoint mla-bench
  MOESERVE_BENCH_PREFILL=1 MOESERVE_FLASH_WGMMA_VARIANTS=n128ws,n128wsjoint gtest gqa-bench 120 \
    /tmp/b/tests/test_cuda_flash_prefill --gtest_filter=CudaFlashPrefill.PrefillAttentionBench
  grep "variant=" $L/gqa-bench.log >> $OUT/summary.log
  wait
  ncu_prefill mla 'mla_expanded_ws_kernel'
  gen_ids qwen3 - qwen3-s37; gen_ids v2lite - v2lite-s37
  for r in 0 1; do
    SIDES=final bench_sides qwen3 "1 8192 2" "1 4096 16"; SIDES=final bench_sides v2lite "1 8192 2" "1 4096 16"
  done
  SIDES="ops:--trace-ops" bench_sides qwen3 "1 8192 2"; SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  log done
fi

# PHASE=4 (ran at acf1d35; wspp and wsjoint are gone since 6d4cc2b): the MLA consumers taking turns at their products (named barriers, "wspp") against the
#   default ("ws") and the old order ("wsjoint"): the test on every variant, the bench, V2-Lite's 8k
#   prefill ws / wspp (three rotated rounds), op traces of both; the ceilings.
if [ $PHASE = 4 ]; then
  JOBS=15 build_after ms_cuda_ceilings test_cuda_mla_prefill
  model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_mla_prefill
  mla_bench ws,wsjoint,wspp mla-bench
  wait
  for r in 0 1 2; do
    SIDES="$(SIDES="ws pp:MOESERVE_MLA_EXPANDED_VARIANT=wspp" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  SIDES="ops:--trace-ops opspp:--trace-ops,MOESERVE_MLA_EXPANDED_VARIANT=wspp" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  log done
fi

# PHASE=5 (ran at d609abe): the session's final tree (finish at the iteration's top in both prefill attentions, the
#   leaner softmax; the A/B variants gone): the ceilings, the attention tests and the models', greedy
#   ids, the 8k prefills (V2-Lite three rounds, Qwen3 two), B = 1 (two) and B = 64 of both models; Nsight
#   Compute on Qwen3's GQA prefill attention (for the next session: it gained nothing from this session's changes).
if [ $PHASE = 5 ]; then
  T5="test_cuda_mla_prefill test_cuda_flash_prefill test_cuda_fixtures test_cuda_engine_graphs"
  JOBS=15 build_after ms_cuda_ceilings $T5
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $T5
  wait
  gen_ids qwen3 - qwen3-final; gen_ids v2lite - v2lite-final
  for r in 0 1; do
    SIDES=final bench_sides v2lite "1 8192 2" "1 4096 16"; SIDES=final bench_sides qwen3 "1 8192 2" "1 4096 16"
  done
  SIDES=final bench_sides v2lite "1 8192 2" "64 256 16"; SIDES=final bench_sides qwen3 "64 256 16"
  NCU_MODEL=qwen3 ncu_prefill gqa 'flash_prefill_wgmma_ws_kernel'
  log done
fi
