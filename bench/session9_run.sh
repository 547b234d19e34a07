#!/usr/bin/env bash
# Session 9's GPU calls (device tool, nvidia-h200), from the repository root; build and model
# directories under .b4/ (ignored), so a warm machine reuses them.
# PHASE=1: $SRC's moeserve; where the 8k prefills of Qwen3 and V2-Lite lose time
#   (bench-one-batch --trace-ops) and the grouped GEMM's 128x256 tile against the default, end to end.
#   PHASE=1 SRC=.devsrc-s9 BUDGET=560 timeout 580 bash bench/session9_run.sh; \
#     cp $OUT/summary.log /tmp/logs/; tar czf $OUT/logs.tgz -C /tmp/logs .
# PHASE=2: $SRC against $BEFORE_SRC: the GPU tests of what changed, the rope kernel's timing, and
#   bench-one-batch before / after (8k and 2k prefills, the 2k also on each grouped GEMM tile;
#   decode at B = 1 and 64).
# PHASE=3: $SRC (the helpers' attention variants merged) against $BEFORE_SRC: each prefill
#   attention variant tested and timed alone (a hang costs its own timeout only), then 8k
#   prefills with each variant, and DeepSeek-V3 (EP8 shard, L = 2 / 5) prefill of 4096.
# PHASE=4: the session's final tree $SRC against its start $BEFORE_SRC: every single-GPU test, the
#   rope kernel's timing, where the 8k prefills' time goes (--trace-ops), bench-one-batch before /
#   after (8k prefills, decode at B = 1 and 64) and DeepSeek-V3's EP8 shard (L = 2 / 5).
# PHASE=5: $SRC (norm kernels with one piece a thread) against $BEFORE_SRC (PHASE=4's tree): their
#   tests, the 8k prefills (and their op traces), and DeepSeek-V3's EP8 shard at B = 64 again.
# Carry [".deps", "$SRC"]. Logs go to /tmp/logs, which the caller tars into $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s9} PHASE=${PHASE:-1}
RESULTS=$L

