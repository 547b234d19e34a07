#!/usr/bin/env bash
# Session 8's GPU calls (device tool, nvidia-h200), from the repository root; build and model
# directories under .b4/ (ignored). One tree ($SRC) is built; "before" sides are the same binary
# with the environment switches that restore the old choices, so before and after share a
# machine, a build and the models.
# PHASE=5: the grouped GEMM's tiles (test, bench) and the 8k prefills with $WS_SIDES' tile choices
#   (run on 55d79e8, whose warp-specialized tiles lost and were reverted in e69b1da).
# PHASE=4: V3 (L = 2) decode at 1..32 queries, 1536 keys, with and without the MLA decode kernel.
# PHASE=3: the final tree against the session's start, V3 also at 1536 keys (see the branch).
# PHASE=2: $SRC = the merged tree, $BEFORE_SRC = the session's start (d2480e8); tests, kernel timings,
#   before/after bench-one-batch (see the branch below).
# PHASE=1: $SRC = main + bench/gpu_pending.patch. Every single-GPU test (the FP8 tests also with
#   MOESERVE_FP8_WGMMA=0), the FP8 product bench, DeepSeek-V3 FP8 EP8 layers (L = 2, 5) with the
#   patch's switches on / off, then where the time goes: nsys (or ncu) kernel sums of Qwen3 and
#   V2-Lite 8k prefills and of a V2-Lite B = 1 decode.
#   PHASE=1 SRC=.devsrc-pend timeout 585 bash bench/session8_run.sh; \
#     cp $OUT/summary.log /tmp/logs/; tar czf $OUT/logs.tgz -C /tmp/logs .
# Carry [".deps", "$SRC"]. Logs go to /tmp/logs, which the caller tars into $OUT/logs.tgz.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-pend} PHASE=${PHASE:-1}
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)

opt_in_bench() {  # $1 test program of /tmp/b, $2 env var(s) "A=1 B=2", $3 gtest filter, $4 log suffix
  [ -x /tmp/b/tests/$1 ] || { log "no $1"; return; }
  [ $(left) -gt 40 ] || return
  env $2 timeout 90 /tmp/b/tests/$1 --gtest_filter="$3" > $L/bench_$1${4:-}.log 2>&1
  log "$1 $3 ${4:-} rc=$?"; grep '\[bench\]' $L/bench_$1${4:-}.log >> "$OUT/summary.log"
}
# Kernel time sums of one bench-one-batch run: $1 label, $2 model, $3 batch, $4 input, $5 output.
profile() {
  [ $(left) -gt 50 ] || return
  local cmd="$B bench-one-batch --model-path /tmp/$2 --device cuda --batch-size $3 --input-len $4 --output-len $5"
  if [ -n "$NSYS" ]; then
    timeout $(( $(left) - 10 )) $NSYS profile -t cuda --cuda-graph-trace=node -o /tmp/nsys-$1 -f true $cmd > $L/nsys-$1.out 2>&1
    timeout 40 $NSYS stats -r cuda_gpu_kern_sum -f csv -o $L/kern-$1 /tmp/nsys-$1.nsys-rep > /dev/null 2>&1
    log "nsys $1 rc=$?"
  else
    timeout $(( $(left) - 5 )) "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv -c ${NCU_COUNT:-600} \
      --log-file $L/ncu-$1.csv $cmd --disable-cuda-graph > /dev/null 2>&1
    log "ncu $1 rc=$?"
  fi
}

