#!/usr/bin/env bash
# A short check of DeepSeek-V3's FP8 EP8-shard decode at B = 64 on one tree ($SRC): builds moeserve
# only, makes the 2- and 5-layer models, runs each B = 64 decode twice, then Nsight Compute of one
# B = 64 step of the 2-layer model (bench/kernel_table.py reads it). Device tool, nvidia-h200:
#   SRC=.devsrc-fin timeout 230 bash bench/v3_b64_check.sh; tar czf $OUT/logs.tgz -C /tmp/logs .
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
L=/tmp/logs; mkdir -p $L .b4/models
(configure_tree $SRC /tmp/b && cmake --build /tmp/b -j16 --target moeserve) > $L/build.log 2>&1; log "built rc=$?"
for l in 2 5; do
  timeout 60 /tmp/b/moeserve make-random-model --shape deepseek-v3 --fp8 --layers $l --set num_nextn_predict_layers=0 \
    --set n_routed_experts=32 .b4/models/v3ep8-$l > $L/make-$l.log 2>&1; log "model $l rc=$?"
done
for rep in 1 2; do
  for l in 2 5; do
    timeout 30 /tmp/b/moeserve bench-one-batch --model-path .b4/models/v3ep8-$l --device cuda --batch-size 64 \
      --input-len 512 --output-len 16 --result-file $OUT/b64.jsonl > $L/b64-$l-$rep.log 2>&1
    log "L=$l rep $rep rc=$? $(grep -E 'Decode\.  median' $L/b64-$l-$rep.log)"
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 40 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $L/ncu-v3-b64.csv \
  /tmp/b/moeserve bench-one-batch --model-path .b4/models/v3ep8-2 --device cuda --batch-size 64 --input-len 512 \
  --output-len 4 --disable-cuda-graph > /dev/null 2>&1; log "ncu rc=$?"
