#!/bin/bash
# Session 26's device calls (bench/BENCHMARKS.md, "Session 26"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 ($SRC = main with the decode rope inside the GQA attention kernel; MOESERVE_DECODE_ROPE=0
#   the rope kernel before it): the tests that run the op and the models; greedy ids with and
#   without; B = 1 rotating (Qwen3: the only model with GQA); B = 64; the engine's decode; timelines.
if [ $PHASE = 1 ]; then
  JOBS=14 build_after ms_kernel_trace test_cuda_attention_moe test_cuda_fused test_cuda_fixtures test_cuda_engine_graphs test_cuda_graphs
  model qwen3 qwen3-30b-a3b 12 &
  gtest decode-rope 120 /tmp/b/tests/test_cuda_attention_moe --gtest_filter='*DecodeRope*'
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_fused test_cuda_fixtures test_cuda_engine_graphs test_cuda_graphs
  wait
  gen_ids qwen3 - on; gen_ids qwen3 MOESERVE_DECODE_ROPE=0 off
  cmp -s $L/gen-on.txt $L/gen-off.txt && log "generate ids equal" || log "generate ids DIFFER"
  OFF=off:MOESERVE_DECODE_ROPE=0
  for r in 0 1 2; do SIDES="$(SIDES="$OFF on" rotated $r)" bench_sides qwen3 "1 4096 16"; done
  SIDES="on $OFF" bench_sides qwen3 "64 256 16"; SIDES="$OFF on" bench_sides qwen3 "64 256 16"
  for o in 16 528; do offline qwen3 $o on; MOESERVE_DECODE_ROPE=0 offline qwen3 $o off; done
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_DECODE_ROPE=0
  log done
fi

# PHASE=2 ($SRC = main, the session's final src/): every single-GPU test program, the ceilings;
#   more rounds of the first calls' sides: B = 1 five rotated rounds, the engine's decode three,
#   B = 64 three.
if [ $PHASE = 2 ]; then
  JOBS=14 build_after ms_cuda_ceilings $(gpu_tests_of $SRC)
  model qwen3 qwen3-30b-a3b 12 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $(gpu_tests_of $SRC)
  wait
  OFF=off:MOESERVE_DECODE_ROPE=0
  for r in 0 1 2 3 4; do SIDES="$(SIDES="$OFF on" rotated $r)" bench_sides qwen3 "1 4096 16"; done
  for r in 0 1 2; do
    for side in $(SIDES="on off" rotated $r); do
      for o in 16 528; do
        if [ $side = off ]; then MOESERVE_DECODE_ROPE=0 offline qwen3 $o $side-$r; else offline qwen3 $o $side-$r; fi
      done
    done
    SIDES="$(SIDES="on $OFF" rotated $r)" bench_sides qwen3 "64 256 16"
  done
  log done
fi

# PHASE=3 ($SRC = the final tree, whose src/ differs from the second call's in host checks and
#   comments): the tests that run the decode rope, and the greedy ids with and without it.
if [ $PHASE = 3 ]; then
  JOBS=14 build_after test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs test_cuda_fused
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs test_cuda_fused
  wait
  gen_ids qwen3 - on; gen_ids qwen3 MOESERVE_DECODE_ROPE=0 off
  cmp -s $L/gen-on.txt $L/gen-off.txt && log "generate ids equal" || log "generate ids DIFFER"
  log done
fi

# PHASE=4 ($SRC = main with a step's upload copying only the slots that changed): the tests of
#   the copies and of captured steps; the engine's decode traced (the gap between replays and the
#   upload's kernel) and timed twice.
if [ $PHASE = 4 ]; then
  JOBS=16 build_after ms_kernel_trace test_cuda_engine_graphs test_cuda_attention_moe test_cuda_fixtures
  model qwen3 qwen3-30b-a3b 12 &
  run_gpu_tests /tmp/b test_cuda_engine_graphs test_cuda_attention_moe test_cuda_fixtures
  wait
  trace_offline qwen3 64 ranges
  grep -E 'copy_ranges_kernel|copy_words_kernel' $L/kts-offline-ranges-qwen3.txt | head -4 >> "$OUT/summary.log"
  for r in 0 1; do for o in 16 528; do offline qwen3 $o ranges-$r; done; done
  log done
fi

# PHASE=5 (a snapshot of main with `patch -p1 < bench/gpu_pending.patch` applied, as $SRC: dense
#   products of one row tile in half slabs where that spreads their blocks more evenly,
#   MOESERVE_GEMV_HALF=0 the whole slabs): the GEMV tests (the bits of both), the models' tests;
#   B = 1 rotating, both models; timelines of Qwen3 both ways.
if [ $PHASE = 5 ]; then
  JOBS=14 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs
  wait
  FULL=full:MOESERVE_GEMV_HALF=0
  b1_rounds "$FULL half" "$FULL half"
  trace qwen3 1 4096 half; trace qwen3 1 4096 full MOESERVE_GEMV_HALF=0
  log done
fi
