#!/usr/bin/env bash
# Session 5, one GPU call (nvidia-h200): the weight-streaming product with its inputs loaded with
# the weights and with programmatic dependent launch, on its own: builds $SRC (a `git archive`),
# runs the GPU tests that go through it (ops, fixtures, engine graphs) with PDL on and off, and
# bench-one-batch of the 12-layer Qwen3-30B-A3B and 9-layer DeepSeek-V2-Lite shapes at B = 1 (4k)
# and B = 64 (256) with PDL on and off, then Nsight Compute on Qwen3 B = 1 (gemv kernels only).
#   SRC=.devsrc-s5a bash bench/session5_gemv_probe.sh      (carry [".deps", "$SRC"])
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-s5a} L=/tmp/logs
mkdir -p $L .b4/probe .b4/models && ln -sfn $ROOT/.b4/probe /tmp/b
B=/tmp/b/moeserve
[ -e $SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $SRC/tests/fixtures
TESTS="test_cuda_ops test_cuda_fixtures test_cuda_engine_graphs"
(configure_tree $SRC /tmp/b && cmake --build /tmp/b -j16 --target moeserve $TESTS) > $L/build.log 2>&1 ||
  { tail -30 $L/build.log; log "build failed"; exit 1; }
log built
run_gpu_tests /tmp/b $TESTS
mkdir -p $L/nopdl && L0=$L && L=$L/nopdl && export MOESERVE_PDL=0 && log "--- MOESERVE_PDL=0"
run_gpu_tests /tmp/b $TESTS
unset MOESERVE_PDL; L=$L0
for m in "qwen3 qwen3-30b-a3b 12" "v2lite deepseek-v2-lite 9"; do
  read -r name shape layers <<< "$m"
  [ -e .b4/models/$name/config.json ] || timeout 150 $B make-random-model --shape $shape --layers $layers .b4/models/$name > /dev/null 2>&1
  for run in "1 4096 16" "64 256 16"; do
    read -r b i o <<< "$run"
    for pdl in 1 0; do
      MOESERVE_PDL=$pdl timeout 120 $B bench-one-batch --model-path .b4/models/$name --device cuda --batch-size $b \
        --input-len $i --output-len $o --result-file "$OUT/bench-pdl$pdl.jsonl" > $L/bench-$name-$b-$pdl.log 2>&1
      log "$name B=$b I=$i PDL=$pdl rc=$? $(grep -E 'Decode\.  median' $L/bench-$name-$b-$pdl.log | tail -1)"
    done
  done
done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
timeout 90 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file $OUT/ncu-qwen3-b1.csv \
  $B bench-one-batch --model-path .b4/models/qwen3 --device cuda --batch-size 1 --input-len 4096 --output-len 4 \
  --disable-cuda-graph > /dev/null 2>&1; log "ncu rc=$?"
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
log done
