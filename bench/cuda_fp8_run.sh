#!/usr/bin/env bash
# On the GPU machine (the device tool), from the repository root, logs under $OUT: builds the
# committed tree given as $1 (a `git archive HEAD`, default .devsrc-fp8), runs the FP8 GEMM test
# and its benchmark first, then the GPU suites the FP8 paths touch (fixtures, ops, MoE, graphs;
# ops and MoE check FP8 weights in both modes, the fixtures in the default one).
set -uo pipefail
SRC=${1:-.devsrc-fp8}
source "$(dirname "$0")/device_env.sh"
[ -e "$SRC/tests/fixtures" ] || ln -s "$ROOT/tests/fixtures" "$SRC/tests/fixtures"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
cmake -S "$SRC" -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > "$OUT/build.log" 2>&1 &&
  cmake --build /tmp/b -j16 --target test_cuda_fp8_gemm ms_fp8_gemm_bench test_cuda_fixtures test_cuda_ops \
    test_cuda_attention_moe test_cuda_graphs >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
log "built"
run_test() {
  timeout "$2" /tmp/b/tests/$1 > "$OUT/$1.log" 2>&1
  log "$1 rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$OUT/$1.log" | tr '\n' ' ')"
}
run_test test_cuda_fp8_gemm 120
grep -E '^\[ fp8 \]|Failure|error' "$OUT/test_cuda_fp8_gemm.log" | head -40 | tee -a "$OUT/summary.log"
timeout 90 /tmp/b/ms_fp8_gemm_bench > "$OUT/bench.log" 2>&1
log "ms_fp8_gemm_bench rc=$?"
grep -v '^{' "$OUT/bench.log" | tee -a "$OUT/summary.log"
run_test test_cuda_fixtures 200
grep -E 'fixture \] deepseek-v3-fp8' "$OUT/test_cuda_fixtures.log" | tee -a "$OUT/summary.log"
for t in test_cuda_ops test_cuda_attention_moe test_cuda_graphs; do run_test $t 120; done
grep -E -B2 -A6 'Failure' "$OUT"/test_cuda_*.log | head -60
