#!/usr/bin/env bash
# CUDA graphs in the engine (issue 9) and speculative decoding under them (issue 11), on the GPU
# machine (the device tool), from the repository root, logs under $OUT: builds the committed tree
# ($SRC, a `git archive HEAD`) and, while the engine-with-graphs tests run, writes two random
# checkpoints on the CPU; then bench-speculative with the replay draft on the DeepSeek-V3 shape
# (FP8, full width: 256 experts, top-8, MLA with 128 heads; 2 layers, the first dense, no MTP
# layer) at batch 1 and 8 with graphs and at batch 1 without, bench-offline on the Qwen3-30B-A3B
# shape (bf16, 6 layers) with and without graphs, and last the other GPU tests.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-graphs}
[ -e "$SRC/tests/fixtures" ] || ln -s "$ROOT/tests/fixtures" "$SRC/tests/fixtures"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
TESTS="test_cuda_engine_graphs test_cuda_graphs test_cuda_ops test_cuda_attention_moe test_cuda_fixtures test_nccl_comm test_cuda_parallel test_cuda_fp8_gemm"
cmake -S "$SRC" -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > /tmp/build.log 2>&1 &&
  cmake --build /tmp/b -j16 --target moeserve $TESTS >> /tmp/build.log 2>&1 || { tail -40 /tmp/build.log; exit 1; }
log "built"
B=/tmp/b/moeserve
(
  $B make-random-model --shape deepseek-v3 --fp8 --layers 2 --set num_nextn_predict_layers=0 /tmp/v3 > /tmp/make.log 2>&1 &&
    touch /tmp/v3.done
  $B make-random-model --shape qwen3-30b-a3b --layers 6 /tmp/qwen3 >> /tmp/make.log 2>&1 && touch /tmp/qwen3.done
) &
run_test() {
  timeout 240 /tmp/b/tests/$1 >> "$OUT/tests.log" 2>&1
  log "$1 rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/tests.log" | tail -3 | tr '\n' ' ')"
}
run_test test_cuda_engine_graphs
run_test test_cuda_graphs
wait
log "models: $(du -sh /tmp/v3 /tmp/qwen3 2>&1 | tr '\n' ' ') $(tail -2 /tmp/make.log | tr '\n' ' ')"
spec() {  # batch [flags]
  local b=$1; shift
  echo "== bench-speculative B=$b $*" >> "$OUT/bench.log"
  timeout 150 $B bench-speculative --device cuda --model-path /tmp/v3 --batch-size "$b" --input-len 128 \
    --output-len 48 --speculative-num-steps 3 --result-file "$OUT/spec.jsonl" "$@" >> "$OUT/bench.log" 2>&1
  log "bench-speculative B=$b $* rc=$?"
}
[ -e /tmp/v3.done ] && { spec 1 --error-rates 0,0.2,0.5,1; spec 8 --error-rates 0,0.2,0.5,1; spec 1 --error-rates 0,0.5 --disable-cuda-graph; }
offline() {  # [flags]
  echo "== bench-offline $*" >> "$OUT/bench.log"
  timeout 120 $B bench-offline --device cuda --model-path /tmp/qwen3 --num-prompts 64 --random-input-len 256 \
    --random-output-len 64 --max-running-requests 64 --max-total-tokens 40000 --disable-tqdm \
    --result-filename "$OUT/offline.jsonl" "$@" >> "$OUT/bench.log" 2>&1
  log "bench-offline $* rc=$? $(grep -E 'Output token throughput' "$OUT/bench.log" | tail -1)"
}
[ -e /tmp/qwen3.done ] && { offline; offline --disable-cuda-graph; }
for t in $TESTS; do case $t in test_cuda_engine_graphs|test_cuda_graphs) ;; *) run_test $t ;; esac; done
grep -E '^\[ (graphs|fixture) \]|FAILED|Failure' "$OUT/tests.log" | head -40 >> "$OUT/summary.log"
log done
