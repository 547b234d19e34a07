#!/usr/bin/env bash
# Output tokens/s of `moeserve generate --input-file` for N concurrent requests (default 1
# and 64) on one checkpoint: every request has a PROMPT_LEN-token prompt (different per
# request, so the radix cache does not help) and generates NEW_TOKENS tokens, greedy, EOS
# ignored. The time is the whole command (model load included; a tiny fixture loads in ms),
# the best of REPEAT runs (default 5), since a shared machine adds noise, never speed.
# Usage: [PROMPT_LEN=32] [NEW_TOKENS=128] [REPEAT=5] [DEVICE=cpu|cuda] bench/runtime_throughput.sh MOESERVE_BIN MODEL_DIR [N...]
set -euo pipefail
bin=$1 model=$2
shift 2
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(1 64)
prompt_len=${PROMPT_LEN:-32} new_tokens=${NEW_TOKENS:-128} repeat=${REPEAT:-5}
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
  times=()
  for _ in $(seq "$repeat"); do
    start=$(date +%s.%N)
    "$bin" generate --model-path "$model" --input-file "$tmp/in.jsonl" --max-total-tokens $((n * (prompt_len + new_tokens))) \
      --max-running-requests "$n" --device "${DEVICE:-cpu}" > "$tmp/out.jsonl"
    end=$(date +%s.%N)
    times+=("$(python3 -c "print($end - $start)")")
  done
  python3 - "$n" "$new_tokens" "$tmp/out.jsonl" "${times[@]}" <<'PY'
import json, sys
n, new, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
best = min(map(float, sys.argv[4:]))
tokens = sum(len(json.loads(l)["output_ids"]) for l in open(out))
assert tokens == n * new, (tokens, n * new)
print(f"requests {n:3d}  output tokens {tokens:6d}  best of {len(sys.argv) - 4}: {best:6.3f} s  {tokens / best:8.1f} tok/s")
PY
done
