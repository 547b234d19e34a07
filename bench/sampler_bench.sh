#!/usr/bin/env bash
# Builds and runs bench/sampler_bench.cpp against the libraries of CPU build $1; with $2, against
# that sampler.cpp instead of the build's (e.g. `git show REV:src/runtime/sampler.cpp > old.cpp`).
set -euo pipefail
build=$1 src=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
extra=()
[ -n "$src" ] && extra=("$src")
g++ -O2 -std=c++20 -pthread -I"$root/src" "$root/bench/sampler_bench.cpp" "${extra[@]}" \
  "$build/libms_runtime.a" "$build/libms_kernels.a" "$build/libms_core.a" -o /tmp/ms_sampler_bench
MOESERVE_THREADS=${MOESERVE_THREADS:-2} /tmp/ms_sampler_bench
