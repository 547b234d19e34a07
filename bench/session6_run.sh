#!/usr/bin/env bash
# Session 6's GPU calls (device tool, nvidia-h200), from the repository root. Build and model
# directories live under .b4/ (ignored) and are reused while the machine stays warm.
# PHASE=1: $SRC (main + bench/gpu_pending.patch: grouped GEMM for MoE prefill, fused router + top-k)
#   and $BEFORE_SRC (main) build side by side; every single-GPU test of $SRC; compute-sanitizer on
#   the two new kernels' tests; their opt-in timings; bench-one-batch before / after / after with
#   MOESERVE_GROUPED_GEMM=0 (Qwen3-30B-A3B 12 layers, DeepSeek-V2-Lite 9 layers: decode B = 1 at 4k
#   and B = 64 at 256, prefill of 8k).
# PHASE=2: the session's helpers' kernels ($SRC) against $BEFORE_SRC: every GPU test, MTP against
#   plain, the opt-in timings (gemv launch shapes, routing, decode attention with its merge fused
#   and split), bench-one-batch before/after, compute-sanitizer on $NEW_TESTS.
# PHASE=4: the final tree against faa5070: every GPU test, the MLA prefill timing, bench-one-batch
#   before/after, then DeepSeek-V3 EP8 layers while the call's time lasts.
# PHASE=3: DeepSeek-V3 FP8, the EP8 shard (32 experts), 2 and 5 layers, bench-one-batch of $SRC's
#   build only (per MoE layer = step difference / 3), at B = 1, 64, 256 and prefill 4k; Nsight
#   Compute per-kernel times of the 2-layer model's B = 1 and B = 64 steps.
#   PHASE=1 SRC=.devsrc-s6 BEFORE_SRC=.devsrc-s6b bash bench/session6_run.sh
# Carry [".deps", "$SRC", "$BEFORE_SRC"].
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s6} BEFORE_SRC=${BEFORE_SRC:-.devsrc-s6b} PHASE=${PHASE:-1} NEW_TESTS=${NEW_TESTS:-} L=/tmp/logs-$(date +%s)
mkdir -p $L .b4/models .b4/after .b4/before
ln -sfn $ROOT/.b4/after /tmp/b && ln -sfn $ROOT/.b4/before /tmp/before
B=/tmp/b/moeserve
model() {  # the random model $1 (shape $2, $3 layers) in .b4/models, linked as /tmp/$1
  [ -e .b4/models/$1/config.json ] || timeout 150 $B make-random-model --shape $2 --layers $3 .b4/models/$1 > /dev/null 2>&1
  ln -sfn $ROOT/.b4/models/$1 /tmp/$1
}
# bench-one-batch of /tmp/$1 at each "B input output" after it, for each side in $SIDES
# (before: /tmp/before; after: /tmp/b; the others: /tmp/b with the switch named in the case below).
bench_sides() {
  local name=$1 run b i o side bin env; shift
  for run in "$@"; do
    read -r b i o <<< "$run"
    for side in $SIDES; do
      bin=/tmp/b/moeserve env=""; [ $side = before ] && bin=/tmp/before/moeserve
      # noprefetch, splitmerge, rule1, l2ahead, rule1l2: switches of code measured in the second and
      # final calls and then removed (BENCHMARKS, session 6); on later trees they change nothing.
      case $side in
        nogrouped) env="MOESERVE_GROUPED_GEMM=0" ;;
        noprefetch) env="MOESERVE_L2_PREFETCH=0" ;;
        splitmerge) env="MOESERVE_DECODE_MERGE=split" ;;
        rule1) env="MOESERVE_GEMV_TUNE=0,0,0,1,0" ;;
        l2ahead) env="MOESERVE_GEMV_TUNE=0,0,0,0,1" ;;
        rule1l2) env="MOESERVE_GEMV_TUNE=0,0,0,1,1" ;;
      esac
      echo "== $side $name B=$b I=$i O=$o" >> $L/bench.log
      env $env timeout 120 $bin bench-one-batch --model-path /tmp/$name --device cuda --batch-size $b --input-len $i \
        --output-len $o --result-file "$OUT/bench-$side.jsonl" >> $L/bench.log 2>&1
      log "$side $name B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' $L/bench.log | tail -2 | tr '\n' ' ')"
    done
  done
}
opt_in_bench() {  # $1 build, $2 test program, $3 env var, $4 gtest filter
  [ -x $1/tests/$2 ] || { log "no $2 in $1"; return; }
  env $3=1 timeout 90 $1/tests/$2 --gtest_filter="$4" > $L/bench_$2_$(basename $1).log 2>&1
  log "$2 $4 ($1) rc=$?"; grep '\[bench\]' $L/bench_$2_$(basename $1).log >> "$OUT/summary.log"
}
sanitize() {  # $1 test program of /tmp/b, $2 filter
  local SAN tool; SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in racecheck synccheck; do
    timeout 150 $SAN --tool $tool --print-limit 5 /tmp/b/tests/$1 --gtest_filter="$2" > $L/$tool-$1.log 2>&1
    log "compute-sanitizer $tool $1 rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/$tool-$1.log | head -3 | tr '\n' ' ')"
    grep -B2 -A8 -m2 'Error\|error' $L/$tool-$1.log | head -30 >> "$OUT/summary.log"
  done
}

