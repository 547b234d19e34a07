#!/usr/bin/env bash
# On the GPU machine (the device tool), with a built moeserve in $BIN and logs under $OUT:
# per-layer decode and prefill time of the DeepSeek-V3 shape with FP8 block weights (issue 9),
# from pairs of random checkpoints that differ only in their number of MoE layers, so the
# embedding, the dense first layer and the lm head cancel out:
#   full  — the published width: hidden 7168, 256 experts top-8, MLA with 128 heads;
#   ep8   — the same layer with the 32 experts one GPU of EP8 holds (--set n_routed_experts=32):
#           top-8 over 32 experts puts 8·B expert-token pairs on 32 experts, exactly the load one
#           GPU receives when 8 GPUs with B sequences each dispatch to it, so its step time at a
#           per-GPU batch B is that GPU's compute under DP attention + EP8 (the all-to-all is not
#           in it; it is added on paper in BENCHMARKS.md).
# The MTP layer is left out (num_nextn_predict_layers=0): it is not part of a decode step.
#   BIN=/tmp/b bench/cuda_v3_layers.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}
M=/tmp/v3
run_pair() {  # label, layer counts "A B", extra make-random-model flags...
  local label=$1 counts=$2; shift 2
  for L in $counts; do
    rm -rf $M && "$BIN/moeserve" make-random-model --shape deepseek-v3 --fp8 --layers $L \
      --set num_nextn_predict_layers=0 "$@" $M 2>> "$OUT/v3.log" || { echo "make $label $L failed"; return 1; }
    cp $M/config.json "$OUT/config-$label-$L.json"
    for bi in "1 4096" "64 512" "256 128"; do
      read -r B I <<< "$bi"
      echo "== $label layers=$L B=$B I=$I" >> "$OUT/v3.log"
      timeout 240 "$BIN/moeserve" bench-one-batch --model-path $M --device cuda --batch-size $B --input-len $I \
        --output-len 16 --result-file "$OUT/v3-$label-$L.jsonl" >> "$OUT/v3.log" 2>&1 || echo "bench $label L=$L B=$B rc=$?"
    done
  done
  rm -rf $M
}
run_pair ep8 "2 5" --set n_routed_experts=32
run_pair full "2 3"
