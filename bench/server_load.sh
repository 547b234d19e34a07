#!/usr/bin/env bash
# The server load test: CLIENTS concurrent streaming chat clients (official openai npm client),
# TOKENS tokens each, two rounds, on the demo model; prints req/s, TTFT and ITL per round and the
# server's RSS after each round (bench/BENCHMARKS.md records the result).
#   bench/server_load.sh [BIN] [CLIENTS] [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:-build/moeserve} CLIENTS=${2:-256} TOKENS=${3:-64}
node tests/e2e/server_e2e.mjs "$BIN" load "$CLIENTS" "$TOKENS"
