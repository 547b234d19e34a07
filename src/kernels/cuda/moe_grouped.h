// The device side of the grouped MoE path (moe_experts.cu): a table of every local expert's
// weight pointers, built once per ExpertWeights, and the sort of (token, slot) pairs by expert
// done on the device, so that a decode step never waits for the host.
#pragma once
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/gemv.h"

namespace ms::cuda {

// Tokens up to which moe_experts takes the grouped path outside graph capture: beyond this the
// experts see enough rows each for cuBLASLt's tensor cores to beat streaming on CUDA cores.
constexpr int64_t kGroupedMaxTokens = 128;

struct ExpertTable {
  int experts = 0;
  int64_t hidden = 0, intermediate = 0;
  bool fp8 = false;
  GemvWeights gate_up, down;  // device pointer arrays (gate_up: w = gate, w2 = up)
  Tensor pointers;            // owns the arrays
  std::vector<uint64_t> host_pointers;  // what the arrays hold: a lookup checks them
};

// The table for these weights (built and uploaded on first use, then cached by address), or
// null when the experts do not fit the grouped kernels (mixed dtypes, odd strides).
const ExpertTable* expert_table(const ops::ExpertWeights& experts);

// Pairs of ids [T, K] whose expert lies in [first, first + E), ordered by expert: offsets [E + 1]
// (rows of each local expert), active [E] with n_active [1] (the experts that have rows, in
// order), token_of_row [T * K] and row_of [T * K] (-1 for another rank's expert).
struct Permuted {
  Tensor offsets, active, n_active, token_of_row, row_of;
};
Permuted permute_on_device(const Tensor& ids, int first, int E);

}  // namespace ms::cuda
