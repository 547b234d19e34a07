#!/usr/bin/env bash
# Issue 9 on the GPU machine (the device tool), from the repository root, logs under $OUT:
# builds the current tree (.devsrc, a `git archive HEAD`) and the tree before issue 9
# (.devsrc-before) side by side, runs the GPU tests, measures the ceilings, then bench-one-batch
# before and after on the random-weight Qwen3-30B-A3B (12 layers) and DeepSeek-V2-Lite (9 layers)
# shapes.   bench/cuda_issue9_run.sh [stages...]   (default: all)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
for s in .devsrc .devsrc-before; do [ -e "$s/tests/fixtures" ] || ln -s "$ROOT/tests/fixtures" "$s/tests/fixtures"; done
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv >> "$OUT/summary.log" 2>&1
build() {  # src build-dir jobs targets...
  local src=$1 dir=$2 jobs=$3; shift 3
  cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
    -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > "$dir.log" 2>&1 &&
    cmake --build "$dir" -j"$jobs" --target "$@" >> "$dir.log" 2>&1
}
build .devsrc-before /tmp/before 5 moeserve > /dev/null 2>&1 &
BEFORE_PID=$!
if ! build .devsrc /tmp/after 11 moeserve test_cuda_ops test_cuda_attention_moe test_cuda_graphs test_cuda_fixtures ms_cuda_ceilings; then
  tail -30 /tmp/after.log; cp /tmp/after.log "$OUT/"; exit 1
fi
log "after built"
A=/tmp/after
for t in test_cuda_ops test_cuda_attention_moe test_cuda_graphs test_cuda_fixtures; do
  timeout 300 $A/tests/$t > /tmp/$t.log 2>&1; rc=$?
  log "$t rc=$rc $(grep -E '^\[  (PASSED|FAILED)' /tmp/$t.log | tr '\n' ' ')"
  grep -E "FAILED|Failure|error" /tmp/$t.log | head -8
  cat /tmp/$t.log >> "$OUT/tests.log"
done
timeout 120 $A/ms_cuda_ceilings > "$OUT/ceilings.json" 2>&1; log "ceilings $(tr -d '\n' < "$OUT/ceilings.json")"
bench() {  # label binary model B I O [flags]
  local label=$1 bin=$2 model=$3 b=$4 i=$5 o=$6; shift 6
  echo "== $label $model B=$b I=$i O=$o $*" >> "$OUT/bench.log"
  timeout 240 "$bin" bench-one-batch --model-path "$model" --device cuda --batch-size "$b" --input-len "$i" \
    --output-len "$o" "$@" --result-file "$OUT/bench-$label.jsonl" >> "$OUT/bench.log" 2>&1
  log "$label $(basename $model) B=$b I=$i $* rc=$? $(grep -E 'Prefill\.|Decode\.  median' "$OUT/bench.log" | tail -2 | tr '\n' ' ')"
}
wait $BEFORE_PID; log "before built: $(ls /tmp/before/moeserve 2>&1)"
B=/tmp/before/moeserve
for m in qwen3:qwen3-30b-a3b:12 v2lite:deepseek-v2-lite:9; do
  IFS=: read -r name shape layers <<< "$m"
  timeout 200 $A/moeserve make-random-model --shape $shape --layers $layers /tmp/$name > /dev/null 2>&1
  cp /tmp/$name/config.json "$OUT/$name-config.json"; log "made $name"
  bench after $A/moeserve /tmp/$name 1 4096 16
  bench after $A/moeserve /tmp/$name 64 256 16
  bench before $B /tmp/$name 1 4096 8
  bench before $B /tmp/$name 64 256 8
  bench ${EXTRA_LABEL:-after-nograph} $A/moeserve /tmp/$name ${EXTRA_RUN:-1 4096 16 --disable-cuda-graph}
  rm -rf /tmp/$name
done
log done
