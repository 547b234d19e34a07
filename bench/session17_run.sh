#!/bin/bash
# Session 17's device calls (bench/BENCHMARKS.md, "Session 17"), run from the repository root on
# the GPU machine: PHASE picks the call; the source is a snapshot (git archive) carried as $SRC.
set -u
SRC=${SRC:-.devsrc-a} PHASE=${PHASE:-1}
source $SRC/bench/device_env.sh
snapshots_ready $SRC

# PHASE=1: session 16's pending patch (the norm inside the router's kernel, one-warp blocks;
#   MOESERVE_NORM_ROUTE=0 is the off side): its tests, the decode-path tests, the ceilings,
#   B = 1 alternating (three rounds each model), timelines both ways, B = 8 and 64.
if [ $PHASE = 1 ]; then
  NOFF=off:MOESERVE_NORM_ROUTE=0
  JOBS=15 build_after ms_kernel_trace ms_cuda_ceilings test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_moe_route test_cuda_fixtures test_cuda_engine_graphs
  wait
  for r in 1 2 3; do
    SIDES="$NOFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $NOFF" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_NORM_ROUTE=0
  SIDES="$NOFF on" bench_sides qwen3 "64 256 16"
  log done
fi
# PHASE=2: the batch-1 experts in one kernel (moe_one_token.cu; MOESERVE_MOE_ONE_TOKEN=0 is the
#   two grouped products, 2 / 3 its down prefetch in the first round / not at all): its tests and
#   bench, the MoE and decode-path tests, B = 1 alternating (three rounds each model), the
#   prefetch variants, timelines both ways.
if [ $PHASE = 2 ]; then
  OFF=off:MOESERVE_MOE_ONE_TOKEN=0
  JOBS=15 build_after ms_kernel_trace test_cuda_moe_one_token test_cuda_attention_moe test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_moe_route
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_one_token
  for v in 1 2 3; do
    MOESERVE_MOE_ONE_TOKEN=$v MOESERVE_BENCH_MOE_ONE_TOKEN=1 gtest bench-$v 120 /tmp/b/tests/test_cuda_moe_one_token \
      --gtest_filter='*Bench*'
  done
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_fixtures test_cuda_engine_graphs test_cuda_moe_route
  wait
  for r in 1 2 3; do
    SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $OFF" bench_sides v2lite "1 4096 16"
  done
  SIDES="first:MOESERVE_MOE_ONE_TOKEN=2 none:MOESERVE_MOE_ONE_TOKEN=3" bench_sides qwen3 "1 4096 16"
  trace qwen3 1 4096 on; trace qwen3 1 4096 off MOESERVE_MOE_ONE_TOKEN=0
  log done
fi
# PHASE=3: the one-token kernel at both slab widths (MOESERVE_MOE_ONE_TOKEN=64 / 32; the default
#   takes 64 where its grid fits the multiprocessors; 0 the two grouped products), no prefetch:
#   its tests, the bench at each width, B = 1 alternating with the two products (three rounds
#   each model), width 32 once each, timelines.
if [ $PHASE = 3 ]; then
  OFF=off:MOESERVE_MOE_ONE_TOKEN=0
  JOBS=15 build_after ms_kernel_trace test_cuda_moe_one_token test_cuda_attention_moe test_cuda_engine_graphs
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_one_token
  for v in 64 32; do
    MOESERVE_MOE_ONE_TOKEN=$v MOESERVE_BENCH_MOE_ONE_TOKEN=1 gtest bench-$v 120 /tmp/b/tests/test_cuda_moe_one_token \
      --gtest_filter='*Bench*'
  done
  run_gpu_tests /tmp/b test_cuda_attention_moe test_cuda_engine_graphs
  wait
  for r in 1 2 3; do
    SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $OFF" bench_sides v2lite "1 4096 16"
  done
  SIDES="w32:MOESERVE_MOE_ONE_TOKEN=32" bench_sides qwen3 "1 4096 16"
  SIDES="w32:MOESERVE_MOE_ONE_TOKEN=32" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 on; trace v2lite 1 4096 on; trace v2lite 1 4096 off MOESERVE_MOE_ONE_TOKEN=0
  log done
