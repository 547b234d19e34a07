#!/bin/bash
# Session 12's device calls (bench/BENCHMARKS.md, "Session 12"), run from the repository root on
# the GPU machine: PHASE picks the call. Sources are snapshots (git archive) carried as $SRC; other
# trees are made from it by PATCHES "dir:patch,..." (each reverse-applied) or, for STAMPS, by
# applying bench/gpu_pending.patch forward. Everything lands in $L and $OUT/summary.log.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
for w in ${PATCHES:-}; do
  d=${w%%:*}; [ -e $d ] && continue; cp -r $SRC $d
  for p in $(echo ${w#*:} | tr ',' ' '); do (cd $d && patch -R -p1 -s < $ROOT/$SRC/$p) || log "patch $p into $d failed"; done
done
for s in ${SRC} ${BEFORE_SRC:-}; do [ -e $s/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $s/tests/fixtures; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$OUT/summary.log" 2>&1

# Kernel timeline of /tmp/$1's graphed decode at B = $2, $3 keys, with binary $4 (label $5).
trace() {
  CUDA_INJECTION64_PATH=/tmp/b/libms_kernel_trace.so MS_KERNEL_TRACE=$L/kt-$5-$1-$2.tsv timeout 60 $4 bench-one-batch \
    --model-path /tmp/$1 --device cuda --batch-size $2 --input-len $3 --output-len 16 > $L/kt-$5-$1-$2.log 2>&1
  log "kernel trace $5 $1 B=$2 rc=$? $(grep -E 'Decode\.  median' $L/kt-$5-$1-$2.log) $(wc -l < $L/kt-$5-$1-$2.tsv) lines"
  python3 $SRC/bench/kernel_trace_summary.py $L/kt-$5-$1-$2.tsv --timeline 0 > $L/kts-$5-$1-$2.txt 2>&1
  grep -E '^graph|median replay' $L/kts-$5-$1-$2.txt | head -8 >> "$OUT/summary.log"
}

# PHASE=1: main as it stands ($SRC): the GPU tests of the commits no GPU has run (sampling, fixtures,
#   engine graphs), kernel timelines of both models at B = 1 (no copy or memset node expected),
#   bench-one-batch B = 1; and, in a second tree with bench/gpu_pending.patch, the decode kernel's
#   stamps (CudaOps.DecodeAttentionStamps) and that whole test program.
if [ $PHASE = 1 ]; then
  cp -r $SRC .devsrc-s && (cd .devsrc-s && patch -p1 -s < bench/gpu_pending.patch) || log "stamps patch failed"
  mkdir -p .b4/stamps
  (configure_tree .devsrc-s .b4/stamps && cmake --build .b4/stamps -j6 --target test_cuda_attention_moe) > $L/build-stamps.log 2>&1 &
  JOBS=10 build_after ms_kernel_trace test_cuda_sampling test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_sampling test_cuda_fixtures test_cuda_engine_graphs
  wait
  if [ -x .b4/stamps/tests/test_cuda_attention_moe ]; then
    MOESERVE_DECODE_STAMPS=1 gtest stamps 120 .b4/stamps/tests/test_cuda_attention_moe --gtest_filter=CudaOps.DecodeAttentionStamps
    MOESERVE_DECODE_STAMPS=1 gtest attn-stamped 200 .b4/stamps/tests/test_cuda_attention_moe
  else tail -20 $L/build-stamps.log >> "$OUT/summary.log"; log "stamps build failed"; fi
  trace qwen3 1 4096 $B main; trace v2lite 1 4096 $B main
  SIDES="main main" bench_sides qwen3 "1 4096 16"
  SIDES="main main" bench_sides v2lite "1 4096 16"
  log done
fi
# PHASE=2: $SRC (the attention merges trigger the product after them at entry, so that it
#   prefetches its weights while the attention runs) against $BEFORE_SRC (main before that):
#   the GPU tests it touches, bench-one-batch B = 1 both orders and B = 64, timelines.
if [ $PHASE = 2 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs \
    test_cuda_mla_decode_wgmma
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs test_cuda_mla_decode_wgmma
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  SIDES="before after" bench_sides qwen3 "1 4096 16" "64 256 16"
  SIDES="before after" bench_sides v2lite "1 4096 16" "64 256 16"
  SIDES="after before" bench_sides qwen3 "1 4096 16"
  SIDES="after before" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 $B after; trace v2lite 1 4096 $B after
  log done
fi
# PHASE=3: Nsight Compute on the graphed B = 1 decode of both models (main): per kernel of one step's
#   stretch, its time, DRAM and L2 throughput, L2 hit rate, occupancy and warp stall reasons.
if [ $PHASE = 3 ]; then
  JOBS=15 build_after
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  wait
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for m in qwen3 v2lite; do
    timeout $(( $(left) / 2 )) $NCU --clock-control none --target-processes all \
      -k regex:'gemv_kernel|flash_decode_kernel|combine_splits|route_kernel|rms_norm_rows_kernel|rope_store|flash_mla|nvjet' \
      --launch-skip 600 --launch-count 16 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --csv --page details \
      $B bench-one-batch --model-path /tmp/$m --device cuda --batch-size 1 --input-len 4096 --output-len 16 \
      > $L/ncu-$m.csv 2> $L/ncu-$m.err
    log "ncu $m rc=$? $(wc -l < $L/ncu-$m.csv) lines"; tail -3 $L/ncu-$m.err >> "$OUT/summary.log"
  done
  log done
fi
# PHASE=4: $SRC (main with the one-round product, helper-52's coalesced GQA decode, helper-54's
#   MLA absorptions) against .devsrc-r (main: the one-round product only) and $BEFORE_SRC (main
#   before it): the GPU tests of the new code, the attention and MLA benches, bench-one-batch,
#   timelines. A third tree: build_tree SRC DIR TARGETS (its moeserve as /tmp/<label>).
build_tree() {
  local src=$1 dir=$2; shift 2
  [ -e $src/tests/fixtures ] || ln -s "$ROOT/tests/fixtures" $src/tests/fixtures
  mkdir -p $dir; (configure_tree $src $dir && cmake --build $dir -j${JOBS_T:-4} --target moeserve "$@") > $L/build-$(basename $dir).log 2>&1
}
if [ $PHASE = 4 ]; then
  build_before 3
  build_tree .devsrc-r .b4/round test_cuda_attention_moe & 
  JOBS=9 build_after ms_kernel_trace test_cuda_attention_moe test_cuda_mla_absorb test_cuda_gemv test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_mla_decode_wgmma
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_mla_absorb test_cuda_gemv test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_mla_decode_wgmma
  MOESERVE_BENCH_MLA=1 gtest mla-bench 100 /tmp/b/tests/test_cuda_mla_absorb --gtest_filter=CudaMlaAbsorb.Bench
  MOESERVE_BENCH_ATTENTION=1 gtest attn-bench-all 100 /tmp/b/tests/test_cuda_attention_moe --gtest_filter=CudaOps.DecodeAttentionBench
  wait
  ln -sfn $ROOT/.b4/round /tmp/round
  [ -x /tmp/round/tests/test_cuda_attention_moe ] && MOESERVE_BENCH_ATTENTION=1 gtest attn-bench-round 100 \
    /tmp/round/tests/test_cuda_attention_moe --gtest_filter=CudaOps.DecodeAttentionBench
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  [ -x /tmp/round/moeserve ] || { tail -20 $L/build-round.log; log "round build failed"; }
  SIDES="before round all" bench_sides qwen3 "1 4096 16"
  SIDES="before round all all:MOESERVE_MLA_STREAM=0" bench_sides v2lite "1 4096 16"
  SIDES="all round before" bench_sides qwen3 "1 4096 16"
  SIDES="all:MOESERVE_MLA_STREAM=0 all round before" bench_sides v2lite "1 4096 16"
  SIDES="round all" bench_sides qwen3 "64 256 16"
  SIDES="round all" bench_sides v2lite "64 256 16"
  trace qwen3 1 4096 $B all; trace v2lite 1 4096 $B all
  log done
fi
# PHASE=5: the session's tree ($SRC: main with helper-53's V2 shared-experts fusion merged and the MLA
#   streaming limited to one token): every single-GPU test program, bench-one-batch of both models
#   (V2-Lite with and without the fusion), the 8k prefills, timelines.
if [ $PHASE = 5 ]; then
  TESTS=$(gpu_tests_of $SRC)
  JOBS=15 build_after ms_kernel_trace $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  FIRST="test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route test_cuda_attention_moe test_cuda_mla_absorb test_cuda_graphs"
  for t in $FIRST; do run_gpu_tests /tmp/b $t; done
  gtest parallel-v2v3 150 /tmp/b/tests/test_cuda_parallel --gtest_filter='*deepseek_v2_lite*:*deepseek_v3*'
  wait
  SIDES="all all:--disable-shared-experts-fusion" bench_sides v2lite "1 4096 16" "8 1024 16" "64 256 16"
  SIDES="all:--disable-shared-experts-fusion all" bench_sides v2lite "1 4096 16"
  SIDES="all all" bench_sides qwen3 "1 4096 16" "64 256 16"
  SIDES="all" bench_sides qwen3 "1 8192 2"
  SIDES="all" bench_sides v2lite "1 8192 2"
  trace v2lite 1 4096 $B all
  for t in $TESTS; do [ $(left) -gt 40 ] && run_gpu_tests /tmp/b $t; done
  log done
fi
