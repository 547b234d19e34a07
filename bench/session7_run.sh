#!/usr/bin/env bash
# Session 7's GPU calls (device tool, nvidia-h200), from the repository root; build and model
# directories under .b4/ (ignored). Sides: before = /tmp/before ($BEFORE_SRC's moeserve), after =
# /tmp/b ($SRC's moeserve, GPU tests and ceilings); "nofp8g" = after with MOESERVE_FP8_GROUPED=0.
# PHASE=2: every single-GPU test of $SRC, the opt-in timings of the new kernels (FP8 grouped
#   product, grouped GEMM tile shapes, MoE combine folded into the norm), then DeepSeek-V3 FP8 EP8
#   layers (L = 2, 5) at B = 1, 64, 256 and prefill 4096, before / after / nofp8g, and Nsight
#   Compute of the after tree's B = 64 and B = 256 steps, while the call's time lasts.
# PHASE=3: the GPU tests named in $TESTS, the FP8 timing, then bench-one-batch before/after on the
#   V3 EP8 layers, Qwen3-30B-A3B (12 layers) and DeepSeek-V2-Lite (9 layers): prefill 8192, decode
#   B = 1 at 4096 and B = 64 at 256; Nsight Compute of a Qwen3 B = 1 step.
# PHASE=4: the final tree, every GPU test, the prefill attention timing, then PHASE=3's
#   bench-one-batch runs (Qwen3's prefill also with MOESERVE_FLASH_WGMMA=0).
#   PHASE=2 SRC=.devsrc-s7 BEFORE_SRC=.devsrc-main timeout 585 bash bench/session7_run.sh; \
#     cp $OUT/summary.log /tmp/logs/; tar czf $OUT/logs.tgz -C /tmp/logs .
# Carry [".deps", "$SRC", "$BEFORE_SRC"]. Everything worth keeping goes into $OUT/logs.tgz by the
# caller's tar (the device tool returns only a few files).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s7} BEFORE_SRC=${BEFORE_SRC:-.devsrc-main} PHASE=${PHASE:-2}
mkdir -p .b4/before && ln -sfn $ROOT/.b4/before /tmp/before
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
# bench-one-batch of /tmp/$1 at each "B input output" after it, for each side in $SIDES.
bench_sides() {
  local name=$1 run b i o side bin env; shift
  for run in "$@"; do
    read -r b i o <<< "$run"
    for side in $SIDES; do
      [ $(left) -gt 25 ] || return
      bin=/tmp/b/moeserve env=""; [ $side = before ] && bin=/tmp/before/moeserve
      [ $side = nofp8g ] && env="MOESERVE_FP8_GROUPED=0"
      [ $side = noflashwg ] && env="MOESERVE_FLASH_WGMMA=0"
      echo "== $side $name B=$b I=$i O=$o" >> $L/bench.log
      env $env timeout $(( $(left) - 10 )) $bin bench-one-batch --model-path /tmp/$name --device cuda --batch-size $b \
        --input-len $i --output-len $o --result-file "$OUT/bench-$side.jsonl" >> $L/bench.log 2>&1
      log "$side $name B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' $L/bench.log | tail -2 | tr '\n' ' ')"
    done
  done
}
opt_in_bench() {  # $1 test program of /tmp/b, $2 env var, $3 gtest filter
  [ -x /tmp/b/tests/$1 ] || { log "no $1"; return; }
  [ $(left) -gt 40 ] || return
  env $2=1 timeout 90 /tmp/b/tests/$1 --gtest_filter="$3" > $L/bench_$1.log 2>&1
  log "$1 $3 rc=$?"; grep '\[bench\]' $L/bench_$1.log >> "$OUT/summary.log"
}
v3_layers() {  # DeepSeek-V3 FP8, the EP8 shard, L = 2 and 5, at the given "B input" pairs
  local layers
  for layers in 2 5; do
    [ $(left) -gt 60 ] || return
    model v3ep8-$layers deepseek-v3 $layers --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32
    bench_sides v3ep8-$layers "$@"
  done
}
ncu_step() {  # $1 label, $2 model, $3 batch, $4 input
  [ $(left) -gt 45 ] || return
  timeout $(( $(left) - 5 )) "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $L/ncu-$1.csv \
    $B bench-one-batch --model-path /tmp/$2 --device cuda --batch-size $3 --input-len $4 --output-len 4 \
    --disable-cuda-graph > /dev/null 2>&1
  log "ncu $1 rc=$?"
}