fi
# PHASE=4: the final tree (the one-token kernel lets the next kernel start at once): the ceilings,
#   the kernel's tests and the decode-path tests, B = 1 alternating with the two products (three
#   rounds each model), timelines, the targets' other shapes (B = 64, 8k prefill), the 8k
#   prefills' op traces (--trace-ops), then every other single-GPU test program while time is left.
if [ $PHASE = 4 ]; then
  OFF=off:MOESERVE_MOE_ONE_TOKEN=0
  TESTS=$(gpu_tests_of $SRC)
  JOBS=16 build_after ms_kernel_trace ms_cuda_ceilings $TESTS
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  timeout 120 /tmp/b/ms_cuda_ceilings > $L/ceilings.json 2>&1; log "ceilings $(tr -d '\n' < $L/ceilings.json)"
  run_gpu_tests /tmp/b test_cuda_moe_one_token test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  wait
  for r in 1 2 3; do
    SIDES="$OFF on" bench_sides qwen3 "1 4096 16"; SIDES="on $OFF" bench_sides v2lite "1 4096 16"
  done
  trace qwen3 1 4096 on; trace v2lite 1 4096 on
  SIDES="on" bench_sides qwen3 "64 256 16" "1 8192 2"
  SIDES="on" bench_sides v2lite "64 256 16" "1 8192 2"
  SIDES="ops:--trace-ops" bench_sides qwen3 "1 8192 2"
  SIDES="ops:--trace-ops" bench_sides v2lite "1 8192 2"
  for t in $TESTS; do [ $(left) -gt 60 ] && run_gpu_tests /tmp/b $t; done
  log done
fi
# PHASE=5: Nsight Compute on the graphed B = 1 decode of the final tree: the one-token experts
#   kernel beside the products and the router (time, DRAM and L2 throughput, occupancy, warp
#   stalls), Qwen3 then V2-Lite while the device time lasts; the reports go straight to $OUT.
if [ $PHASE = 5 ]; then
  JOBS=16 build_after
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  wait
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for m in qwen3 v2lite; do
    timeout $(( $(left) - 5 )) $NCU --clock-control none --target-processes all \
      -k regex:'one_token_kernel|gemv_kernel|route_kernel' --launch-skip 400 --launch-count 12 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
      --section LaunchStats --csv --page details \
      $B bench-one-batch --model-path /tmp/$m --device cuda --batch-size 1 --input-len 4096 --output-len 16 \
      > $OUT/ncu-$m.csv 2> $L/ncu-$m.err
    log "ncu $m rc=$? $(wc -l < $OUT/ncu-$m.csv) lines"; tail -3 $L/ncu-$m.err >> "$OUT/summary.log"
  done
  log done
fi
# PHASE=6 (for the next session; $SRC = main with bench/gpu_pending.patch applied): the one-token
#   kernel's loads through a shared-memory ring (MOESERVE_MOE_ONE_TOKEN=ring, the patch's default)
#   against its register loads (=64) and the two products (=0): its tests, the bench in each
#   shape, B = 1 alternating ring / 64 (three rounds each model), the two products once each,
#   timelines, then the other tests the patch touches (cp.async helpers moved into cuda_common.h).
if [ $PHASE = 6 ]; then
  JOBS=16 build_after ms_kernel_trace test_cuda_moe_one_token test_cuda_attention_moe test_cuda_fixtures \
    test_cuda_engine_graphs test_cuda_flash_prefill test_cuda_mla_prefill test_cuda_grouped_gemm test_cuda_moe_prefill
  model qwen3 qwen3-30b-a3b 12 & model v2lite deepseek-v2-lite 9 &
  run_gpu_tests /tmp/b test_cuda_moe_one_token
  for v in ring 64; do
    MOESERVE_MOE_ONE_TOKEN=$v MOESERVE_BENCH_MOE_ONE_TOKEN=1 gtest bench-$v 120 /tmp/b/tests/test_cuda_moe_one_token \
      --gtest_filter='*Bench*'
  done
  run_gpu_tests /tmp/b test_cuda_fixtures test_cuda_engine_graphs test_cuda_attention_moe
  wait
  for r in 1 2 3; do
    SIDES="regs:MOESERVE_MOE_ONE_TOKEN=64 ring" bench_sides qwen3 "1 4096 16"
    SIDES="ring regs:MOESERVE_MOE_ONE_TOKEN=64" bench_sides v2lite "1 4096 16"
  done
  SIDES="off:MOESERVE_MOE_ONE_TOKEN=0" bench_sides qwen3 "1 4096 16"
  SIDES="off:MOESERVE_MOE_ONE_TOKEN=0" bench_sides v2lite "1 4096 16"
  trace qwen3 1 4096 ring; trace v2lite 1 4096 ring
  run_gpu_tests /tmp/b test_cuda_flash_prefill test_cuda_mla_prefill test_cuda_grouped_gemm test_cuda_moe_prefill
  log done
fi
