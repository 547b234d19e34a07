#!/usr/bin/env bash
# Session 5's last GPU calls (device tool, nvidia-h200), from the repository root, in two phases that
# share build and model directories under .b4/ (ignored; kept while the machine stays warm).
# PHASE=1: the tree to verify ($SRC, a `git archive HEAD`) and the tree before this session's kernel
#   work ($BEFORE_SRC, `git archive 0fa13b9`) build side by side; every single-GPU test of $SRC with
#   programmatic dependent launch on, then off (MOESERVE_PDL=0); speculative `generate` against the
#   plain run; the opt-in kernel timings (attention before/after; MoE prefill, prefill attention,
#   sampling after); bench-one-batch before / after / after with MOESERVE_PDL=0 (Qwen3-30B-A3B 12
#   layers, DeepSeek-V2-Lite 9 layers: decode B = 1 at 4k and B = 64 at 256, prefill of 8k).
# PHASE=2: compute-sanitizer racecheck/synccheck over the new kernels' tests; bench-offline greedy
#   and sampled (temperature 1), before/after; Nsight Compute per-kernel times of the Qwen3 B = 1 and
#   V2-Lite B = 64 steps.
# PHASE=3: DeepSeek-V3 FP8, the EP8 shard (32 experts), 2 and 5 layers, bench-one-batch before/after.
#   PHASE=1 SRC=.devsrc-s5 BEFORE_SRC=.devsrc-s5before bash bench/session5_run.sh
# Carry [".deps", "$SRC", "$BEFORE_SRC"] in both phases.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s5} BEFORE_SRC=${BEFORE_SRC:-.devsrc-s5before} L=/tmp/logs PHASE=${PHASE:-1}
mkdir -p $L .b4/after .b4/before .b4/models
ln -sfn $ROOT/.b4/after /tmp/b && ln -sfn $ROOT/.b4/before /tmp/before
B=/tmp/b/moeserve
model() {  # the random model $1 (shape $2, $3 layers) in .b4/models, linked as /tmp/$1
  [ -e .b4/models/$1/config.json ] || timeout 150 $B make-random-model --shape $2 --layers $3 .b4/models/$1 > /dev/null 2>&1
  ln -sfn $ROOT/.b4/models/$1 /tmp/$1
}
# bench-one-batch of /tmp/$1 at each "B input output" after it: before, after, after without PDL.
bench_three() {
  local name=$1 run b i o side bin env; shift
  for run in "$@"; do
    read -r b i o <<< "$run"
    for side in before after nopdl; do
      bin=/tmp/b/moeserve env=""; [ $side = before ] && bin=/tmp/before/moeserve; [ $side = nopdl ] && env="MOESERVE_PDL=0"
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

if [ $PHASE = 1 ]; then
  # The same timing cases and bench-offline options (--temperature) on both sides: the before tree
  # gets the after tree's attention test and bench-offline command (they use only what it has).
  cp $SRC/tests/kernels/test_cuda_attention_moe.cpp $BEFORE_SRC/tests/kernels/
  cp $SRC/tools/cmd_bench_offline.cpp $BEFORE_SRC/tools/
  build_trees $SRC $BEFORE_SRC
  cmake --build /tmp/before -j12 --target test_cuda_attention_moe > $L/build-before-attn.log 2>&1 ||
    log "before attention test build failed"
  run_gpu_tests /tmp/b $TESTS
  mkdir -p $L/nopdl && L0=$L && L=$L/nopdl && export MOESERVE_PDL=0 && log "--- the same tests, MOESERVE_PDL=0"
  run_gpu_tests /tmp/b $TESTS
  unset MOESERVE_PDL; L=$L0
  spec_vs_plain $B
  timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
  for side in /tmp/before /tmp/b; do opt_in_bench $side test_cuda_attention_moe MOESERVE_BENCH_ATTENTION '*Bench*'; done
  opt_in_bench /tmp/b test_cuda_moe_prefill MOESERVE_BENCH_MOE '*Bench*'
  opt_in_bench /tmp/b test_cuda_flash_prefill MOESERVE_BENCH_PREFILL '*Bench*'
  opt_in_bench /tmp/b test_cuda_sampling MOESERVE_BENCH_SAMPLING '*Bench*'
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  for name in qwen3 v2lite; do bench_three $name "1 4096 16" "64 256 16" "1 8192 2"; done
elif [ $PHASE = 3 ]; then
  # DeepSeek-V3 with FP8 blocks, the 32-expert shard one GPU of EP8 holds, 2 and 5 layers (one
  # dense first layer each): per MoE layer = step difference / 3, before and after.
  for layers in 2 5; do
    M=.b4/models/v3ep8-$layers
    [ -e $M/config.json ] || timeout 200 $B make-random-model --shape deepseek-v3 --fp8 --layers $layers \
      --set num_nextn_predict_layers=0 --set n_routed_experts=32 $M > $L/make-v3-$layers.log 2>&1
    log "v3 ep8 model layers=$layers rc=$? $(du -sh $M | cut -f1)"
    for bi in "1 4096" "64 512" "256 128"; do
      read -r b i <<< "$bi"
      for side in before b; do
        timeout 150 /tmp/$side/moeserve bench-one-batch --model-path $M --device cuda --batch-size $b --input-len $i \
          --output-len 16 --result-file "$OUT/v3-$side-$layers.jsonl" > $L/v3-$side-$layers-$b.log 2>&1
        log "v3 ep8 L=$layers B=$b I=$i $side rc=$? $(grep -E 'Prefill\.|Decode\.  median' $L/v3-$side-$layers-$b.log | tr '\n' ' ')"
      done
    done
  done
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  timeout 150 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu-v3ep8-b64.csv \
    $B bench-one-batch --model-path .b4/models/v3ep8-2 --device cuda --batch-size 64 --input-len 512 --output-len 4 \
    --disable-cuda-graph > /dev/null 2>&1; log "ncu v3 ep8 B=64 rc=$?"
else
  model qwen3 qwen3-30b-a3b 12; model v2lite deepseek-v2-lite 9
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
  for t in "test_cuda_attention_moe CudaOps.GqaAttentionMatchesCpu:CudaOps.MlaAttentionMatchesCpuOnStridedQueries" \
           "test_cuda_flash_prefill *" "test_cuda_moe_prefill *" "test_cuda_sampling *"; do
    read -r prog filter <<< "$t"
    [ -x /tmp/b/tests/$prog ] || continue
    for tool in racecheck synccheck; do
      timeout 120 $SAN --tool $tool --print-limit 5 /tmp/b/tests/$prog --gtest_filter="$filter" > $L/$tool-$prog.log 2>&1
      log "compute-sanitizer $tool $prog rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $L/$tool-$prog.log | head -3 | tr '\n' ' ')"
    done
  done
  # Greedy and sampled (temperature 1, the OpenAI default) requests, 64 at a time, before and after.
  for name in qwen3 v2lite; do
    for temp in 0 1; do
      for side in before b; do
        timeout 150 /tmp/$side/moeserve bench-offline --model-path /tmp/$name --device cuda --num-prompts 64 \
          --random-input-len 256 --random-output-len 128 --random-range-ratio 1 --disable-tqdm --temperature $temp \
          --result-filename $OUT/offline-$side.jsonl > $L/offline-$name-$temp-$side.log 2>&1
        log "offline $name n=64 T=$temp $side rc=$? $(tail -1 $OUT/offline-$side.jsonl | grep -o '"output_throughput":[0-9.]*\|"overlapped_steps":[0-9]*' | tr '\n' ' ')"
      done
    done
  done
  # Does PDL act inside captured graphs? The same step eager (graphs off), PDL on and off.
  for pdl in 1 0; do
    MOESERVE_PDL=$pdl timeout 120 $B bench-one-batch --model-path /tmp/qwen3 --device cuda --batch-size 1 --input-len 4096 \
      --output-len 16 --disable-cuda-graph --result-file "$OUT/bench-eager.jsonl" > $L/eager-$pdl.log 2>&1
    log "eager qwen3 B=1 PDL=$pdl rc=$? $(grep -E 'Decode\.  median' $L/eager-$pdl.log | tail -1)"
  done
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for name in qwen3 v2lite; do
    [ $name = qwen3 ] && set -- 1 4096 || set -- 64 256
    timeout 100 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file $OUT/ncu-$name-b$1.csv $B bench-one-batch --model-path /tmp/$name --device cuda \
      --batch-size $1 --input-len $2 --output-len 4 --disable-cuda-graph > /dev/null 2>&1; log "ncu $name B=$1 rc=$?"
  done
fi
tar czf "$OUT/logs-$PHASE.tgz" -C $L . 2>/dev/null
log done