if [ $PHASE = 1 ]; then
  build_trees $SRC $BEFORE_SRC
  run_gpu_tests /tmp/b $TESTS
  timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
  opt_in_bench /tmp/b test_cuda_grouped_gemm MOESERVE_BENCH_GROUPED '*Bench*'
  opt_in_bench /tmp/b test_cuda_moe_route MOESERVE_BENCH_ROUTE '*Bench*'
  opt_in_bench /tmp/b test_cuda_moe_prefill MOESERVE_BENCH_MOE '*Bench*'
  MOESERVE_GROUPED_GEMM=0 opt_in_bench /tmp/b test_cuda_moe_prefill MOESERVE_BENCH_MOE '*Bench*'
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  SIDES="before after" ; for name in qwen3 v2lite; do bench_sides $name "1 4096 16" "64 256 16"; done
  SIDES="before after nogrouped"; for name in qwen3 v2lite; do bench_sides $name "1 8192 2"; done
  sanitize test_cuda_grouped_gemm '*MatchHost*:*Prefill*'
  sanitize test_cuda_moe_route '*Fused*'
elif [ $PHASE = 2 ]; then
  # The helpers' kernels ($SRC) against the first call's tree ($BEFORE_SRC = faa5070).
  build_trees $SRC $BEFORE_SRC
  run_gpu_tests /tmp/b $TESTS
  spec_vs_plain $B
  timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
  opt_in_bench /tmp/b test_cuda_gemv MOESERVE_BENCH_GEMV '*Bench*'
  opt_in_bench /tmp/b test_cuda_moe_route MOESERVE_BENCH_ROUTE '*Bench*'
  opt_in_bench /tmp/b test_cuda_attention_moe MOESERVE_BENCH_ATTENTION '*Bench*'
  MOESERVE_DECODE_MERGE=split opt_in_bench /tmp/b test_cuda_attention_moe MOESERVE_BENCH_ATTENTION '*Bench*'
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  for name in qwen3 v2lite; do
    SIDES="before after noprefetch splitmerge l2ahead"; bench_sides $name "1 4096 16"
    SIDES="before after rule1 l2ahead rule1l2"; bench_sides $name "64 256 16"
    SIDES="before after"; bench_sides $name "1 4096 2" "1 8192 2"
  done
  for t in $NEW_TESTS; do sanitize ${t%%=*} "${t#*=}"; done  # each "program=gtest filter"
elif [ $PHASE = 4 ]; then
  # The session's final tree ($SRC) against the first call's ($BEFORE_SRC = faa5070), then as much
  # of PHASE=3 as the call's time allows (each step only when enough of 560 s is left).
  left() { echo $(( 560 - ($(date +%s) - T0) )); }
  build_trees $SRC $BEFORE_SRC
  run_gpu_tests /tmp/b $TESTS
  opt_in_bench /tmp/b test_cuda_mla_prefill MOESERVE_BENCH_MLA_PREFILL '*Bench*'
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  SIDES="before after noprefetch"; bench_sides qwen3 "1 4096 16"
  SIDES="before after"; bench_sides qwen3 "64 256 16" "1 8192 2"; bench_sides v2lite "1 4096 16" "64 256 16" "1 8192 2"
  for layers in 2 5; do
    M=.b4/models/v3ep8-$layers
    [ $(left) -gt 120 ] || break
    [ -e $M/config.json ] || timeout $(( $(left) - 60 )) $B make-random-model --shape deepseek-v3 --fp8 --layers $layers \
      --set num_nextn_predict_layers=0 --set n_routed_experts=32 $M > $L/make-v3-$layers.log 2>&1
    log "v3 ep8 model layers=$layers rc=$? $(du -sh $M | cut -f1)"
    for bi in "1 4096" "64 512" "256 128"; do
      read -r b i <<< "$bi"
      [ $(left) -gt 30 ] || break
      timeout $(( $(left) - 10 )) $B bench-one-batch --model-path $M --device cuda --batch-size $b --input-len $i \
        --output-len 16 --result-file "$OUT/v3-$layers.jsonl" > $L/v3-$layers-$b.log 2>&1
      log "v3 ep8 L=$layers B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' $L/v3-$layers-$b.log | tr '\n' ' ')"
    done
  done
elif [ $PHASE = 3 ]; then
  [ -x $B ] || build_trees $SRC
  for layers in 2 5; do
    M=.b4/models/v3ep8-$layers
    [ -e $M/config.json ] || timeout 200 $B make-random-model --shape deepseek-v3 --fp8 --layers $layers \
      --set num_nextn_predict_layers=0 --set n_routed_experts=32 $M > $L/make-v3-$layers.log 2>&1
    log "v3 ep8 model layers=$layers rc=$? $(du -sh $M | cut -f1)"
    for bi in "1 4096" "64 512" "256 128"; do
      read -r b i <<< "$bi"
      timeout 150 $B bench-one-batch --model-path $M --device cuda --batch-size $b --input-len $i \
        --output-len 16 --result-file "$OUT/v3-$layers.jsonl" > $L/v3-$layers-$b.log 2>&1
      log "v3 ep8 L=$layers B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' $L/v3-$layers-$b.log | tr '\n' ' ')"
    done
  done
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for bi in "1 4096" "64 512"; do
    read -r b i <<< "$bi"
    timeout 120 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu-v3ep8-b$b.csv \
      $B bench-one-batch --model-path .b4/models/v3ep8-2 --device cuda --batch-size $b --input-len $i --output-len 4 \
      --disable-cuda-graph > /dev/null 2>&1; log "ncu v3 ep8 B=$b rc=$?"
  done
fi
tar czf "$OUT/logs-$PHASE.tgz" -C $L . 2>/dev/null
log done
