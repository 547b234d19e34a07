#!/usr/bin/env bash
# Where DeepSeek-V3's FP8 decode at B = 64 / 256 lost time (BENCHMARKS, session 6: 1.94 -> 2.99 ms a
# MoE layer at B = 64 between 21044d2 and faa5070). Device tool, nvidia-h200, from the repository root:
#   for c in 21044d2 2556280 HEAD; do mkdir -p .devsrc-bis-$c && git archive $c | tar x -C .devsrc-bis-$c \
#     && rm -rf .devsrc-bis-$c/tests/fixtures; done
#   COMMITS="21044d2 2556280 HEAD" timeout 570 bash bench/v3_decode_bisect.sh; tar czf $OUT/logs.tgz -C /tmp/bis-logs .
# carrying [".deps", ".devsrc-bis-21044d2", ".devsrc-bis-2556280", ".devsrc-bis-HEAD"].
# 21044d2..2556280 holds the streaming decode attention, the gemv input prefetch and the FP8 linears
# streamed up to 64 rows; 2556280..HEAD the split rules, MoE intermediates in BF16 and the rest.
# Builds moeserve of each tree (in parallel), makes the 2- and 5-layer EP8-shard models with the last
# tree's binary, times B = 64 and 256 decode with every tree, then Nsight Compute per-kernel times of
# one B = 64 and one B = 256 step for the first and last trees (bench/kernel_table.py reads them),
# and, while time is left, of a Qwen3-30B-A3B (12 layers) B = 1 step with the last tree.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
COMMITS=${COMMITS:-"21044d2 2556280 HEAD"} L=/tmp/bis-logs
left() { echo $(( 560 - ($(date +%s) - T0) )); }
mkdir -p $L .b4/models
for c in $COMMITS; do
  (configure_tree .devsrc-bis-$c /tmp/bis-$c && cmake --build /tmp/bis-$c -j6 --target moeserve) > $L/build-$c.log 2>&1 &
done
wait
for c in $COMMITS; do [ -x /tmp/bis-$c/moeserve ] && log "built $c" || { log "build $c failed"; tail -5 $L/build-$c.log; }; done
LAST=${COMMITS##* } FIRST=${COMMITS%% *}
for layers in 2 5; do
  M=.b4/models/v3ep8-$layers
  [ -e $M/config.json ] || timeout 150 /tmp/bis-$LAST/moeserve make-random-model --shape deepseek-v3 --fp8 \
    --layers $layers --set num_nextn_predict_layers=0 --set n_routed_experts=32 $M > $L/make-$layers.log 2>&1
  log "model v3ep8-$layers rc=$?"
done
for c in $COMMITS; do
  for layers in 2 5; do
    for bi in "64 512" "256 128"; do
      read -r b i <<< "$bi"
      [ $(left) -gt 150 ] || continue
      timeout 60 /tmp/bis-$c/moeserve bench-one-batch --model-path .b4/models/v3ep8-$layers --device cuda \
        --batch-size $b --input-len $i --output-len 16 --result-file $OUT/bisect-$c.jsonl > $L/$c-$layers-$b.log 2>&1
      log "$c L=$layers B=$b rc=$? $(grep -E 'Decode\.  median' $L/$c-$layers-$b.log)"
    done
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for bi in "64 512" "256 128"; do
  read -r b i <<< "$bi"
  for c in $FIRST $LAST; do
    [ $(left) -gt 60 ] || continue
    timeout 50 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu-$c-b$b.csv \
      /tmp/bis-$c/moeserve bench-one-batch --model-path .b4/models/v3ep8-2 --device cuda --batch-size $b \
      --input-len $i --output-len 4 --disable-cuda-graph > /dev/null 2>&1
    log "ncu $c B=$b rc=$?"
  done
done
if [ $(left) -gt 100 ]; then
  M=.b4/models/qwen3
  [ -e $M/config.json ] || timeout 60 /tmp/bis-$LAST/moeserve make-random-model --shape qwen3-30b-a3b --layers 12 $M > $L/make-qwen3.log 2>&1
  timeout $(( $(left) - 5 )) "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu-qwen3-b1.csv \
    /tmp/bis-$LAST/moeserve bench-one-batch --model-path $M --device cuda --batch-size 1 --input-len 4096 \
    --output-len 4 --disable-cuda-graph > /dev/null 2>&1
  log "ncu qwen3 B=1 rc=$?"
fi
log done
