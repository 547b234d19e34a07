#!/usr/bin/env bash
# The session's last GPU call (device tool, nvidia-h200-x2), from the repository root; logs under
# $OUT (summary.log plus one tarball of every log). In parallel: the committed tree (SRC, a `git
# archive HEAD`) builds while GPU 0 runs the issue-9 kernels' before/after bench-one-batch from the
# prebuilt bundle (.kernbin, bench/cuda_kernels_before_after.sh) and GPU 1 the DeepSeek-V3 per-layer
# times with the bundle's binary (bench/cuda_v3_layers.sh). Then every GPU test of the committed
# tree (single-GPU suites on GPU 0, then the two-GPU ones), speculative decoding on one and two
# GPUs, then `serve` on one GPU, --tp 2 and --tp 2 --dp 2 --enable-dp-attention --ep-size 2 under
# the same bench-serving load (bench/cuda_serving_parallel.sh).
#   SRC=.devsrc-final bench/final_x2_run.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-final} L=/tmp/logs
mkdir -p $L
[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1
(CUDA_VISIBLE_DEVICES=0 OUT=$L SKIP_TESTS=1 SKIP_NCU=1 timeout 240 bash bench/cuda_kernels_before_after.sh \
  .kernbin/bins.tar.xz /work/main/.devsrc-kern > $L/before_after.out 2>&1) &
BA=$!
# GPU 1 meanwhile: DeepSeek-V3 per-layer times (bench/cuda_v3_layers.sh) with the bundle's binary.
(for i in $(seq 60); do [ -x /tmp/kb/after/moeserve ] && break; sleep 1; done; CUDA_VISIBLE_DEVICES=1 OUT=$L BIN=/tmp/kb/after LD_LIBRARY_PATH=/tmp/kb/lib:$LD_LIBRARY_PATH \
  timeout 250 bash bench/cuda_v3_layers.sh > $L/v3.out 2>&1) &
V3=$!
cmake -S $SRC -B /tmp/b -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_PREFIX_PATH=$ROOT/.deps/usr -DCMAKE_LIBRARY_PATH=$ROOT/.deps/usr/lib/x86_64-linux-gnu > $L/build.log 2>&1 &&
  cmake --build /tmp/b -j30 --target moeserve $(cd $SRC/tests/kernels && ls test_*.cpp | sed 's/\.cpp$//') >> $L/build.log 2>&1 ||
  { tail -30 $L/build.log; log "build failed"; }
log "built $(ls /tmp/b/tests | tr '\n' ' ')"
wait $BA
log "before/after done"
cat $L/summary.log >> "$OUT/summary.log" 2>/dev/null
for t in /tmp/b/tests/test_cuda_*; do
  n=$(basename $t)
  [ $n = test_cuda_parallel ] && continue
  CUDA_VISIBLE_DEVICES=0 timeout 200 $t > $L/$n.log 2>&1
  log "$n rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $L/$n.log | tr '\n' ' ')"
  grep -E '^\[  FAILED' $L/$n.log | head -5 >> "$OUT/summary.log"
done
wait $V3
log "v3 layers done: $(ls $L/v3-*.jsonl 2>/dev/null | tr '\n' ' ') $(grep -E 'rc=|failed' $L/v3.out | head -5 | tr '\n' ' ')"
for t in test_nccl_comm test_cuda_parallel; do
  [ -x /tmp/b/tests/$t ] || continue
  timeout 200 /tmp/b/tests/$t > $L/$t.log 2>&1
  log "$t rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' $L/$t.log | tr '\n' ' ')"
  grep -E '^\[  FAILED' $L/$t.log | head -5 >> "$OUT/summary.log"
done
# Speculative decoding on the GPU: 1..4 MTP draft steps, a batch of three prompts, on one GPU and
# on two GPUs with DP attention + EP, each against the plain run of the same configuration.
B=/tmp/b/moeserve
printf '%s\n' '{"input_ids":[5,17,3,99,410,7],"max_new_tokens":32,"ignore_eos":true}' \
  '{"input_ids":[11,12,13],"max_new_tokens":24,"ignore_eos":true}' \
  '{"input_ids":[1,2,3,4,5,6,7,8,9,10,11,12],"max_new_tokens":20,"ignore_eos":true}' > /tmp/p.jsonl
for F in deepseek-v3-tiny; do  # the fixture with an MTP layer
  for par in "" "--tp 2 --dp 2 --enable-dp-attention --ep-size 2"; do
    $B generate --device cuda --model-path tests/fixtures/$F --max-total-tokens 4096 --input-file /tmp/p.jsonl $par \
      > /tmp/plain.txt 2> $L/plain_$F.err
    log "plain $F ${par:-one GPU}: $(cut -c1-80 /tmp/plain.txt | tr '\n' ' ')"
    for n in 1 2 3 4; do
      timeout 60 $B generate --device cuda --model-path tests/fixtures/$F --max-total-tokens 4096 --input-file /tmp/p.jsonl \
        --speculative-algorithm NEXTN --speculative-num-steps $n $par > /tmp/spec.txt 2> $L/spec_${F}_$n.err
      rc=$?; cmp -s /tmp/plain.txt /tmp/spec.txt && same=equal || same=DIFFER
      log "speculative $F steps=$n ${par:-one GPU} rc=$rc ids $same plain; $(grep -o 'accept[^,]*' $L/spec_${F}_$n.err | head -1)"
    done
  done
done
OUT=$L BIN=/tmp/b QL=${QL:-6} timeout 170 bash bench/cuda_serving_parallel.sh
grep -E "generate|rc=|Output token throughput|Request throughput|Mean TTFT|Mean ITL|Successful" $L/serving.log >> "$OUT/summary.log"
cat $L/v3-*.jsonl > $L/v3-all.jsonl 2>/dev/null
cp $L/serving.jsonl $L/bench-*.jsonl $L/v3-all.jsonl "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
log done
