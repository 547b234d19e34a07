#!/usr/bin/env bash
# The session's last GPU call (device tool, nvidia-h200), from the repository root: the committed
# tree ($SRC, a `git archive HEAD`) and the tree before this session's kernels ($BEFORE_SRC) build
# side by side; every single-GPU test of the committed tree; speculative `generate` with 1..4 MTP
# draft steps against the plain run (deepseek-v3-tiny, three prompts, CUDA graphs) and once under
# compute-sanitizer; then bench-one-batch before/after on the Qwen3-30B-A3B (12 layers) and
# DeepSeek-V2-Lite (9 layers) shapes (decode B = 1 at 4k, B = 8 at 1k, B = 64 at 256, prefill of
# 8k; CUDA graphs on) and Nsight Compute's per-kernel times of the after binary's Qwen3 B = 1 step.
# $OUT gets summary.log, bench-{before,after}.jsonl, ceilings.json, ncu-qwen3-b1.csv, logs.tgz.
#   SRC=.devsrc-final BEFORE_SRC=.devsrc-before bash bench/session_final_run.sh
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
SRC=${SRC:-.devsrc-final} BEFORE_SRC=${BEFORE_SRC:-.devsrc-before} L=/tmp/logs
mkdir -p $L
build_trees $SRC $BEFORE_SRC
B=/tmp/b/moeserve
run_gpu_tests /tmp/b $TESTS
spec_vs_plain $B
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
timeout 150 $SAN --tool memcheck --print-limit 5 --log-file $L/sanitizer.log $GEN --speculative-algorithm NEXTN \
  --speculative-num-steps 3 --cuda-graph-max-bs 4 > /tmp/san.txt 2> $L/sanitizer.err
log "compute-sanitizer memcheck, speculative steps=3 under graphs: rc=$? $(grep -E 'ERROR SUMMARY' $L/sanitizer.log | head -1); ids $(cmp -s /tmp/plain.txt /tmp/san.txt && echo equal || echo DIFFER)"
timeout 60 /tmp/b/ms_cuda_ceilings > $OUT/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $OUT/ceilings.json)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for m in qwen3:qwen3-30b-a3b:12 v2lite:deepseek-v2-lite:9; do
  IFS=: read -r name shape layers <<< "$m"
  timeout 120 $B make-random-model --shape $shape --layers $layers /tmp/$name > /dev/null 2>&1
  cp /tmp/$name/config.json "$OUT/$name-config.json"
  bench_before_after $name "1 4096 16" "8 1024 16" "64 256 16" "1 8192 2"
  [ $name = qwen3 ] && { timeout 100 "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
      --log-file $OUT/ncu-qwen3-b1.csv $B bench-one-batch --model-path /tmp/qwen3 --device cuda \
      --batch-size 1 --input-len 4096 --output-len 4 --disable-cuda-graph > /dev/null 2>&1; log "ncu qwen3 B=1 rc=$?"; }
  rm -rf /tmp/$name
done
tar czf "$OUT/logs.tgz" -C $L . 2>/dev/null
log done
