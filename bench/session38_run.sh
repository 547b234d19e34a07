#!/bin/bash
# Session 38's device calls (bench/BENCHMARKS.md, "Session 38"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=1 (ran at 194efdf; "wstma" is the only "ws" since 979a746): session 37's pending patch, the MLA prefill kernel's producer as one thread issuing tensor copies
#   ("wstma") against the default ("ws"): the ceilings, the tests of the MLA prefill (every variant against the CPU
#   op) and of the grouped GEMM (its tensor-map encoder moved), the bench, V2-Lite's 8k prefill both ways (three
#   rotated rounds), op traces of both, Nsight Compute on the new kernel.
if [ $PHASE = 1 ]; then
  T1="test_cuda_mla_prefill test_cuda_grouped_gemm test_cuda_fixtures"
  JOBS=15 build_after ms_cuda_ceilings $T1
  model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $T1
  mla_bench ws,wstma mla-bench
  wait
  for r in 0 1 2; do
    SIDES="$(SIDES="ws tma:MOESERVE_MLA_EXPANDED_VARIANT=wstma" rotated $r)" bench_sides v2lite "1 8192 2"
  done
  SIDES="ops:--trace-ops opstma:--trace-ops,MOESERVE_MLA_EXPANDED_VARIANT=wstma" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  NCU_ENV=MOESERVE_MLA_EXPANDED_VARIANT=wstma ncu_prefill mlatma 'mla_expanded_ws_kernel'
  log done
fi

# PHASE=2 (ran at da3c5dd; "n128wstma" is "n128ws" since efcf3d4, the all-gather kernel "n128wscp"): the MLA kernels with tensor copies only (ws, ws64; the cp.async producer deleted); the GQA prefill
#   kernel's whole tiles of keys on consecutive slots by tensor copies ("n128wstma", the rest gathered as
#   before) against "n128ws": the tests of both attentions (every variant against the CPU op, the two GQA
#   variants bit for bit, keys on shuffled, consecutive and run slots), both benches, Qwen3's 8k prefill both
#   ways (three rotated rounds), V2-Lite's twice, op traces; Nsight Compute on the new GQA kernel.
if [ $PHASE = 2 ]; then
  T2="test_cuda_flash_prefill test_cuda_mla_prefill test_cuda_fixtures test_cuda_engine_graphs"
  JOBS=15 build_after ms_cuda_ceilings $T2
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $T2
  MOESERVE_BENCH_PREFILL=1 MOESERVE_FLASH_WGMMA_VARIANTS=n128ws,n128wstma gtest gqa-bench 160 \
    /tmp/b/tests/test_cuda_flash_prefill --gtest_filter=CudaFlashPrefill.PrefillAttentionBench
  grep "variant=" $L/gqa-bench.log >> $OUT/summary.log
  mla_bench ws,ws64 mla-bench
  wait
  for r in 0 1 2; do
    SIDES="$(SIDES="ws tma:MOESERVE_FLASH_WGMMA_VARIANT=n128wstma" rotated $r)" bench_sides qwen3 "1 8192 2"
  done
  SIDES="final final" bench_sides v2lite "1 8192 2"
  SIDES="ops:--trace-ops opstma:--trace-ops,MOESERVE_FLASH_WGMMA_VARIANT=n128wstma" bench_sides qwen3 "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  NCU_MODEL=qwen3 NCU_ENV=MOESERVE_FLASH_WGMMA_VARIANT=n128wstma ncu_prefill gqatma 'flash_prefill_wgmma_ws_kernel'
  log done
fi

# PHASE=3: the session's tree: the GQA kernel with tensor copies the default ("n128ws"; "n128wscp" gathers every
#   tile), its next tile's run loaded a tile ahead. Every GPU test program, the ceilings, the GQA bench both ways
#   (shuffled and consecutive slots), the MLA bench, greedy ids, the 8k prefills (three rounds each), B = 1 (two)
#   and B = 64 of both models, op traces of the prefills; the remaining GPU test programs last.
if [ $PHASE = 3 ]; then
  cp /usr/local/cuda/bin/nvdisasm /usr/local/cuda/bin/cuobjdump $OUT/ 2>/dev/null
  JOBS=15 build_after ms_cuda_ceilings $(gpu_tests_of $SRC)
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_flash_prefill test_cuda_mla_prefill test_cuda_fixtures test_cuda_engine_graphs
  wait
  MOESERVE_BENCH_PREFILL=1 MOESERVE_FLASH_WGMMA_VARIANTS=n128ws,n128wscp gtest gqa-bench 160 \
    /tmp/b/tests/test_cuda_flash_prefill --gtest_filter=CudaFlashPrefill.PrefillAttentionBench
  grep "variant=" $L/gqa-bench.log >> $OUT/summary.log
  mla_bench ws mla-bench
  gen_ids qwen3 - qwen3-final; gen_ids v2lite - v2lite-final
  for r in 0 1 2; do SIDES=final bench_sides qwen3 "1 8192 2"; SIDES=final bench_sides v2lite "1 8192 2"; done
  for r in 0 1; do SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"; done
  SIDES=final bench_sides qwen3 "64 256 16"; SIDES=final bench_sides v2lite "64 256 16"
  SIDES="ops:--trace-ops" bench_sides qwen3 "1 8192 2"; SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  grep -A20 "== ops" $L/bench.log > $L/ops.txt
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  log done
fi

# PHASE=4: DeepSeek-V3's EP8 shard (FP8 blocks, 32 experts, make-random-model --set n_routed_experts=32) at L = 2
#   and 5 layers: the prefill of 4096 tokens (the 128-head MLA prefill now by tensor copies) and the decode at
#   B = 64 and 128 at 1536 keys and B = 256 at 128 keys, for the per-layer figures of the 61-layer projection.
if [ $PHASE = 4 ]; then
  JOBS=15 build_after
  for n in 2 5; do
    model v3-$n deepseek-v3 $n --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32
    SIDES=v3 bench_sides v3-$n "1 4096 4" "64 1536 16" "128 1536 16" "256 128 16"
    rm -rf .b4/models/v3-$n
  done
  log done
fi
