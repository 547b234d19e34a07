// The device side of the grouped MoE path (moe_experts.cu): a table of every local expert's
// weight pointers, built once per ExpertWeights, and the sort of (token, slot) pairs by expert
// done on the device, so that a decode step never waits for the host. Also the row gather and the
// weighted combine that moe_experts runs around its products, public so tests can time them.
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
// order), token_of_row [T * K] and row_of [T * K] (-1 for another rank's expert). The sort that
// the fused routing of a decode batch made in its own kernel for these very ids over [0, E)
// (keep_routed_pairs; taken once), else one block's kernel (align_kernel).
struct Permuted {
  Tensor offsets, active, n_active, token_of_row, row_of;
};
Permuted permute_on_device(const Tensor& ids, int first, int E);

// Uninitialised outputs of a sort of `pairs` pairs over E experts, and their device pointers.
Permuted permuted_scratch(int64_t pairs, int E);
SortedPairs sorted_pairs(const Permuted& p, int E);
// moe_route's hand-over: `perm`, launched by the kernel that wrote ids, is their sort over
// [0, experts), for the next permute_on_device of ids on this thread (in the same graph capture,
// or outside one). Whoever rewrites ids in between must drop it: moe_topk and moe_route do.
void keep_routed_pairs(const Tensor& ids, int experts, Permuted perm);
void drop_routed_pairs();

// The routed experts of one token (x [1, H]) in one kernel (moe_one_token.cu): ye [K, H] (F32)
// gets at row row_of[j] the output of slot j's expert (ids [1, K]), the sums grouped_experts'
// two products make, in another order. False, with nothing launched, where it does not take the
// shape (FP8 weights, H not a multiple of 256, I of 32), where its grid would not be resident at
// once, or when MOESERVE_MOE_ONE_TOKEN=0.
bool one_token_experts(const Tensor& x, const Tensor& ids, const Tensor& row_of, const ExpertTable& t, int first,
                       Tensor& ye);
// The same kernel without its last step, each slot's sum of its slabs into ye: slot j's output is
// left as `slabs` partial sums, rows [j * slabs, (j + 1) * slabs) of parts [K * slabs, H] (F32, set
// here), which added in slab order from 0 give one_token_experts' row bit for bit (rows of a slot
// whose row_of is -1 are not written). Its blocks then need not meet at a counter, and whoever
// reads the parts (moe_combine_add_rms_norm) does the sum on its way. Returns slabs; 0, with
// nothing launched, where one_token_experts would decline.
int one_token_expert_parts(const Tensor& x, const Tensor& ids, const Tensor& row_of, const ExpertTable& t, int first,
                           Tensor& parts);

// Whether moe_combine_add_rms_norm takes one token's rows of hidden size H over K slots as the
// one-token kernel's slabs in its own launch (so moe_expert_rows leaves them unsummed): H a
// multiple of 256 up to 2048 (one cluster, a block for every 256 columns), K up to 8;
// MOESERVE_MOE_SLAB_NORM=0 (read once): never.
bool moe_slab_norm_takes(int64_t H, int64_t K);
// Rows with slabs (ExpertRows::slabs > 0) summed into plain rows [T * K, H] (F32), bit for bit
// the rows one_token_experts writes; rows without slabs as they are.
ops::ExpertRows summed_slabs(const ops::ExpertRows& routed);

// xe [rows, H] (BF16, contiguous): row r = x[token_of_row[r]] (x BF16 with contiguous rows), zeros
// where token_of_row[r] is -1 (a pad row). 16-byte copies, a warp a row, where rows are aligned.
void gather_token_rows(const Tensor& x, const Tensor& token_of_row, Tensor& xe);

// out[t] (BF16 or F32, contiguous rows) = sum_j weights[t, j] * ye[row_of[t * K + j]] for
// weights [T, K] (F32) and ye [rows, H] (BF16 or F32, contiguous), over j in order, rows -1
// skipped, summed in f32 and rounded once.
void combine_expert_rows(const Tensor& ye, const Tensor& row_of, const Tensor& weights, Tensor& out);

}  // namespace ms::cuda
