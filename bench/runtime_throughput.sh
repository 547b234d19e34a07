#!/usr/bin/env bash
# Output tokens/s of `moeserve generate --input-file` for N concurrent requests (default 1
# and 64) on one checkpoint: every request has a PROMPT_LEN-token prompt (different per
# request, so the radix cache does not help) and generates NEW_TOKENS tokens, greedy, EOS
# ignored. The time is the whole command (model load included; a tiny fixture loads in ms).
# Usage: bench/runtime_throughput.sh MOESERVE_BIN MODEL_DIR [N...]
set -euo pipefail
bin=$1 model=$2
shift 2
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(1 64)
prompt_len=${PROMPT_LEN:-32} new_tokens=${NEW_TOKENS:-128}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in "${counts[@]}"; do
  python3 - "$n" "$prompt_len" "$new_tokens" > "$tmp/in.jsonl" <<'PY'
import json, sys
n, plen, new = map(int, sys.argv[1:])
for r in range(n):
    ids = [(7 + r * 131 + i * 17) % 1000 + 2 for i in range(plen)]
    print(json.dumps({"input_ids": ids, "max_new_tokens": new, "temperature": 0, "ignore_eos": True}))
PY
  start=$(date +%s.%N)
  "$bin" generate --model-path "$model" --input-file "$tmp/in.jsonl" --max-total-tokens $((n * (prompt_len + new_tokens))) \
    --max-running-requests "$n" > "$tmp/out.jsonl"
  end=$(date +%s.%N)
  python3 - "$n" "$new_tokens" "$start" "$end" "$tmp/out.jsonl" <<'PY'
import json, sys
n, new, start, end, out = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
tokens = sum(len(json.loads(l)["output_ids"]) for l in open(out))
assert tokens == n * new, (tokens, n * new)
print(f"requests {n:3d}  output tokens {tokens:6d}  time {end - start:7.2f} s  {tokens / (end - start):8.1f} tok/s")
PY
done
