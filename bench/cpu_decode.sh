#!/usr/bin/env bash
# CPU decode throughput at batch 1 (issue 2): the largest fixture and a generated random
# Qwen3-MoE of hidden 1024 with 64 experts, against the host's measured read bandwidth.
# Usage: bench/cpu_decode.sh [build dir] [work dir]
set -euo pipefail
build=${1:-build}
work=${2:-/tmp/moeserve-cpu-bench}
mkdir -p "$work"
g++ -O3 -march=native -pthread "$(dirname "$0")/cpu_bandwidth.cpp" -o "$work/cpu_bandwidth"
"$work/cpu_bandwidth" 2
[ -f "$work/qwen3-moe-small/config.json" ] || "$build/moeserve" make-random-model --shape qwen3-moe-small "$work/qwen3-moe-small"
for model in tests/fixtures/deepseek-v3-tiny "$work/qwen3-moe-small"; do
  echo "== $model"
  "$build/moeserve" bench-one-batch --model-path "$model" --batch-size 1 --input-len 128 --output-len 64
done
