#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root, logs under $OUT: builds the
# committed tree (.devsrc, a `git archive HEAD`), runs every GPU test, then speculative decoding
# on the GPU — greedy ids with and without MTP drafting on the DeepSeek fixture, and
# bench-speculative with the acceptance-controlled replay draft.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
[ -e .devsrc/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" .devsrc/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
cmake -S .devsrc -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > "$OUT/build.log" 2>&1 &&
  cmake --build /tmp/b -j16 --target moeserve test_cuda_ops test_cuda_attention_moe test_cuda_graphs test_cuda_fixtures \
    test_nccl_comm >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
log "built"
for t in test_cuda_ops test_cuda_attention_moe test_cuda_graphs test_cuda_fixtures test_nccl_comm; do
  timeout 300 /tmp/b/tests/$t > "$OUT/$t.log" 2>&1; log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$t.log" | tr '\n' ' ')"
done
B=/tmp/b/moeserve F=tests/fixtures/deepseek-v3-tiny
printf '{"input_ids":[5,17,3,99,410,7],"max_new_tokens":32,"ignore_eos":true}\n{"input_ids":[11,12,13],"max_new_tokens":32,"ignore_eos":true}\n' > /tmp/p.jsonl
$B generate --device cuda --model-path $F --max-total-tokens 4096 --input-file /tmp/p.jsonl > /tmp/plain.txt 2>&1
for n in 1 3; do
  $B generate --device cuda --model-path $F --max-total-tokens 4096 --input-file /tmp/p.jsonl --speculative-algorithm NEXTN \
    --speculative-num-steps $n --speculative-num-draft-tokens $((n + 1)) > /tmp/spec$n.txt 2> "$OUT/spec$n.err"
  if cmp -s /tmp/plain.txt /tmp/spec$n.txt; then log "speculative steps=$n: ids equal plain"; else log "speculative steps=$n: DIFFER"; fi
done
cp /tmp/plain.txt /tmp/spec1.txt /tmp/spec3.txt "$OUT/" 2>/dev/null
timeout 200 $B bench-speculative --device cuda --model-path $F --batch-size 1 --input-len 64 --output-len 128 \
  --speculative-num-steps 3 --error-rates 0 0.2 0.5 1 --mtp --result-file "$OUT/spec_bench.jsonl" > "$OUT/spec_bench.log" 2>&1
log "bench-speculative rc=$?"
