#!/usr/bin/env bash
# Speculative decoding under CUDA graphs (issue 11: the target's verify steps and the MTP draft's
# chain steps replayed, graphs allocating from their private pool), on the GPU machine (device
# tool, nvidia-h200), from the repository root. Builds the snapshot $SRC (`git archive HEAD`),
# writes a DeepSeek-V3-shape random checkpoint meanwhile (FP8, full width, 2 layers, no MTP
# layer), runs every single-GPU test, then `generate` with 1..4 MTP draft steps on a batch of
# three prompts against the plain run (deepseek-v3-tiny), once under compute-sanitizer, and
# bench-speculative with the replay draft at batch 1 and 2. $OUT gets summary.log and logs.tgz.
#   SRC=.devsrc-spec bash bench/cuda_spec_graphs_run.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-spec} L=/tmp/logs B=/tmp/b/moeserve
mkdir -p $L
build_trees $SRC
($B make-random-model --shape deepseek-v3 --fp8 --layers 2 --set num_nextn_predict_layers=0 /tmp/v3 > $L/make.log 2>&1 &&
  touch /tmp/v3.done) &
run_gpu_tests /tmp/b test_cuda_engine_graphs test_cuda_graphs $TESTS
spec_vs_plain $B
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 150 $SAN --tool memcheck --print-limit 5 --log-file $L/sanitizer.log $GEN --speculative-algorithm NEXTN \
  --speculative-num-steps 3 --cuda-graph-max-bs 4 > /tmp/san.txt 2> $L/sanitizer.err
log "compute-sanitizer steps=3 rc=$? $(grep -E 'ERROR SUMMARY' $L/sanitizer.log | head -1); ids $(cmp -s /tmp/plain.txt /tmp/san.txt && echo equal || echo DIFFER)"
for i in $(seq 120); do [ -e /tmp/v3.done ] && break; sleep 1; done
log "v3 model: $(du -sh /tmp/v3 2>&1 | cut -f1) $(tail -1 $L/make.log)"
spec() {  # batch [flags]
  local b=$1; shift
  echo "== bench-speculative B=$b $*" >> $L/bench.log
  timeout 120 $B bench-speculative --device cuda --model-path /tmp/v3 --batch-size "$b" --input-len 128 \
    --output-len 48 --speculative-num-steps 3 --result-file "$OUT/spec.jsonl" "$@" >> $L/bench.log 2>&1
  log "bench-speculative B=$b $* rc=$?"
}
[ -e /tmp/v3.done ] && { spec 1 --error-rates 0,0.2,0.5,1; spec 2 --error-rates 0,0.2,0.5,1; }
grep -v '^\s*$' $L/bench.log | grep -E -i '==|speed|accept|tok/s|plain|error' | head -60 >> "$OUT/summary.log"
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
log done
