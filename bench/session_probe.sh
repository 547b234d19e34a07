#!/usr/bin/env bash
# One GPU call (device tool, nvidia-h200), from the repository root; logs under $OUT: builds a
# `git archive` snapshot (SRC), measures the ceilings, runs every single-GPU test, then
# bench-one-batch on the Qwen3-30B-A3B (12 layers) and DeepSeek-V2-Lite (9 layers) shapes
# (decode B = 1 at 4k context, B = 64 at 256, prefill of 8k; CUDA graphs on) and a per-kernel
# Nsight Compute table of the B = 1 and B = 64 decode steps run op by op (ncu-<model>-b<B>.csv).
#   SRC=.devsrc-probe bash bench/session_probe.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-probe} B=/tmp/b
[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
cmake -S $SRC -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > $OUT/build.log 2>&1 &&
  cmake --build $B -j16 --target moeserve ms_cuda_ceilings $(cd $SRC/tests/kernels && ls test_*.cpp | sed 's/\.cpp$//') >> $OUT/build.log 2>&1 ||
  { tail -30 $OUT/build.log; log "build failed"; exit 1; }
log "built"
timeout 60 $B/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
for t in $B/tests/test_cuda_*; do
  n=$(basename $t); [ -x $t ] && [ ${t##*.} != cmake ] && [ $n != test_cuda_parallel ] || continue
  timeout ${TEST_TIMEOUT:-150} $t > $OUT/$n.log 2>&1
  log "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $OUT/$n.log | tr '\n' ' ')"
  grep -E '^\[  FAILED' $OUT/$n.log | head -5 >> "$OUT/summary.log"
done
[ -n "${EXTRA:-}" ] && { log "extra: $EXTRA"; bash -c "$EXTRA" >> "$OUT/extra.log" 2>&1; log "extra rc=$?"; }
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in qwen3:qwen3-30b-a3b:12 v2lite:deepseek-v2-lite:9; do
  IFS=: read -r name shape layers <<< "$m"
  timeout 120 $B/moeserve make-random-model --shape $shape --layers $layers /tmp/$name > /dev/null 2>&1
  cp /tmp/$name/config.json "$OUT/$name-config.json"
  for run in "1 4096 16" "64 256 16" "1 8192 2"; do
    read -r b i o <<< "$run"
    echo "== $name B=$b I=$i O=$o" >> "$OUT/bench.log"
    timeout 120 $B/moeserve bench-one-batch --model-path /tmp/$name --device cuda --batch-size $b --input-len $i \
      --output-len $o --result-file "$OUT/bench.jsonl" >> "$OUT/bench.log" 2>&1
    log "$name B=$b I=$i rc=$? $(grep -E 'Prefill\.|Decode\.  median' "$OUT/bench.log" | tail -2 | tr '\n' ' ')"
  done
  [ -z "${SKIP_NCU:-}" ] && for run in "1 4096" "64 256"; do
    read -r b i <<< "$run"
    timeout 90 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file $OUT/ncu-$name-b$b.csv $B/moeserve bench-one-batch --model-path /tmp/$name --device cuda \
      --batch-size $b --input-len $i --output-len 4 --disable-cuda-graph > /dev/null 2>&1
    log "ncu $name B=$b rc=$?"
  done
  rm -rf /tmp/$name
done
log done
