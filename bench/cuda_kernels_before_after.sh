#!/usr/bin/env bash
# Issue 9, kernel side, on the GPU machine (the device tool), from the repository root, logs under
# $OUT: the GPU tests of the new kernels, then bench-one-batch with the binary of the commit before
# them (before/moeserve) and after them (after/moeserve, after/tests/*, after/ms_cuda_ceilings for the
# copy bandwidth and bf16 matrix rate, logged as JSON in summary.log), both built elsewhere from
# snapshots and packed with the shared libraries they need (lib/) into BUNDLE, on random models of
# the Qwen3-30B-A3B (12 layers) and DeepSeek-V2-Lite (9 layers) shapes: decode at B = 1 (4k
# context) and 64, prefill of 8k tokens, CUDA graphs on; then Nsight Compute on the after binary's
# own kernels (ncu-after-qwen3.csv: B = 1, then B = 64, op by op).
#   bench/cuda_kernels_before_after.sh BUNDLE SRC_ROOT
# SRC_ROOT: the source directory the after tests were built from (they read SRC_ROOT/tests/fixtures).
set -uo pipefail
BUNDLE=${1:?} SRC_ROOT=${2:?}
source "$(dirname "$0")/device_env.sh"
rm -rf /tmp/kb && mkdir -p /tmp/kb && tar -xJf "$BUNDLE" -C /tmp/kb || exit 1
BEFORE=/tmp/kb/before AFTER=/tmp/kb/after
export LD_LIBRARY_PATH=/tmp/kb/lib:$LD_LIBRARY_PATH
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
$AFTER/moeserve --help > /dev/null 2>&1 && $BEFORE/moeserve --help > /dev/null 2>&1 ||
  { log "binaries do not start: $($AFTER/moeserve --help 2>&1 | head -2)"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
mkdir -p "$SRC_ROOT/tests" && ln -sfn "$ROOT/tests/fixtures" "$SRC_ROOT/tests/fixtures"
# SKIP_TESTS=1: the bundle's tests are not run (a later tree's own build runs them); SKIP_NCU=1: no profile.
[ -n "${SKIP_TESTS:-}" ] || for t in test_cuda_ops test_cuda_attention_moe test_cuda_graphs test_cuda_fixtures; do
  timeout 150 "$AFTER/tests/$t" >> "$OUT/tests.log" 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/tests.log" | tail -1)"
done
grep -E "^\[  FAILED|Failure|error:|Expected" "$OUT/tests.log" | head -20
timeout 60 "$AFTER/ms_cuda_ceilings" > /tmp/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < /tmp/ceilings.json)"
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
  [ $name = qwen3 ] && [ -z "${SKIP_NCU:-}" ] && for run in "1 4096" "64 256"; do
    read -r b i <<< "$run"
    timeout 60 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv -k regex:"gemv|flash|attention|combine" \
      --log-file /tmp/ncu-b$b.csv "$AFTER/moeserve" bench-one-batch --model-path /tmp/$name --device cuda \
      --batch-size $b --input-len $i --output-len 4 --disable-cuda-graph > /dev/null 2>&1
    log "ncu after $name B=$b rc=$?"
    cat /tmp/ncu-b$b.csv >> "$OUT/ncu-after-$name.csv"  # B = 1 first, then B = 64
  done
  rm -rf /tmp/$name
done
log done
