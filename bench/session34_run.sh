#!/bin/bash
# Session 34's device calls (bench/BENCHMARKS.md, "Session 34"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
# (Its first call ran session33_run.sh's PHASE=4 over main with bench/gpu_pending.patch applied.)
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-3}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=2: the session's final tree, labelled final: every GPU test program, the ceilings (with the
#   grid barrier of one persistent kernel beside the kernel boundary), B = 1 three rounds, B = 64,
#   the 8k prefills, the engine's step and the B = 1 timelines (device_env.sh's target_figures).
if [ $PHASE = 2 ]; then
  target_figures
fi

# PHASE=3 (ran at 79ffc63; its source dropped since): q|k|v's slabs by the copy engine
#   (MOESERVE_GEMV_BULK=1: gemv_bulk_kernel, its copies issued as its blocks start) and the MoE
#   combine + norm letting it launch only once its parts are read (MOESERVE_MOE_NORM_TRIGGER=reads).
#   The touched tests and those of whole models with both on (device time was short: not every
#   program); greedy ids both on against off; B = 1 rotating over off / bulk / gated (both) / late
#   (the trigger alone) for Qwen3, off / late for V2-Lite (no product of its takes the copy
#   engine); timelines of each; the engine's step off and gated.
if [ $PHASE = 3 ]; then
  ON="MOESERVE_GEMV_BULK=1 MOESERVE_MOE_NORM_TRIGGER=reads"
  (export $ON; tests_and_models test_cuda_gemv test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe \
    test_cuda_moe_combine_norm test_cuda_moe_one_token test_cuda_graphs)
  ids_alike "$ON" - gated off
  b1_rounds "off bulk:MOESERVE_GEMV_BULK=1 gated:${ON// /,} late:MOESERVE_MOE_NORM_TRIGGER=reads" \
    "off late:MOESERVE_MOE_NORM_TRIGGER=reads"
  trace qwen3 1 4096 off; trace qwen3 1 4096 bulk MOESERVE_GEMV_BULK=1; trace qwen3 1 4096 gated $ON
  trace qwen3 1 4096 late MOESERVE_MOE_NORM_TRIGGER=reads
  trace v2lite 1 4096 off; trace v2lite 1 4096 late MOESERVE_MOE_NORM_TRIGGER=reads
  for o in 16 528; do offline qwen3 $o off-qwen3; (export $ON; offline qwen3 $o gated-qwen3); done
  log done
fi

# PHASE=4 (ran at d6c6bd5; dropped since): a warm machine's second try at PHASE=3, whose bulk
#   launches had all failed (the shared-memory limit asked for left no room for the kernel's static
#   barrier): rebuild, the gemv and fixtures tests with both on, B = 1 off / gated twice, the gated
#   timeline.
if [ $PHASE = 4 ]; then
  ON="MOESERVE_GEMV_BULK=1 MOESERVE_MOE_NORM_TRIGGER=reads"
  JOBS=15 build_after ms_kernel_trace test_cuda_gemv test_cuda_fixtures
  ln -sfn $ROOT/.b4/models/qwen3 /tmp/qwen3
  (export $ON; run_gpu_tests /tmp/b test_cuda_gemv test_cuda_fixtures)
  for r in 1 2; do SIDES="off gated:${ON// /,}" bench_sides qwen3 "1 4096 16"; done
  trace qwen3 1 4096 gated $ON
  log done
fi
