#!/bin/bash
# Session 34's device calls (bench/BENCHMARKS.md, "Session 34"), run from the repository root on
# the GPU machine: PHASE picks the call; sources are snapshots (git archive) carried as $SRC.
# (Its first call ran session33_run.sh's PHASE=4 over main with bench/gpu_pending.patch applied.)
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-2}
source $SRC/bench/device_env.sh && snapshots_ready $SRC

# PHASE=2: the session's final tree, labelled final: every GPU test program, the ceilings (with the
#   grid barrier of one persistent kernel beside the kernel boundary), B = 1 three rounds, B = 64,
#   the 8k prefills, the engine's step and the B = 1 timelines (device_env.sh's target_figures).
if [ $PHASE = 2 ]; then
  target_figures
fi