[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
if [ $PHASE = 1 ]; then
  configure_tree $SRC /tmp/b > $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target moeserve >> $L/build.log 2>&1
  log "moeserve built rc=$?"; [ -x $B ] || { tail -30 $L/build.log; exit 1; }
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 & wait
  for m in qwen3 v2lite; do
    SIDES="after trace:--trace-ops tile256:MOESERVE_GROUPED_GEMM_TILE=wgmma128x256x64 after" bench_sides $m "1 8192 2"
    grep -A40 'The timed prefill' $L/bench.log | tail -n +1 > $L/trace-$m.log
  done
  grep -B2 -A30 'The timed prefill' $L/bench.log >> "$OUT/summary.log"
  log done
fi
if [ $PHASE = 2 ]; then
  build_before
  BB=$!
  T2="test_cuda_fused test_cuda_moe_combine_norm test_cuda_grouped_gemm test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_prefill"
  build_after $T2
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T2
  MOESERVE_ROPE_X8=0 timeout 60 /tmp/b/tests/test_cuda_fixtures > $L/fixtures_nox8.log 2>&1
  log "test_cuda_fixtures MOESERVE_ROPE_X8=0 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/fixtures_nox8.log | tr '\n' ' ')"
  for x in 1 0; do
    MOESERVE_ROPE_X8=$x MOESERVE_BENCH_ATTENTION=1 timeout 60 /tmp/b/tests/test_cuda_attention_moe --gtest_filter='CudaOps.DecodeAttentionBench' > $L/attn_bench_$x.log 2>&1
    log "rope x8=$x: $(grep 'rope_store_kv' $L/attn_bench_$x.log | tr '\n' ' ')"
  done
  wait; wait $BB; log "before built rc=$?"
  SIDES="before after"
  bench_sides qwen3 "1 8192 2"; bench_sides v2lite "1 8192 2"
  SIDES="before after t128:MOESERVE_GROUPED_GEMM_TILE=wgmma128x128x64 t256:MOESERVE_GROUPED_GEMM_TILE=wgmma128x256x64"
  bench_sides qwen3 "1 2048 2" "1 4096 2"; bench_sides v2lite "1 2048 2"
  SIDES="before after"
  bench_sides qwen3 "1 4096 16" "64 256 16"; bench_sides v2lite "1 4096 16" "64 256 16"
  log done
fi
if [ $PHASE = 3 ]; then
  build_before
  T3="test_cuda_flash_prefill test_cuda_mla_prefill test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs"
  build_after $T3
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  GQA_OK="" MLA_OK=""
  for v in n128ws n128kv n128kvx n128kvp n128kvxp; do
    MOESERVE_FLASH_WGMMA_VARIANTS=$v timeout 90 /tmp/b/tests/test_cuda_flash_prefill --gtest_filter='CudaFlashPrefill.MatchesCpu' > $L/fp_$v.log 2>&1
    rc=$?; log "flash_prefill MatchesCpu $v rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' $L/fp_$v.log | tr '\n' ' ')"
    grep -E 'Failure|Expected|Which is' $L/fp_$v.log | head -6 >> "$OUT/summary.log"
    [ $rc = 0 ] || continue
    GQA_OK="$GQA_OK $v"
    MOESERVE_FLASH_WGMMA_VARIANTS=$v MOESERVE_BENCH_PREFILL=1 timeout 60 /tmp/b/tests/test_cuda_flash_prefill --gtest_filter='CudaFlashPrefill.PrefillAttentionBench' > $L/fpb_$v.log 2>&1
    grep '\[bench\]' $L/fpb_$v.log >> "$OUT/summary.log"
  done
  for v in wg ws ws64; do
    MOESERVE_MLA_EXPANDED_VARIANTS=$v timeout 150 /tmp/b/tests/test_cuda_mla_prefill --gtest_filter='-*Bench' > $L/mla_$v.log 2>&1
    rc=$?; log "mla_prefill $v rc=$rc $(grep -E '^\[  (PASSED|FAILED) ' $L/mla_$v.log | tr '\n' ' ')"
    grep -E 'Failure|Expected|Which is' $L/mla_$v.log | head -6 >> "$OUT/summary.log"
    [ $rc = 0 ] && MLA_OK="$MLA_OK $v"
  done
  MOESERVE_MLA_EXPANDED_VARIANTS=$(echo $MLA_OK | tr ' ' ,) MOESERVE_BENCH_MLA_PREFILL=1 timeout 90 /tmp/b/tests/test_cuda_mla_prefill \
    --gtest_filter='CudaMlaPrefill.MlaExpandedAttentionBench' > $L/mlab.log 2>&1
  grep '\[bench\]' $L/mlab.log >> "$OUT/summary.log"
  run_gpu_tests /tmp/b test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs
  wait; log "models and before built: $(ls /tmp/before/moeserve)"
  SIDES="before"; for v in $GQA_OK; do SIDES="$SIDES $v:MOESERVE_FLASH_WGMMA_VARIANT=$v"; done
  bench_sides qwen3 "1 8192 2"
  SIDES="before"; for v in $MLA_OK; do SIDES="$SIDES $v:MOESERVE_MLA_EXPANDED_VARIANT=$v"; done
  bench_sides v2lite "1 8192 2"
  for l in 2 5; do model v3ep8-$l deepseek-v3 $l --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; done
  SIDES="before"; for v in $MLA_OK; do SIDES="$SIDES $v:MOESERVE_MLA_EXPANDED_VARIANT=$v"; done
  for l in 2 5; do bench_sides v3ep8-$l "1 4096 2"; done
  log done
fi
if [ $PHASE = 4 ]; then
  build_before 4
  TESTS=$(gpu_tests_of $SRC)
  configure_tree $SRC /tmp/b > $L/build.log 2>&1 && cmake --build /tmp/b -j12 --target moeserve >> $L/build.log 2>&1
  log "moeserve built rc=$?"; [ -x $B ] || { tail -30 $L/build.log; exit 1; }
  cmake --build /tmp/b -j12 --target ms_cuda_ceilings $TESTS >> $L/build.log 2>&1 &
  TB=$!
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  wait $TB; log "tests built rc=$?"
  timeout 60 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $TESTS
  MOESERVE_BENCH_ATTENTION=1 timeout 60 /tmp/b/tests/test_cuda_attention_moe --gtest_filter='CudaOps.DecodeAttentionBench' > $L/attn_bench.log 2>&1
  log "$(grep 'rope_store_kv' $L/attn_bench.log | tr '\n' ' ')"
  wait; log "before: $(ls /tmp/before/moeserve)"
  SIDES="before after trace:--trace-ops"
  bench_sides qwen3 "1 8192 2"; bench_sides v2lite "1 8192 2"
  grep -B1 -A26 'The timed prefill' $L/bench.log >> "$OUT/summary.log"
  SIDES="before after"
  bench_sides qwen3 "1 4096 16" "64 256 16"; bench_sides v2lite "1 4096 16" "64 256 16"
  for l in 2 5; do model v3ep8-$l deepseek-v3 $l --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; done
  for l in 2 5; do bench_sides v3ep8-$l "1 4096 2" "64 1536 16"; done
  SIDES="trace:--trace-ops,--disable-cuda-graph" bench_sides v3ep8-2 "64 1536 4"
  SIDES="trace:--trace-ops,--disable-cuda-graph" bench_sides qwen3 "1 4096 4"
  grep -A26 'The last decode step' $L/bench.log >> "$OUT/summary.log"
  log done
fi
if [ $PHASE = 5 ]; then
  build_before
  T5="test_cuda_moe_combine_norm test_cuda_fused test_cuda_fixtures test_cuda_engine_graphs"
  build_after $T5
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T5
  wait; log "before: $(ls /tmp/before/moeserve)"
  SIDES="before after trace:--trace-ops before after"
  bench_sides qwen3 "1 8192 2"; bench_sides v2lite "1 8192 2"
  grep -B1 -A14 'The timed prefill' $L/bench.log >> "$OUT/summary.log"
  for l in 2 5; do model v3ep8-$l deepseek-v3 $l --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; done
  SIDES="before after before after"
  for l in 2 5; do bench_sides v3ep8-$l "64 1536 16"; done
  log done
fi
