#!/usr/bin/env bash
# Issue 9, kernel side, on the GPU machine (the device tool), from the repository root, logs under
# $OUT: the GPU tests of the new kernels, then bench-one-batch with the binary of the commit before
# them (BEFORE/moeserve) and after them (AFTER/moeserve, AFTER/tests/*), both built elsewhere from
# `git archive` snapshots, on random models of the Qwen3-30B-A3B (12 layers) and DeepSeek-V2-Lite
# (9 layers) shapes: decode at B = 1 (4k context) and 64, prefill of 8k tokens, CUDA graphs on;
# then Nsight Compute on the after binary's own kernels (ncu-after-qwen3-b<B>.csv, op by op).
#   bench/cuda_kernels_before_after.sh BEFORE AFTER SRC_ROOT
# SRC_ROOT: the source directory AFTER was built from (its tests look for SRC_ROOT/tests/fixtures).
set -uo pipefail
BEFORE=${1:?} AFTER=${2:?} SRC_ROOT=${3:?}
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
mkdir -p "$SRC_ROOT/tests" && ln -sfn "$ROOT/tests/fixtures" "$SRC_ROOT/tests/fixtures"
for t in test_cuda_ops test_cuda_attention_moe test_cuda_graphs test_cuda_fixtures; do
  timeout 150 "$AFTER/tests/$t" >> "$OUT/tests.log" 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tail -1)"
done
grep -E "^\[  FAILED|Failure|error:|Expected" "$OUT/tests.log" | head -20
bench() {  # label binary model B I O
  local label=$1 bin=$2 model=$3 b=$4 i=$5 o=$6
  echo "== $label $model B=$b I=$i O=$o" >> "$OUT/bench.log"
  timeout 90 "$bin" bench-one-batch --model-path "$model" --device cuda --batch-size "$b" --input-len "$i" \
    --output-len "$o" --result-file "$OUT/bench-$label.jsonl" >> "$OUT/bench.log" 2>&1
  log "$label $(basename "$model") B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' "$OUT/bench.log" | tail -2 | tr '\n' ' ')"
}
for m in qwen3:qwen3-30b-a3b:12 v2lite:deepseek-v2-lite:9; do
  IFS=: read -r name shape layers <<< "$m"
  timeout 120 "$AFTER/moeserve" make-random-model --shape $shape --layers $layers /tmp/$name > /dev/null 2>&1
  cp /tmp/$name/config.json "$OUT/$name-config.json"; log "made $name"
  for side in after before; do
    bin=$AFTER/moeserve; [ $side = before ] && bin=$BEFORE/moeserve
    bench $side $bin /tmp/$name 1 4096 16
    bench $side $bin /tmp/$name 64 256 16
    bench $side $bin /tmp/$name 1 8192 2
  done
  [ $name = qwen3 ] && for run in "1 4096" "64 256"; do
    read -r b i <<< "$run"
    timeout 60 ncu --clock-control none --metrics gpu__time_duration.sum --csv -k regex:"gemv|flash|attention|combine" \
      --log-file "$OUT/ncu-after-$name-b$b.csv" "$AFTER/moeserve" bench-one-batch --model-path /tmp/$name --device cuda \
      --batch-size $b --input-len $i --output-len 4 --disable-cuda-graph > /dev/null 2>&1
    log "ncu after $name B=$b rc=$?"
  done
  rm -rf /tmp/$name
done
log done
