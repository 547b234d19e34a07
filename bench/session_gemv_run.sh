#!/usr/bin/env bash
# Device tool (nvidia-h200), from the repository root: the weight-streaming product for up to 64
# rows. Builds $SRC (after) and $BEFORE_SRC (before) side by side, runs every single-GPU test of
# the after tree, bench-one-batch before/after on the Qwen3-30B-A3B (12 layers) and
# DeepSeek-V2-Lite (9 layers) shapes at B = 1 / 4k, 8 / 1k, 64 / 256 (CUDA graphs on), and
# bench-speculative (replay draft, 3 steps) at B = 8 on the DeepSeek-V3 FP8 shape (2 layers), whose
# 32-row verify now streams the FP8 weights too.
#   SRC=.devsrc-final BEFORE_SRC=.devsrc-before bash bench/session_gemv_run.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-final} BEFORE_SRC=${BEFORE_SRC:-.devsrc-before} L=/tmp/logs B=/tmp/b/moeserve
mkdir -p $L
build_trees $SRC $BEFORE_SRC
($B make-random-model --shape deepseek-v3 --fp8 --layers 2 --set num_nextn_predict_layers=0 /tmp/v3 > $L/make.log 2>&1 &&
  touch /tmp/v3.done) &
run_gpu_tests /tmp/b $TESTS
timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
for i in $(seq 90); do [ -e /tmp/v3.done ] && break; sleep 1; done
[ -e /tmp/v3.done ] && for side in before after; do
  bin=$B; [ $side = before ] && bin=/tmp/before/moeserve
  timeout 120 $bin bench-speculative --device cuda --model-path /tmp/v3 --batch-size 8 --input-len 128 --output-len 48 \
    --speculative-num-steps 3 --error-rates 0,0.5 --result-file "$OUT/spec-$side.jsonl" >> $L/spec.log 2>&1
  log "$side bench-speculative B=8 rc=$?"
done
rm -rf /tmp/v3
for m in qwen3:qwen3-30b-a3b:12 v2lite:deepseek-v2-lite:9; do
  IFS=: read -r name shape layers <<< "$m"
  timeout 120 $B make-random-model --shape $shape --layers $layers /tmp/$name > /dev/null 2>&1
  cp /tmp/$name/config.json "$OUT/$name-config.json"
  bench_before_after $name "1 4096 16" "8 1024 16" "64 256 16"
  rm -rf /tmp/$name
done
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
log done
