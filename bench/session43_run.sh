#!/bin/bash
# Session 43's device call (bench/BENCHMARKS.md, "Session 43"), run from the repository root of the
# working tree on the GPU machine: the FP8-activation shape of grouped_gemm_fp8 (MOESERVE_FP8_ACT8=1)
# against the default. The grouped FP8 test (the new shape against its host reference, the V3 EP8
# experts both ways), the fixtures with the switch on and off, then the V3 EP8 shard (L = 2 and 5; a
# layer = (t5 - t2) / 3) at B = 256 (128 keys), 128 and 64 (1536) and 1 (4096, with its 4096-token
# prefill), both sides in rotated rounds.
set -u
SRC=.
source bench/device_env.sh && snapshots_ready .
JOBS=14 build_after test_cuda_grouped_gemm_fp8 test_cuda_fixtures
v3_model v3-2 2 & v3_model v3-5 5 &
run_gpu_tests /tmp/b test_cuda_grouped_gemm_fp8
MOESERVE_FP8_ACT8=1 gtest fixtures-act8 200 /tmp/b/tests/test_cuda_fixtures
run_gpu_tests /tmp/b test_cuda_fixtures
wait
for r in 0 1; do
  for m in v3-2 v3-5; do
    SIDES="$(SIDES="default act8:MOESERVE_FP8_ACT8=1" rotated $r)" bench_sides $m "256 128 16" "128 1536 16" \
      "64 1536 16" "1 4096 16"
  done
done
log done
