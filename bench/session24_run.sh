#!/bin/bash
# Session 24's device calls (bench/BENCHMARKS.md, "Session 24"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC and
# $BEFORE_SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# Nsight Compute's warp-state samples by SASS instruction of one batch-1 router launch (the
# cluster's top-k and sort: session 21 timed them at 3.3 us for a few hundred instructions) in
# /tmp/qwen3's graphed decode, as CSV into $L/router-sass.csv, the details page into $L/router.txt.
router_samples() {
  [ $(left) -gt 60 ] || { log "no time for ncu"; return; }
  timeout $(( $(left) - 30 )) ncu --clock-control none --cache-control none -k regex:route_cluster -s 60 -c 1 \
    --section SourceCounters --section WarpStateStats --section LaunchStats -f -o /tmp/router \
    $B bench-one-batch --model-path /tmp/qwen3 --device cuda --batch-size 1 --input-len 512 --output-len 16 \
    > $L/ncu-router.log 2>&1
  log "ncu router rc=$? $(tail -2 $L/ncu-router.log | tr '\n' ' ')"
  ncu -i /tmp/router.ncu-rep --page source --csv --print-source sass > $L/router-sass.csv 2>&1
  ncu -i /tmp/router.ncu-rep --page details > $L/router.txt 2>&1
  grep -E 'Duration|Stall|Warp Cycles|Issued' $L/router.txt | head -30 >> "$OUT/summary.log"
}

# Phases 1-2: main's moeserve (/tmp/before) and $SRC's with the kernel tracer and the test programs
# $1, both random models, and those tests run.
before_and_after() {
  build_before 5
  JOBS=11 build_after ms_kernel_trace $1
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $1
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
}

# PHASE=1 ($SRC = branch s24 at 014dc65; $BEFORE_SRC = main, bc4845d). Two changes to the batch-1
#   experts: the ring kernel at 88 registers and the slab norm at 80, so a norm block fits beside an
#   experts block (V2-Lite's 132 experts blocks took every multiprocessor and the norm took
#   6.9 us after them, Qwen3's 3.7); and a ring block making two slabs where one a block would not
#   fit, so that V2-Lite with its shared expert fused (8 slots, 176 slabs) runs the one-token
#   kernel (side fused: --n-share-experts-fusion=1). Tests; B = 1 rotating; B = 64 fused or not;
#   timelines; the router's samples.
if [ $PHASE = 1 ]; then
  before_and_after "test_cuda_moe_one_token test_cuda_moe_combine_norm test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe test_cuda_ops test_cuda_fused test_cuda_graphs"
  FUSED=fused:--n-share-experts-fusion=1
  b1_rounds "before after" "before after $FUSED"
  SIDES="after $FUSED" bench_sides v2lite "64 256 16"
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  TRACE_FLAGS=--n-share-experts-fusion=1 trace v2lite 1 4096 fused
  router_samples
  log done
fi

# PHASE=2 ($SRC = branch s24 at 82fd47d, the first call's kernels reverted; $BEFORE_SRC = main,
#   bc4845d): the first call's samples put the router's top-k warp at ~1400 instructions, ~500 of
#   them the predicated, unrolled sum of its parts. Now: the cluster's parts summed in a loop, and
#   a few pairs (at most 32) sorted by one warp in registers. Tests; B = 1 rotating before / after;
#   B = 8; timelines; the router's samples again.
if [ $PHASE = 2 ]; then
  before_and_after "test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_combine_norm test_cuda_attention_moe test_cuda_fused"
  b1_rounds "before after" "after before"
  SIDES="before after" bench_sides qwen3 "8 4096 16"; SIDES="after before" bench_sides v2lite "8 4096 16"
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  B=/tmp/before/moeserve trace qwen3 1 4096 before
  router_samples
  log done
fi

# PHASE=3 ($SRC = branch s24 at b183aa6, two experiment switches since removed; no before build):
#   the second call's timelines keep V2-Lite's MoE combine + norm at 6.9 us after the experts, Qwen3's 3.7;
#   V2-Lite's next product (q|kv_a) fetches its weight early, Qwen3's q|k|v does not. Sides: the
#   norm letting the next kernel launch only once its columns are stored (late,
#   MOESERVE_SLAB_NORM_LATE=1), and q|kv_a not fetching early (qkva, MOESERVE_QKVA_NOT_EARLY=1).
if [ $PHASE = 3 ]; then
  T="test_cuda_moe_combine_norm test_cuda_fixtures"
  JOBS=14 build_after ms_kernel_trace $T
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T
  MOESERVE_SLAB_NORM_LATE=1 gtest combine-norm-late 120 /tmp/b/tests/test_cuda_moe_combine_norm
  MOESERVE_QKVA_NOT_EARLY=1 gtest fixtures-qkva 120 /tmp/b/tests/test_cuda_fixtures
  wait
  LATE=late:MOESERVE_SLAB_NORM_LATE=1 QKVA=qkva:MOESERVE_QKVA_NOT_EARLY=1
  b1_rounds "after $LATE" "after $LATE $QKVA"
  trace v2lite 1 4096 after; trace v2lite 1 4096 late MOESERVE_SLAB_NORM_LATE=1
  trace v2lite 1 4096 qkva MOESERVE_QKVA_NOT_EARLY=1; trace qwen3 1 4096 late MOESERVE_SLAB_NORM_LATE=1
  trace qwen3 1 4096 after
  log done
fi

# PHASE=4 ($SRC = the session's final tree): every single-GPU test program, the ceilings, B = 1 (three
#   runs a model), B = 64, and the engine's overlapped decode (bench-offline, 16 and 528 new tokens).
if [ $PHASE = 4 ]; then
  JOBS=14 build_after ms_cuda_ceilings $(gpu_tests_of $SRC)
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  wait
  for r in 1 2 3; do SIDES=final bench_sides qwen3 "1 4096 16"; SIDES=final bench_sides v2lite "1 4096 16"; done
  SIDES=final bench_sides qwen3 "64 256 16"; SIDES=final bench_sides v2lite "64 256 16"
  for m in qwen3 v2lite; do offline $m 16 final; offline $m 528 final; done
  log done
fi