# Both trees build at once ($SRC: moeserve and $TESTS; $BEFORE_SRC: moeserve); the models are
# made with the before binary while the after tree still builds ($MODELS: that job).
build_with_models() {
  for s in $SRC $BEFORE_SRC; do [ -e $s/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $s/tests/fixtures; done
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
  (configure_tree $SRC /tmp/b && cmake --build /tmp/b -j10 --target moeserve $TESTS) > $L/build.log 2>&1 &
  local after=$!
  (configure_tree $BEFORE_SRC /tmp/before && cmake --build /tmp/before -j6 --target moeserve) > $L/build-before.log 2>&1
  log "before built rc=$?"
  (B=/tmp/before/moeserve
   model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
   for l in 2 5; do model v3ep8-$l deepseek-v3 $l --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; done) &
  MODELS=$!
  wait $after; log "after built rc=$?"; [ -x $B ] || { tail -30 $L/build.log; exit 1; }
}

if [ $PHASE = 2 ]; then
  build_trees $SRC $BEFORE_SRC
  run_gpu_tests /tmp/b $TESTS
  timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
  opt_in_bench test_cuda_grouped_gemm_fp8 MOESERVE_BENCH_FP8_GROUPED '*FP8GroupedBench'
  opt_in_bench test_cuda_grouped_gemm MOESERVE_BENCH_GROUPED '*Bench*'
  opt_in_bench test_cuda_moe_combine_norm MOESERVE_BENCH_COMBINE_NORM '*Bench*'
  SIDES="before after nofp8g" v3_layers "64 512 16" "256 128 16" "1 4096 16"
  ncu_step v3-b64 v3ep8-2 64 512; ncu_step v3-b256 v3ep8-2 256 128
elif [ $PHASE = 3 ]; then
  build_with_models
  run_gpu_tests /tmp/b $TESTS
  opt_in_bench test_cuda_grouped_gemm_fp8 MOESERVE_BENCH_FP8_GROUPED '*FP8GroupedBench'
  wait $MODELS
  SIDES="before after"
  bench_sides v3ep8-2 "64 512 16" "256 128 16" "1 4096 16"; bench_sides v3ep8-5 "64 512 16" "256 128 16" "1 4096 16"
  bench_sides qwen3 "1 8192 2" "1 4096 16" "64 256 16"; bench_sides v2lite "1 8192 2" "1 4096 16" "64 256 16"
  ncu_step qwen3-b1 qwen3 1 4096
elif [ $PHASE = 4 ]; then
  # The final tree: PHASE=3's builds and models with every GPU test, the prefill attention
  # timing, then before/after (and the wgmma prefill attention off: "noflashwg").
  TESTS=$(gpu_tests_of $SRC)
  build_with_models
  run_gpu_tests /tmp/b $TESTS
  opt_in_bench test_cuda_flash_prefill MOESERVE_BENCH_PREFILL '*Bench*'
  wait $MODELS
  SIDES="before after"
  bench_sides v3ep8-2 "64 512 16" "256 128 16" "1 4096 16"; bench_sides v3ep8-5 "64 512 16" "256 128 16" "1 4096 16"
  SIDES="before after noflashwg" bench_sides qwen3 "1 8192 2"
  bench_sides qwen3 "1 4096 16" "64 256 16"
  bench_sides v2lite "1 8192 2" "1 4096 16" "64 256 16"
fi
log done
