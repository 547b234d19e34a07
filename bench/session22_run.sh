#!/bin/bash
# Session 22's device calls (bench/BENCHMARKS.md, "Session 22"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC and
# $BEFORE_SRC. (The first call ran session21_run.sh's PHASE=4.)
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1 ($SRC = 9244b3a of branch early-o, merged after PHASE=3; $BEFORE_SRC = main, 1344e70):
#   the attention's output projection loading its first round of weights into registers before it
#   waits (MOESERVE_GEMV_PREFETCH=marked, the default; none: nothing early; regs: every dense
#   product) and eight warps for dense products that eight take in one round (Qwen3's q|k|v). Tests, the gemv bench, B = 1 alternating
#   before / after / noearly / regs (three rounds each model), timelines, B = 8 and 64.
if [ $PHASE = 1 ]; then
  T="test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe test_cuda_mla_absorb test_cuda_fused"
  build_before 5
  JOBS=11 build_after ms_kernel_trace ms_cuda_ceilings $T
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b $T
  MOESERVE_BENCH_GEMV=1 gtest gemv-bench 90 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Bench*'
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  N=noearly:MOESERVE_GEMV_PREFETCH=none R=regs:MOESERVE_GEMV_PREFETCH=regs
  for r in 1 2 3; do
    SIDES="before after $N $R" bench_sides qwen3 "1 4096 16"
    SIDES="$R $N after before" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  trace qwen3 1 4096 noearly MOESERVE_GEMV_PREFETCH=none; trace v2lite 1 4096 noearly MOESERVE_GEMV_PREFETCH=none
  SIDES="before after" bench_sides qwen3 "8 4096 16" "64 256 16"; SIDES="after before" bench_sides v2lite "8 4096 16" "64 256 16"
  log done
fi
# PHASE=2 ($SRC = ceb591b; $BEFORE_SRC = 1344e70): PHASE=1 showed eight warps
#   for Qwen3's q|k|v slower in the step (14.4 us against 8.8: 320 blocks of 256 threads at 126
#   registers are two waves) and the reworked loop slower where nothing is fetched early (V2-Lite's
#   shared gate|up 10.1 us against 8.0), but the early output projection faster (Qwen3 5.0 us
#   against 7.7, V2-Lite 2.6 against 6.7). Now: the old warps rule, the old loop where nothing is
#   fetched early (the early loop a template flag). Tests, B = 1 alternating before / after /
#   noearly / regs, timelines, B = 8 and 64.
if [ $PHASE = 2 ]; then
  T="test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe test_cuda_mla_absorb test_cuda_fp8_gemm"
  build_before 5
  JOBS=11 build_after ms_kernel_trace $T
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b $T
  MOESERVE_GEMV_PREFETCH=regs gtest fixtures-regs 120 /tmp/b/tests/test_cuda_fixtures
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  N=noearly:MOESERVE_GEMV_PREFETCH=none R=regs:MOESERVE_GEMV_PREFETCH=regs
  for r in 1 2 3; do
    SIDES="before after $N $R" bench_sides qwen3 "1 4096 16"
    SIDES="$R $N after before" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 after; trace v2lite 1 4096 after
  trace qwen3 1 4096 regs MOESERVE_GEMV_PREFETCH=regs; trace v2lite 1 4096 regs MOESERVE_GEMV_PREFETCH=regs
  SIDES="before after" bench_sides qwen3 "8 4096 16" "64 256 16"; SIDES="after before" bench_sides v2lite "8 4096 16" "64 256 16"
  log done
fi
# PHASE=3 ($SRC = a7a0a7f, merged into main; $BEFORE_SRC = 1344e70): PHASE=2 found the early output
#   projection a small gain (Qwen3 −0.4 %, V2-Lite none) and every dense product early (regs)
#   V2-Lite −1.9 % but Qwen3 +7 %; V2-Lite's q|kv_a was the one large gain. Now MLA's fused
#   q|kv_a is marked too. B = 1 alternating before / after / noearly, timelines, B = 8 and 64.
if [ $PHASE = 3 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace test_cuda_fixtures test_cuda_mla_absorb
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_mla_absorb
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  N=noearly:MOESERVE_GEMV_PREFETCH=none
  for r in 1 2 3; do
    SIDES="before after $N" bench_sides qwen3 "1 4096 16"
    SIDES="$N after before" bench_sides v2lite "1 4096 16"
  done
  trace v2lite 1 4096 after; trace qwen3 1 4096 after
  SIDES="after before" bench_sides v2lite "8 4096 16" "64 256 16"
  log done
fi
# PHASE=4 (for the next session; $SRC = main + bench/gpu_pending.patch, branch early-part; $BEFORE_SRC
#   = main): an early product loading only MOESERVE_GEMV_EARLY_CHUNKS of its first round's chunks
#   before its wait (0, the default: all, as main), so that the kernel before it keeps more of HBM
#   (Qwen3's split merge: 5.5 us behind o's whole weight, 3.5 without). Its tests at 0, 2 and 4;
#   B = 1 alternating before / c0 / c4 / c2 (Qwen3's o takes 8 chunks a round, V2-Lite's marked
#   products 4) and Qwen3's q|k|v early with one chunk (regs1); timelines of c4 and c2.
if [ $PHASE = 4 ]; then
  build_before 5
  JOBS=11 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures
  for c in 2 4; do MOESERVE_GEMV_EARLY_CHUNKS=$c gtest gemv-c$c 60 /tmp/b/tests/test_cuda_gemv --gtest_filter='*Early*'; done
  wait
  [ -x /tmp/before/moeserve ] || { tail -20 $L/build-before.log; log "before build failed"; }
  C4=c4:MOESERVE_GEMV_EARLY_CHUNKS=4 C2=c2:MOESERVE_GEMV_EARLY_CHUNKS=2
  R1=regs1:MOESERVE_GEMV_PREFETCH=regs,MOESERVE_GEMV_EARLY_CHUNKS=1
  for r in 1 2 3; do
    SIDES="before c0 $C4 $C2 $R1" bench_sides qwen3 "1 4096 16"
    SIDES="$R1 $C2 $C4 c0 before" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 c4 MOESERVE_GEMV_EARLY_CHUNKS=4; trace v2lite 1 4096 c2 MOESERVE_GEMV_EARLY_CHUNKS=2
  trace qwen3 1 4096 c2 MOESERVE_GEMV_EARLY_CHUNKS=2
  log done
fi
