#!/usr/bin/env bash
# Where DeepSeek-V3's FP8 decode at B = 64 / 256 lost time (BENCHMARKS, session 6: 1.94 -> 2.99 ms a
# MoE layer at B = 64 between 21044d2 and faa5070). Device tool, nvidia-h200, from the repository root:
#   for c in 21044d2 c72919f 2556280 HEAD; do mkdir -p .devsrc-bis-$c && git archive $c | tar x -C .devsrc-bis-$c \
#     && rm -rf .devsrc-bis-$c/tests/fixtures; done
#   COMMITS="21044d2 c72919f 2556280 HEAD" bash bench/v3_decode_bisect.sh
# carrying [".deps", ".devsrc-bis-21044d2", ".devsrc-bis-c72919f", ".devsrc-bis-2556280", ".devsrc-bis-HEAD"].
# c72919f..2556280 is the FP8 linears streamed up to 64 rows; 21044d2..c72919f holds the streaming
# decode attention and the gemv input prefetch. Builds moeserve of each tree (in parallel), makes the
# 2- and 5-layer EP8-shard models with the last tree's binary, times B = 64 and 256 decode with every
# tree, then Nsight Compute per-kernel times of one B = 64 step for the first and last trees.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
COMMITS=${COMMITS:-"21044d2 c72919f 2556280 HEAD"} L=/tmp/bis-logs
mkdir -p $L .b4/models
for c in $COMMITS; do
  (configure_tree .devsrc-bis-$c /tmp/bis-$c && cmake --build /tmp/bis-$c -j5 --target moeserve) > $L/build-$c.log 2>&1 &
done
wait
for c in $COMMITS; do [ -x /tmp/bis-$c/moeserve ] && log "built $c" || { log "build $c failed"; tail -5 $L/build-$c.log; }; done
LAST=${COMMITS##* } FIRST=${COMMITS%% *}
for layers in 2 5; do
  M=.b4/models/v3ep8-$layers
  [ -e $M/config.json ] || timeout 150 /tmp/bis-$LAST/moeserve make-random-model --shape deepseek-v3 --fp8 \
    --layers $layers --set num_nextn_predict_layers=0 --set n_routed_experts=32 $M > $L/make-$layers.log 2>&1
done
for c in $COMMITS; do
  for layers in 2 5; do
    for bi in "64 512" "256 128"; do
      read -r b i <<< "$bi"
      timeout 60 /tmp/bis-$c/moeserve bench-one-batch --model-path .b4/models/v3ep8-$layers --device cuda \
        --batch-size $b --input-len $i --output-len 16 --result-file $OUT/bisect-$c.jsonl > $L/$c-$layers-$b.log 2>&1
      log "$c L=$layers B=$b rc=$? $(grep -E 'Decode\.  median' $L/$c-$layers-$b.log)"
    done
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for c in $FIRST $LAST; do
  timeout 100 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu-$c-b64.csv \
    /tmp/bis-$c/moeserve bench-one-batch --model-path .b4/models/v3ep8-2 --device cuda --batch-size 64 \
    --input-len 512 --output-len 4 --disable-cuda-graph > /dev/null 2>&1
  log "ncu $c rc=$? (bench/kernel_table.py $OUT/ncu-$c-b64.csv)"
done
log done
