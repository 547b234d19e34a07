#!/usr/bin/env bash
# Issue 10 on two GPUs (device tool, nvidia-h200-x2), from the repository root, logs under $OUT:
# builds the committed tree (SRC, a `git archive HEAD`), runs the NCCL and multi-GPU tests
# (every parallel mode on the fixtures against one GPU, two processes as two nodes), then on
# random checkpoints of published shapes:
#   - Qwen3-30B-A3B (bf16, full width, $QL layers): logits of one prompt and 16 greedy ids per mode
#     against one GPU; bench-one-batch of one GPU (with and without CUDA graphs), tp 2 and
#     dp 2 + ep 2, at batch 1 and 64, with rank 0's time in collectives per decode step;
#   - DeepSeek-V3 (FP8 blocks, full width, one dense + one MoE layer, the 32 experts one GPU of
#     EP8 holds): logits of tp 2 and dp 2 + ep 2 + dense TP 1 against one GPU.
#   SRC=.devsrc-mgpu bench/multi_gpu_run.sh
# Q3_MODES, BENCH_MODES and V3_MODES pick a subset of the runs (tp1 is every comparison's baseline).
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-mgpu} QL=${QL:-2}
Q3_MODES=${Q3_MODES:-tp1 tp2 dp2ep2 dp2ep2_a2a} V3_MODES=${V3_MODES:-tp1 tp2 dp2ep2_dense1}
BENCH_MODES=${BENCH_MODES:-single-graph single-eager tp2 dp2ep2}
[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
cmake -S $SRC -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > "$OUT/build.log" 2>&1 &&
  cmake --build /tmp/b -j16 --target moeserve test_nccl_comm test_cuda_parallel >> "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
log "built $(cd $SRC && git log -1 --format=%h 2>/dev/null)"
timeout 60 /tmp/b/tests/test_nccl_comm > "$OUT/test_nccl_comm.log" 2>&1
log "test_nccl_comm rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_nccl_comm.log" | tr '\n' ' ')"
timeout 150 /tmp/b/tests/test_cuda_parallel > "$OUT/test_cuda_parallel.log" 2>&1
log "test_cuda_parallel rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/test_cuda_parallel.log" | tr '\n' ' ')"
grep -E '^\[  FAILED|Failure|error|Expected|Which is|actual' "$OUT/test_cuda_parallel.log" | head -60 >> "$OUT/summary.log"
grep -E '^\[ parallel \]' "$OUT/test_cuda_parallel.log" >> "$OUT/summary.log"

B=/tmp/b/moeserve Q=/tmp/q3 V=/tmp/v3
ids() { python3 -c "import random; random.seed(1); print(','.join(str(random.randrange($1)) for _ in range(64)))"; }
IDS=$(ids 151000)
$B make-random-model --shape qwen3-30b-a3b --layers $QL $Q > "$OUT/make_q3.log" 2>&1; log "qwen3-30b-a3b x$QL layers made rc=$?"
declare -A MODES=([tp1]="" [tp2]="--tp 2" [dp2ep2]="--tp 2 --dp 2 --enable-dp-attention --ep-size 2"
  [dp2ep2_a2a]="--tp 2 --dp 2 --enable-dp-attention --ep-size 2 --moe-a2a-backend all2all")
for m in $Q3_MODES; do
  timeout 60 $B logits --device cuda --model-path $Q --ids $IDS ${MODES[$m]} --out /tmp/q3_$m.st > "$OUT/q3_logits_$m.log" 2>&1
  log "qwen3 logits $m rc=$? $(grep -i error "$OUT/q3_logits_$m.log" | head -1)"
  timeout 60 $B generate --device cuda --model-path $Q --ids $IDS --max-new-tokens 16 --ignore-eos ${MODES[$m]} \
    > "$OUT/q3_ids_$m.txt" 2> "$OUT/q3_generate_$m.log"
  log "qwen3 greedy $m rc=$? $(cat "$OUT/q3_ids_$m.txt") $(grep -i error "$OUT/q3_generate_$m.log" | head -1)"
done
python3 bench/compare_logits.py $(for m in $Q3_MODES; do echo /tmp/q3_$m.st; done) 2>&1 | tee -a "$OUT/summary.log"

for bs in 1 64; do
  declare -A BENCH=([single-graph]="" [single-eager]="--disable-cuda-graph" [tp2]="--tp 2"
    [dp2ep2]="--tp 2 --dp 2 --enable-dp-attention --ep-size 2")
  for m in $BENCH_MODES; do
    echo "== $m batch $bs" >> "$OUT/bench_one_batch.log"
    timeout 60 $B bench-one-batch --device cuda --model-path $Q --batch-size $bs --input-len 256 --output-len 16 \
      ${BENCH[$m]} --result-file "$OUT/bench_one_batch.jsonl" > /tmp/bench.log 2>&1
    log "bench-one-batch $m B=$bs rc=$? $(grep -E 'median|Collectives|error' /tmp/bench.log | tr '\n' ' ')"
    cat /tmp/bench.log >> "$OUT/bench_one_batch.log"
  done
done

rm -rf $Q
$B make-random-model --shape deepseek-v3 --fp8 --layers 2 --set n_routed_experts=32 --set num_nextn_predict_layers=0 $V \
  > "$OUT/make_v3.log" 2>&1; log "deepseek-v3 fp8 (1 dense + 1 MoE layer, 32 experts) made rc=$?"
declare -A V3=([tp1]="" [tp2]="--tp 2" [dp2ep2_dense1]="--tp 2 --dp 2 --enable-dp-attention --ep-size 2 --moe-dense-tp-size 1")
for m in $V3_MODES; do
  timeout 60 $B logits --device cuda --model-path $V --ids $(ids 129000) ${V3[$m]} --out /tmp/v3_$m.st > "$OUT/v3_logits_$m.log" 2>&1
  log "deepseek-v3 fp8 logits $m rc=$? $(tail -1 "$OUT/v3_logits_$m.log")"
done
python3 bench/compare_logits.py $(for m in $V3_MODES; do echo /tmp/v3_$m.st; done) 2>&1 | tee -a "$OUT/summary.log"
log "done"
