#!/usr/bin/env bash
# Session 5's last GPU call: the GPU sampler as committed last ($SRC = `git archive HEAD`), its tests,
# compute-sanitizer racecheck/synccheck on its edge rows, and its timing.
#   SRC=.devsrc-s5c bash bench/session5_sampling_check.sh     (carry [".deps", "$SRC"])
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
# Its own log and build directories: a warm machine keeps earlier calls' (run_gpu_tests skips a
# test whose log exists; a build directory is tied to its source tree).
SRC=${SRC:-.devsrc-s5c} L=/tmp/logs-sampling
mkdir -p $L && ln -sfn "$ROOT/tests/fixtures" $SRC/tests/fixtures
T="test_cuda_sampling test_cuda_engine_graphs"
(configure_tree $SRC /tmp/b-sampling && cmake --build /tmp/b-sampling -j16 --target moeserve $T) > $L/build.log 2>&1 ||
  { tail -30 $L/build.log; log "build failed"; exit 1; }
log built
run_gpu_tests /tmp/b-sampling $T
grep '\[sampling\]' $L/test_cuda_sampling.log | head -5 >> $OUT/summary.log
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer | head -1)
for tool in racecheck synccheck; do
  timeout 60 $SAN --tool $tool --print-limit 5 /tmp/b-sampling/tests/test_cuda_sampling --gtest_filter=CudaSampling.EdgeRows > $L/$tool.log 2>&1
  log "$tool rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED|HAZARD' $L/$tool.log | head -3 | tr '\n' ' ')"
done
MOESERVE_BENCH_SAMPLING=1 timeout 60 /tmp/b-sampling/tests/test_cuda_sampling --gtest_filter=CudaSampling.SamplingBench 2>&1 | grep '\[bench\]' >> $OUT/summary.log
tar czf $OUT/logs.tgz -C $L . ; log done
