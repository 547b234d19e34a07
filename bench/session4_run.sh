#!/usr/bin/env bash
# Session 4's GPU call (device tool, nvidia-h200), from the repository root: the committed tree
# ($SRC, a `git archive HEAD`) and the tree before this session's kernels ($BEFORE_SRC) build side
# by side; every single-GPU test of the committed tree; speculative `generate` against the plain
# run; bench-one-batch before/after (Qwen3-30B-A3B 12 layers, DeepSeek-V2-Lite 9 layers: decode
# B = 1 at 4k, B = 8 at 1k, B = 64 at 256, prefill of 8k); overlap scheduling on and off through
# bench-offline (same binary, one run after the other); the attention timing harness when
# MOESERVE_BENCH_ATTENTION tests exist; Nsight Compute per-kernel times of the Qwen3 B = 1 step.
# $OUT gets summary.log, bench-{before,after}.jsonl, offline.jsonl, ceilings.json, ncu-qwen3-b1.csv, ncu-v2lite-b64.csv, logs.tgz.
#   SRC=.devsrc-s4 BEFORE_SRC=.devsrc-s4before bash bench/session4_run.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s4} BEFORE_SRC=${BEFORE_SRC:-.devsrc-s4before} L=/tmp/logs
mkdir -p $L
# The attention timing harness is new: the before tree gets the after tree's test file (it uses
# only ops the before tree has) so that both time the same cases.
cp $SRC/tests/kernels/test_cuda_attention_moe.cpp $BEFORE_SRC/tests/kernels/
build_trees $SRC $BEFORE_SRC
cmake --build /tmp/before -j12 --target test_cuda_attention_moe > $L/build-before-attn.log 2>&1 || log "before attention test build failed"
B=/tmp/b/moeserve
run_gpu_tests /tmp/b $TESTS
spec_vs_plain $B
timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
for side in before b; do
  MOESERVE_BENCH_ATTENTION=1 timeout 60 /tmp/$side/tests/test_cuda_attention_moe --gtest_filter=CudaOps.DecodeAttentionBench \
    > $L/attention_bench_$side.log 2>&1
  log "attention timing ($side) rc=$?"; grep '\[bench\]' $L/attention_bench_$side.log >> "$OUT/summary.log"
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in qwen3:qwen3-30b-a3b:12 v2lite:deepseek-v2-lite:9; do
  IFS=: read -r name shape layers <<< "$m"
  timeout 120 $B make-random-model --shape $shape --layers $layers /tmp/$name > /dev/null 2>&1
  bench_before_after $name "1 4096 16" "8 1024 16" "64 256 16" "1 8192 2"
  # Overlap scheduling off, then on: one request (decode-bound, batch 1) and 64 requests.
  for load in "1 128 256" "64 256 128"; do
    read -r n i o <<< "$load"
    for flag in --disable-overlap-schedule ""; do
      timeout 150 $B bench-offline --model-path /tmp/$name --device cuda --num-prompts $n --random-input-len $i \
        --random-output-len $o --random-range-ratio 1 --disable-tqdm $flag --result-filename $OUT/offline.jsonl \
        > $L/offline-$name-$n-${flag:-overlap}.log 2>&1
      log "offline $name n=$n in=$i out=$o ${flag:-overlap} rc=$? $(tail -1 $OUT/offline.jsonl | grep -o '"output_throughput":[0-9.]*\|"overlapped_steps":[0-9]*' | tr '\n' ' ')"
    done
  done
  # Per-kernel times, op by op: Qwen3 at batch 1 (4k context), V2-Lite at batch 64.
  [ $name = qwen3 ] && set -- 1 4096 || set -- 64 256
  timeout 100 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
    --log-file $OUT/ncu-$name-b$1.csv $B bench-one-batch --model-path /tmp/$name --device cuda \
    --batch-size $1 --input-len $2 --output-len 4 --disable-cuda-graph > /dev/null 2>&1; log "ncu $name B=$1 rc=$?"
  rm -rf /tmp/$name
done
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
log done
