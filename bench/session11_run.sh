#!/bin/bash
# Session 11's device calls (bench/BENCHMARKS.md, "Session 11"), run from the repository root on
# the GPU machine: PHASE picks the call. Sources are snapshots (git archive) carried as $SRC,
# $BEFORE_SRC and $THIRD_SRC; everything lands in $L and $OUT/summary.log.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
# The other trees from $SRC itself (the carry is limited): PATCHES "dir:patch,..." each reverse-applied.
for w in ${PATCHES:-}; do
  d=${w%%:*}; [ -e $d ] && continue; cp -r $SRC $d
  for p in $(echo ${w#*:} | tr ',' ' '); do (cd $d && patch -R -p1 -s < $ROOT/$SRC/$p) || log "patch $p into $d failed"; done
done
for s in ${SRC} ${BEFORE_SRC:-} ${THIRD_SRC:-}; do [ -e $s/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $s/tests/fixtures; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1

# Kernel timeline of /tmp/$1's graphed decode at B = $2, $3 keys, with binary $4 (label $5).
trace() {
  CUDA_INJECTION64_PATH=/tmp/b/libms_kernel_trace.so MS_KERNEL_TRACE=$L/kt-$5-$1-$2.tsv timeout 60 $4 bench-one-batch \
    --model-path /tmp/$1 --device cuda --batch-size $2 --input-len $3 --output-len 16 > $L/kt-$5-$1-$2.log 2>&1
  log "kernel trace $5 $1 B=$2 rc=$? $(grep -E 'Decode\.  median' $L/kt-$5-$1-$2.log) $(wc -l < $L/kt-$5-$1-$2.tsv) lines"
  python3 $SRC/bench/kernel_trace_summary.py $L/kt-$5-$1-$2.tsv --timeline 0 > $L/kts-$5-$1-$2.txt 2>&1
  grep -E '^graph|median replay' $L/kts-$5-$1-$2.txt | head -8 >> "$OUT/summary.log"
}

# PHASE=1: $BEFORE_SRC (main at the session's start) against $THIRD_SRC (forward activations
#   unfilled: no memset nodes in the step) and $SRC (that and the pending early-launched norms):
#   the GPU tests of $SRC that the change touches, kernel timelines, bench-one-batch of each.
if [ $PHASE = 1 ]; then
  build_before 3
  mkdir -p .b4/third
  (configure_tree $THIRD_SRC .b4/third && cmake --build .b4/third -j3 --target moeserve) > $L/build-third.log 2>&1 &
  JOBS=10 build_after ms_kernel_trace test_cuda_fixtures test_cuda_engine_graphs test_cuda_fused test_cuda_moe_combine_norm \
    test_cuda_attention_moe test_cuda_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  wait
  ln -sfn $ROOT/.b4/third /tmp/unfilled
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  [ -x /tmp/unfilled/moeserve ] || { tail -20 $L/build-third.log; log "third build failed"; }
  trace qwen3 1 4096 $B all; trace v2lite 1 4096 $B all; trace qwen3 1 4096 /tmp/before/moeserve before
  SIDES="before unfilled all" bench_sides qwen3 "1 4096 16" "64 256 16" "1 8192 2"
  SIDES="before unfilled all" bench_sides v2lite "1 4096 16" "64 256 16" "1 8192 2"
  SIDES="all unfilled before" bench_sides qwen3 "1 4096 16"
  SIDES="all unfilled before" bench_sides v2lite "1 4096 16"
  for t in test_cuda_fixtures test_cuda_engine_graphs test_cuda_fused test_cuda_moe_combine_norm test_cuda_attention_moe \
    test_cuda_graphs; do [ $(left) -gt 30 ] && run_gpu_tests /tmp/b $t; done
  log done
fi
# PHASE=2: $SRC (the decode attention kernels merging their own splits, GQA's keys prefetched to
#   L2; gated MLPs in one product) against $BEFORE_SRC (the first call's "all" side): the GPU tests
#   these touch (also with PDL off), the attention bench, bench-one-batch B = 1 and 64, timelines.
if [ $PHASE = 2 ]; then
  build_before 4
  JOBS=11 build_after ms_cuda_ceilings ms_kernel_trace test_cuda_attention_moe test_cuda_mla_decode_wgmma test_cuda_graphs \
    test_cuda_engine_graphs test_cuda_fixtures test_cuda_gemv test_cuda_fused
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 60 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_mla_decode_wgmma test_cuda_graphs test_cuda_engine_graphs
  MOESERVE_PDL=0 gtest attn-nopdl 120 /tmp/b/tests/test_cuda_attention_moe
  MOESERVE_BENCH_ATTENTION=1 gtest attn-bench 120 /tmp/b/tests/test_cuda_attention_moe --gtest_filter=CudaOps.DecodeAttentionBench
  grep '\[bench\]' $L/attn-bench.log >> "$OUT/summary.log"
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before after" bench_sides qwen3 "1 4096 16" "64 256 16"
  SIDES="before after" bench_sides v2lite "1 4096 16" "64 256 16"
  SIDES="after before" bench_sides qwen3 "1 4096 16"
  SIDES="after before" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 $B after; trace v2lite 1 4096 $B after
  for t in test_cuda_fixtures test_cuda_gemv test_cuda_fused; do [ $(left) -gt 30 ] && run_gpu_tests /tmp/b $t; done
  log done
fi
# PHASE=3: $SRC (the router product over many blocks, its parts summed by the last one; the
#   ceilings' shared-memory switch cost) against $BEFORE_SRC (main before the router change).
if [ $PHASE = 3 ]; then
  build_before 4
  JOBS=11 build_after ms_cuda_ceilings ms_kernel_trace test_cuda_moe_route test_cuda_gemv test_cuda_attention_moe \
    test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 60 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_gemv test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs
  MOESERVE_BENCH_ROUTE=1 gtest route-bench 120 /tmp/b/tests/test_cuda_moe_route --gtest_filter=CudaMoeRoute.MoeRouteBench
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before after" bench_sides qwen3 "1 4096 16" "8 1024 16"
  SIDES="before after" bench_sides v2lite "1 4096 16" "8 1024 16"
  SIDES="after before" bench_sides qwen3 "1 4096 16"
  SIDES="after before" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 $B after; trace v2lite 1 4096 $B after
  log done
fi
# PHASE=4: the session's final tree $SRC (the experts' down product prefetching its weights before
#   its wait) against $BEFORE_SRC (the tree before that commit): the ceilings, every single-GPU test
#   program, bench-one-batch B = 1, 8, 64 both sides (B = 1 again reversed), the 8k prefills, kernel
#   timelines, and DeepSeek-V3's EP8 shard (L = 2 / 5) at B = 64, 128 (1536 keys) and 256 (128).
if [ $PHASE = 4 ]; then
  build_before 4
  TESTS=$(gpu_tests_of $SRC)
  JOBS=11 build_after ms_cuda_ceilings ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  (for l in 2 5; do model v3ep8-$l deepseek-v3 $l --fp8 --set num_nextn_predict_layers=0 --set n_routed_experts=32; done) &
  timeout 60 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  FIRST="test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route"
  for t in $FIRST $TESTS; do [ $(left) -gt 250 ] && run_gpu_tests /tmp/b $t; done
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before after" bench_sides qwen3 "1 4096 16" "8 1024 16" "64 256 16"
  SIDES="before after" bench_sides v2lite "1 4096 16" "8 1024 16" "64 256 16"
  SIDES="after before" bench_sides qwen3 "1 4096 16"
  SIDES="after before" bench_sides v2lite "1 4096 16"
  SIDES="after" bench_sides qwen3 "1 8192 2"
  SIDES="after" bench_sides v2lite "1 8192 2"
  trace qwen3 1 4096 $B after; trace v2lite 1 4096 $B after
  SIDES="after"
  for l in 2 5; do bench_sides v3ep8-$l "64 1536 16" "128 1536 16" "256 128 16"; done
  log done
fi
# PHASE=5: the final tree $SRC: the GPU test programs the fourth call's budget left unrun, then
#   bench-one-batch B = 1 of both models.
if [ $PHASE = 5 ]; then
  REST="test_cuda_moe_prefill test_cuda_moe_combine_norm test_cuda_ops test_cuda_grouped_gemm_fp8 test_cuda_mla_decode_wgmma test_cuda_mla_prefill test_cuda_sampling"
  JOBS=15 build_after $REST
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  for t in $REST; do [ $(left) -gt 50 ] && run_gpu_tests /tmp/b $t; done
  wait
  SIDES="after after" bench_sides qwen3 "1 4096 16"
  SIDES="after after" bench_sides v2lite "1 4096 16"
  log done
fi
