#!/usr/bin/env bash
# On the GPU machine (device tool, nvidia-h200-x2), with moeserve built at $BIN and logs under
# $OUT: `moeserve serve` on one GPU, with --tp 2, and with --tp 2 --dp 2 --enable-dp-attention
# --ep-size 2 (ParallelEngine: one engine per GPU in lockstep), each driven by the same
# bench-serving run (random prompts over native /generate), on a random Qwen3-30B-A3B-shaped
# checkpoint of $QL layers. Also checks that the server's greedy ids equal `generate` on one GPU.
#   BIN=/tmp/b QL=12 bench/cuda_serving_parallel.sh
set -uo pipefail
OUT=${OUT:-/tmp/out} QL=${QL:-12} Q=/tmp/q3serve PORT=31990
B=$BIN/moeserve
[ -d $Q ] || $B make-random-model --shape qwen3-30b-a3b --layers $QL $Q > "$OUT/serve_make.log" 2>&1
IDS='[5,17,3,99,410,7,1000,2000]'
one=$($B generate --device cuda --model-path $Q --ids 5,17,3,99,410,7,1000,2000 --max-new-tokens 16 --ignore-eos 2>/dev/null)
echo "one GPU generate: $one" >> "$OUT/serving.log"
declare -A MODES=([tp1]="" [tp2]="--tp 2" [dp2ep2]="--tp 2 --dp 2 --enable-dp-attention --ep-size 2")
for m in tp1 tp2 dp2ep2; do
  $B serve --device cuda --model-path $Q --port $PORT --max-total-tokens 131072 --max-running-requests 128 \
    ${MODES[$m]} > "$OUT/serve_$m.out" 2> "$OUT/serve_$m.err" &
  pid=$!
  for i in $(seq 1 120); do grep -q ready "$OUT/serve_$m.out" 2>/dev/null && break; sleep 1; done
  got=$(python3 -c "import json,urllib.request as u; b=json.dumps({'input_ids':$IDS,'sampling_params':{'max_new_tokens':16,'temperature':0,'ignore_eos':True}}).encode(); print(json.loads(u.urlopen(u.Request('http://127.0.0.1:$PORT/generate',b,{'Content-Type':'application/json'})).read())['output_ids'])" 2>&1 | tail -1)
  echo "$m /generate: $got" >> "$OUT/serving.log"
  timeout 200 $B bench-serving --base-url http://127.0.0.1:$PORT --num-prompts 128 --random-input-len 1024 \
    --random-output-len 128 --random-range-ratio 0.5 --request-rate inf --max-concurrency 64 --seed 1 \
    --warmup-requests 4 --output-file "$OUT/serving.jsonl" --disable-tqdm >> "$OUT/serving.log" 2>&1
  echo "$m bench-serving rc=$?" >> "$OUT/serving.log"
  kill -TERM $pid; wait $pid
done
