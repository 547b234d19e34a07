#!/usr/bin/env bash
# The session's last GPU call (device tool, nvidia-h200-x2), from the repository root; logs under
# $OUT (summary.log plus one tarball of every log). In parallel: the committed tree (SRC, a `git
# archive HEAD`) builds while GPU 0 runs the issue-9 kernels' before/after bench-one-batch from the
# prebuilt bundle (.kernbin, bench/cuda_kernels_before_after.sh). Then every GPU test of the
# committed tree (the single-GPU suites on GPU 1 while the bundle still runs, then the two-GPU
# ones), then `serve` on one GPU, --tp 2 and --tp 2 --dp 2 --enable-dp-attention --ep-size 2 under
# the same bench-serving load (bench/cuda_serving_parallel.sh).
#   SRC=.devsrc-final bench/final_x2_run.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-final} L=/tmp/logs
mkdir -p $L
[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
(CUDA_VISIBLE_DEVICES=0 OUT=$L SKIP_TESTS=1 SKIP_NCU=1 bash bench/cuda_kernels_before_after.sh .kernbin/bins.tar.xz \
  /work/main/.devsrc-kern > $L/before_after.out 2>&1) &
BA=$!
cmake -S $SRC -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > $L/build.log 2>&1 &&
  cmake --build /tmp/b -j30 --target moeserve $(cd $SRC/tests/kernels && ls test_*.cpp | sed 's/\.cpp$//') >> $L/build.log 2>&1 ||
  { tail -30 $L/build.log; log "build failed"; }
log "built $(ls /tmp/b/tests | tr '\n' ' ')"
for t in /tmp/b/tests/test_cuda_*; do
  n=$(basename $t)
  [ $n = test_cuda_parallel ] && continue
  CUDA_VISIBLE_DEVICES=1 timeout 200 $t > $L/$n.log 2>&1
  log "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $L/$n.log | tr '\n' ' ')"
  grep -E '^\[  FAILED' $L/$n.log | head -5 >> "$OUT/summary.log"
done
wait $BA
log "before/after done: $(grep -c . $L/summary.log 2>/dev/null) lines"
cat $L/summary.log >> "$OUT/summary.log" 2>/dev/null
for t in test_nccl_comm test_cuda_parallel; do
  [ -x /tmp/b/tests/$t ] || continue
  timeout 200 /tmp/b/tests/$t > $L/$t.log 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED' $L/$t.log | head -5 >> "$OUT/summary.log"
done
OUT=$L BIN=/tmp/b QL=${QL:-12} bash bench/cuda_serving_parallel.sh
grep -E "generate|rc=|Output token throughput|Request throughput|Mean TTFT|Mean ITL|Successful" $L/serving.log >> "$OUT/summary.log"
cp $L/serving.jsonl $L/bench-*.jsonl $L/*config.json "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
log done
