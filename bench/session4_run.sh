#!/usr/bin/env bash
# Session 4's GPU calls (device tool, nvidia-h200), from the repository root, in two phases that
# share build and model directories under .b4/ (ignored; kept while the machine stays warm).
# PHASE=1: the committed tree ($SRC, a `git archive HEAD`) and the tree before this session's
#   kernels ($BEFORE_SRC) build side by side; every single-GPU test of the committed tree;
#   speculative `generate` against the plain run; the decode attention timing harness before and
#   after; bench-one-batch before/after (Qwen3-30B-A3B 12 layers, DeepSeek-V2-Lite 9 layers: decode
#   B = 1 at 4k and B = 64 at 256, prefill of 8k).
# PHASE=2: compute-sanitizer racecheck/synccheck over the decode attention tests; overlap
#   scheduling off, then on, through bench-offline (same binary); Nsight Compute per-kernel times
#   of the Qwen3 B = 1 and V2-Lite B = 64 steps.
# $OUT gets summary.log, bench-{before,after}.jsonl, offline.jsonl, ceilings.json, ncu-*.csv, logs.tgz.
#   PHASE=1 SRC=.devsrc-s4 BEFORE_SRC=.devsrc-s4before bash bench/session4_run.sh
# $SRC: the tree to verify (the gpu-pending work applied: `git apply bench/gpu_pending.patch`, or
# the branch); $BEFORE_SRC: main without it. Carry [".deps", "$SRC", "$BEFORE_SRC"]; phase 2
# carries ".deps" only and reuses .b4/.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s4} BEFORE_SRC=${BEFORE_SRC:-.devsrc-s4before} L=/tmp/logs PHASE=${PHASE:-1}
mkdir -p $L .b4/after .b4/before .b4/models
ln -sfn $ROOT/.b4/after /tmp/b && ln -sfn $ROOT/.b4/before /tmp/before
B=/tmp/b/moeserve
model() {  # the random model $1 (shape $2, $3 layers) in .b4/models, linked as /tmp/$1
  [ -e .b4/models/$1/config.json ] || timeout 150 $B make-random-model --shape $2 --layers $3 .b4/models/$1 > /dev/null 2>&1
  ln -sfn $ROOT/.b4/models/$1 /tmp/$1
}

if [ $PHASE = 1 ]; then
  # The attention timing harness is new: the before tree gets the after tree's test file (it uses
  # only ops the before tree has) so that both time the same cases.
  cp $SRC/tests/kernels/test_cuda_attention_moe.cpp $BEFORE_SRC/tests/kernels/
  build_trees $SRC $BEFORE_SRC
  cmake --build /tmp/before -j12 --target test_cuda_attention_moe > $L/build-before-attn.log 2>&1 ||
    log "before attention test build failed"
  run_gpu_tests /tmp/b $TESTS
  spec_vs_plain $B
  timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
  for side in before b; do
    MOESERVE_BENCH_ATTENTION=1 timeout 60 /tmp/$side/tests/test_cuda_attention_moe \
      --gtest_filter=CudaOps.DecodeAttentionBench > $L/attention_bench_$side.log 2>&1
    log "attention timing ($side) rc=$?"; grep '\[bench\]' $L/attention_bench_$side.log >> "$OUT/summary.log"
  done
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  for name in qwen3 v2lite; do bench_before_after $name "1 4096 16" "64 256 16" "1 8192 2"; done
else
  [ -x $B ] || { configure_tree $SRC /tmp/b > $L/build.log 2>&1 && cmake --build /tmp/b -j12 --target moeserve >> $L/build.log 2>&1; log "rebuilt"; }
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  # The decode attention's cp.async ring refills a slot its own thread read a step before, with no
  # barrier in between: racecheck and synccheck over the GQA and MLA decode cases.
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  for tool in racecheck synccheck; do
    timeout 150 $SAN --tool $tool --print-limit 5 /tmp/b/tests/test_cuda_attention_moe \
      --gtest_filter='CudaOps.GqaAttentionMatchesCpu:CudaOps.MlaAttentionMatchesCpuOnStridedQueries' > $L/$tool.log 2>&1
    log "compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|HAZARD|PASSED|FAILED' $L/$tool.log | head -3 | tr '\n' ' ')"
  done
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for name in qwen3 v2lite; do
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
  done
fi
tar czf "$OUT/logs-$PHASE.tgz" -C $L . 2>/dev/null
log done
