#!/bin/bash
# Session 41's device calls (bench/BENCHMARKS.md, "Session 41"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# The V3 EP8 shard (FP8 blocks, 32 experts) of $2 layers as /tmp/$1.
v3_model() { model $1 deepseek-v3 $2 --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; }
# The opcode mix of the kernels in build $1's object $3.cu.o (grouped_gemm_fp8: the mma.sync kernels) by
# cuobjdump, tag $2, as $L/sass-$2.txt.
sass_mix() {
  local o; o=$(find $1/ -name "${3:-grouped_gemm_fp8}.cu.o" | head -1)
  PATH=$PATH:/usr/local/cuda/bin cuobjdump -sass $o > $L/sass-$2.sass 2>&1
  python3 - $L/sass-$2.sass > $L/sass-$2.txt <<'PY'
import re, sys, collections
fn, mix = None, collections.OrderedDict()
for line in open(sys.argv[1]):
    m = re.match(r'\s+Function : (\S+)', line)
    if m: fn = m.group(1); mix[fn] = collections.Counter(); continue
    m = re.match(r'\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)', line)
    if m and fn: mix[fn][m.group(2)] += 1
for fn, c in mix.items():
    if 'kernel' not in fn: continue
    print(fn, sum(c.values()), ' '.join(f'{k}:{v}' for k, v in c.most_common(14)))
PY
  log "sass $2: $(cut -c1-400 $L/sass-$2.txt | tr '\n' '|')"
}

# PHASE=1: $SRC (the FP8 products converting codes unscaled and scaling their f32 sums: the streaming
#   product and the grouped mma.sync kernel) against $BEFORE_SRC (the session's starting tree): the changed
#   products' tests first, the grouped FP8 bench both ways (V3's EP8 experts at 64 and 256 tokens, the dense
#   FP8 linears), greedy ids of the V3 shard both ways, B = 1, 16, 64 of the shard at L = 2 and 5 (a layer =
#   (t5 - t2) / 3) in rotated rounds, then every other GPU test program in the time left.
if [ $PHASE = 1 ]; then
  [ -e $BEFORE_SRC/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $BEFORE_SRC/tests/fixtures
  mkdir -p .b4/before; ln -sfn $ROOT/.b4/before /tmp/before
  (configure_tree $BEFORE_SRC /tmp/before && cmake --build /tmp/before -j4 --target moeserve test_cuda_grouped_gemm_fp8) \
    > $L/build-before.log 2>&1 &
  JOBS=12 build_after ms_kernel_trace ms_cuda_ceilings $(gpu_tests_of $SRC)
  v3_model v3-2 2 & v3_model v3-5 5 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_grouped_gemm_fp8
  wait
  sass_mix /tmp/b mma-after; sass_mix /tmp/before mma-before; sass_mix /tmp/b gemv-after gemv
  for s in after before; do
    bin=/tmp/b/tests/test_cuda_grouped_gemm_fp8; [ $s = before ] && bin=/tmp/before/tests/test_cuda_grouped_gemm_fp8
    MOESERVE_BENCH_FP8_GROUPED=1 MOESERVE_BENCH_FP8_TOKENS=64,256 gtest fp8-bench-$s 120 $bin --gtest_filter='*FP8GroupedBench'
  done
  gen_ids v3-2 - v3-after; B=/tmp/before/moeserve gen_ids v3-2 - v3-before
  cmp -s $L/gen-v3-after.txt $L/gen-v3-before.txt && log "generate v3 ids equal" || log "generate v3 ids DIFFER"
  for r in 0 1; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "16 4096 16" "64 1536 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "16 4096 16" "64 1536 16"
  done
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_ops test_cuda_moe_one_token test_cuda_mla_absorb test_cuda_engine_graphs \
    $(gpu_tests_of $SRC)
  log done
fi

# PHASE=2: the final tree ($SRC: the first call's with the streaming product's last-chunk scale fixed) against
#   $BEFORE_SRC (the session's starting tree): the changed products' tests, then every GPU test program; the V3
#   shard's figures both ways (B = 1 and 16 at 4096 keys with the 4096-token prefill, 64 and 128 at 1536, 256
#   at 128; L = 2 and 5) in rotated rounds; greedy ids of the shard; Qwen3 and V2-Lite at B = 1.
if [ $PHASE = 2 ]; then
  build_before 4
  JOBS=12 build_after ms_cuda_ceilings $(gpu_tests_of $SRC)
  v3_model v3-2 2 & v3_model v3-5 5 & model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_grouped_gemm_fp8 test_cuda_grouped_gemm test_cuda_merge_project \
    test_cuda_mla_decode_wgmma test_cuda_mla_prefill test_cuda_moe_combine_norm test_cuda_moe_prefill test_cuda_moe_route \
    test_cuda_sampling test_cuda_fixtures
  wait
  gen_ids v3-2 - v3-after; B=/tmp/before/moeserve gen_ids v3-2 - v3-before
  for r in 0 1; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "16 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "16 4096 16" "64 1536 16" "128 1536 16" "256 128 16"
  done
  SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  log done
fi

# PHASE=3: the final tree ($SRC) against $BEFORE_SRC (the session's start): the three test programs the
#   second call's time did not reach (mla_absorb, moe_one_token, ops), Qwen3 and V2-Lite at B = 1 (4096 keys,
#   three rounds, the final tree), and more rotated rounds of the V3 shard at B = 1, 16 and 64 (L = 2 and 5).
if [ $PHASE = 3 ]; then
  build_before 4
  JOBS=12 build_after test_cuda_mla_absorb test_cuda_moe_one_token test_cuda_ops
  v3_model v3-2 2 & v3_model v3-5 5 & model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_mla_absorb test_cuda_moe_one_token test_cuda_ops
  wait
  for r in 0 1 2; do SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"; done
  for r in 0 1 2; do
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-5 "1 4096 16" "16 4096 16" "64 1536 16"
    SIDES="$(SIDES="after before" rotated $r)" bench_sides v3-2 "1 4096 16" "16 4096 16" "64 1536 16"
  done
  log done
fi
