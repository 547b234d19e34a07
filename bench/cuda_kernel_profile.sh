#!/usr/bin/env bash
# Per-kernel GPU time of the decode and prefill steps (issue 9), on the GPU machine (the device
# tool), from the repository root, logs under $OUT. Runs BIN/moeserve (built elsewhere from a
# commit, `-Xptxas -v` in its build log for registers and spills): makes 4-layer random models
# of the Qwen3-30B-A3B and DeepSeek-V2-Lite shapes, times bench-one-batch with CUDA graphs, then
# runs it op by op under Nsight Compute, one kernel duration per launch (ncu-<model>-b<B>.csv;
# bench/kernel_table.py sums them per kernel and step).
#   bench/cuda_kernel_profile.sh BIN
set -uo pipefail
BIN=${1:?directory holding moeserve}
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv >> "$OUT/summary.log" 2>&1
grep -m1 "model name" /proc/cpuinfo >> "$OUT/summary.log"
M=$BIN/moeserve
$M --help > /dev/null 2>&1 || { log "$M does not run here: $($M --help 2>&1 | head -3)"; exit 1; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
log "ncu: $NCU"
for m in qwen3:qwen3-30b-a3b v2lite:deepseek-v2-lite; do
  IFS=: read -r name shape <<< "$m"
  timeout 200 $M make-random-model --shape $shape --layers 4 /tmp/$name > /dev/null 2>&1; log "made $name rc=$?"
  timeout 60 $M bench-one-batch --model-path /tmp/$name --device cuda --batch-size 1 --input-len 8192 --output-len 2 \
    >> "$OUT/bench.log" 2>&1
  log "$name B=1 I=8192: $(grep -E 'Prefill\.' "$OUT/bench.log" | tail -1)"
  for run in "1 4096" "64 256"; do
    read -r b i <<< "$run"
    timeout 60 $M bench-one-batch --model-path /tmp/$name --device cuda --batch-size $b --input-len $i --output-len 16 \
      >> "$OUT/bench.log" 2>&1
    log "$name B=$b I=$i graphs: $(grep -E 'Prefill\.|Decode\.  median' "$OUT/bench.log" | tail -2 | tr '\n' ' ')"
    # Warm-up prefill, timed prefill, then 3 decode steps op by op.
    timeout 100 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu-$name-b$b.csv" \
      $M bench-one-batch --model-path /tmp/$name --device cuda --batch-size $b --input-len $i --output-len 4 \
      --disable-cuda-graph >> "$OUT/ncu-run.log" 2>&1
    log "ncu $name B=$b rc=$? rows=$(wc -l < "$OUT/ncu-$name-b$b.csv")"
  done
  rm -rf /tmp/$name
done
log done