# Builds $SRC's moeserve and GPU tests into /tmp/b (and $BEFORE_SRC's moeserve into /tmp/before
# meanwhile, when set), making the models with the first moeserve built.
for s in $SRC ${BEFORE_SRC:-}; do [ -e $s/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $s/tests/fixtures; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
log "nsys=${NSYS:-none} ncu=${NCU:-none}"
TESTS=$(gpu_tests_of $SRC)
if [ $PHASE = 5 ]; then  # the grouped GEMM's warp-specialized tiles: test, bench, 8k prefills
  configure_tree $SRC /tmp/b > $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target moeserve test_cuda_grouped_gemm test_cuda_flash_prefill >> $L/build.log 2>&1
  log "built rc=$?"; [ -x $B ] || { tail -30 $L/build.log; exit 1; }
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 & 
  timeout 90 /tmp/b/tests/test_cuda_grouped_gemm > $L/test_cuda_grouped_gemm.log 2>&1
  log "test_cuda_grouped_gemm rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/test_cuda_grouped_gemm.log | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure' $L/test_cuda_grouped_gemm.log | head -12 >> "$OUT/summary.log"
  timeout 60 /tmp/b/tests/test_cuda_flash_prefill --gtest_filter='CudaFlashPrefill.MatchesCpu:CudaFlashPrefill.VariantFromEnvironment' > $L/test_cuda_flash_prefill.log 2>&1
  log "test_cuda_flash_prefill rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/test_cuda_flash_prefill.log | tr '\n' ' ')"
  wait
  SIDES="after ${WS_SIDES:-}"
  bench_sides qwen3 "1 8192 2"; bench_sides v2lite "1 8192 2"
  opt_in_bench test_cuda_grouped_gemm MOESERVE_BENCH_GROUPED=1 'CudaGroupedGemm.GroupedGemmBench'
  log done; exit 0
fi
if [ $PHASE = 4 ]; then  # moeserve and one model only: where the MLA decode kernel starts to pay
  configure_tree $SRC /tmp/b > $L/build.log 2>&1 && cmake --build /tmp/b -j16 --target moeserve >> $L/build.log 2>&1
  log "moeserve built rc=$?"
  model v3ep8-2 deepseek-v3 2 --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32
  SIDES="after nomladec:MOESERVE_MLA_DECODE_WGMMA=0"
  bench_sides v3ep8-2 "1 1536 16" "4 1536 16" "8 1536 16" "16 1536 16" "32 1536 16"
  log done; exit 0
fi
if [ -n "${BEFORE_SRC:-}" ]; then
  mkdir -p .b4/before; ln -sfn $ROOT/.b4/before /tmp/before
  (configure_tree $BEFORE_SRC /tmp/before && cmake --build /tmp/before -j6 --target moeserve) > $L/build-before.log 2>&1 &
  BB=$!
fi
configure_tree $SRC /tmp/b > $L/build.log 2>&1 && cmake --build /tmp/b -j12 --target moeserve >> $L/build.log 2>&1
log "moeserve built rc=$?"; [ -x $B ] || { tail -30 $L/build.log; exit 1; }
cmake --build /tmp/b -j12 --target $TESTS >> $L/build.log 2>&1 &
TB=$!
model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
for l in 2 5; do model v3ep8-$l deepseek-v3 $l --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; done
wait $TB; log "tests built rc=$?"
[ -z "${BEFORE_SRC:-}" ] || { wait $BB; log "before built rc=$?"; }

if [ $PHASE = 1 ]; then
  run_gpu_tests /tmp/b $TESTS
  MOESERVE_FP8_WGMMA=0 timeout 100 /tmp/b/tests/test_cuda_grouped_gemm_fp8 > $L/fp8_nowgmma.log 2>&1
  log "test_cuda_grouped_gemm_fp8 MOESERVE_FP8_WGMMA=0 rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/fp8_nowgmma.log | tr '\n' ' ')"
  opt_in_bench test_cuda_grouped_gemm_fp8 MOESERVE_BENCH_FP8_GROUPED=1 '*FP8GroupedBench'
  SIDES="after off:MOESERVE_FP8_WGMMA=0,MOESERVE_KEEP_BF16=0"
  for l in 2 5; do bench_sides v3ep8-$l "64 512 16" "256 128 16" "1 4096 16"; done
  profile qwen3-p8k qwen3 1 8192 1
  profile v2lite-p8k v2lite 1 8192 1
  profile v2lite-b1 v2lite 1 4096 8
elif [ $PHASE = 2 ]; then
  # The merged helpers' kernels and the lead's: every GPU test (the prefill attention first, its
  # new variants under a timeout of their own), their timings, then before ($BEFORE_SRC) / after.
  timeout 150 /tmp/b/tests/test_cuda_flash_prefill > $L/test_cuda_flash_prefill.log 2>&1
  log "test_cuda_flash_prefill rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/test_cuda_flash_prefill.log | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure' $L/test_cuda_flash_prefill.log | head -12 >> "$OUT/summary.log"
  run_gpu_tests /tmp/b $TESTS
  opt_in_bench test_cuda_flash_prefill MOESERVE_BENCH_PREFILL=1 '*Bench*'
  opt_in_bench test_cuda_mla_prefill MOESERVE_BENCH_MLA_PREFILL=1 'CudaMlaPrefill.MlaExpandedAttentionBench'
  opt_in_bench test_cuda_attention_moe MOESERVE_BENCH_DECODE_ATTN=1 'CudaOps.DecodeMergeBench'
  opt_in_bench test_cuda_attention_moe MOESERVE_BENCH_ATTENTION=1 'CudaOps.DecodeAttentionBench' _attn
  SIDES="before after"
  bench_sides qwen3 "1 8192 2"
  SIDES="after:MOESERVE_FLASH_WGMMA_VARIANT=n128 after:MOESERVE_FLASH_WGMMA_VARIANT=n128pp" bench_sides qwen3 "1 8192 2"
  bench_sides v2lite "1 8192 2"
  bench_sides qwen3 "1 4096 16" "64 256 16"
  SIDES="before after noside:MOESERVE_SIDE_STREAM=0" bench_sides v2lite "1 4096 16" "64 256 16"
  for l in 2 5; do bench_sides v3ep8-$l "64 512 16" "256 128 16" "64 1536 16" "1 4096 16"; done
elif [ $PHASE = 3 ]; then
  # The final tree: the new MLA decode kernel's tests and timing first, every GPU test, then
  # before / after (and after without the MLA decode kernel: "nomladec").
  timeout 120 /tmp/b/tests/test_cuda_mla_decode_wgmma > $L/test_cuda_mla_decode_wgmma.log 2>&1
  log "test_cuda_mla_decode_wgmma rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $L/test_cuda_mla_decode_wgmma.log | tr '\n' ' ')"
  grep -E '^\[  FAILED|Failure|Expected|Which is|actual' $L/test_cuda_mla_decode_wgmma.log | head -12 >> "$OUT/summary.log"
  opt_in_bench test_cuda_mla_decode_wgmma MOESERVE_BENCH_MLA_DECODE=1 'CudaOps.MlaDecodeWgmmaBench'
  run_gpu_tests /tmp/b $TESTS
  opt_in_bench test_cuda_flash_prefill MOESERVE_BENCH_PREFILL=1 '*Bench*'
  SIDES="before after"
  bench_sides qwen3 "1 8192 2" "1 4096 16" "64 256 16"
  bench_sides v2lite "1 8192 2" "1 4096 16" "64 256 16"
  SIDES="before after nomladec:MOESERVE_MLA_DECODE_WGMMA=0"
  for l in 2 5; do bench_sides v3ep8-$l "64 512 16" "64 1536 16" "256 1536 8" "256 128 16" "1 4096 16"; done
fi
log done
