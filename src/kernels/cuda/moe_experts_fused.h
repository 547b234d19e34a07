// A batch-1 MoE layer's routed experts in one kernel: [gate | up] with SiLU-and-mul, then down,
// for every selected expert, with no kernel boundary between the two products.
//
// Two weight-streaming products (gemv.h) cost a decode step more than their bytes: the down
// product cannot start before the last [gate | up] block ends, and then ramps up from nothing
// (Qwen3-30B-A3B at batch 1, session 15: gate|up 15.8 us, down 11.9 us a layer, for 50 + 25 MB
// that HBM moves in 11.7 + 5.9). Here expert e's blocks (`slices` of them, all resident: one
// block a multiprocessor, groups x slices <= SMs) each compute a slice of e's intermediate
// features, while a bulk copy brings their share of e's down rows into shared memory; the
// blocks of one expert then meet at a device-wide counter, read e's whole intermediate row
// from L2 and multiply it by the staged down rows. HBM streams both products without a gap.
//
// Every sum is grouped as gemv's automatic launch groups it (gemv_split_warps: the same
// fragments, chunk order and cross-warp order), so the rows this kernel writes are bit for bit
// those of gemv's two launches, which stay the path for every shape this kernel does not take.
#pragma once
#include <optional>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms::cuda {

// The launch for `rows` (grouped as moe_experts hands them to gemv) over `table`'s experts, or
// nullopt when this kernel does not take it: FP8 weights, not a Hopper, more than 8 rows an
// expert, too many groups for one resident block a multiprocessor per slice, down rows that do
// not fit shared memory, or MOESERVE_MOE_FUSED=0 (read at every call).
struct FusedExpertsPlan {
  int slices = 0;     // blocks an expert
  int gu_slabs = 0;   // 16-feature slabs of [gate | up] a block
  int down_rows = 0;  // down rows a block stages and multiplies
  int hs_rows = 0;    // rows an expert at most (the tokens)
  int warps = 0, split_gu = 0, split_down = 0;  // a block's; gemv's K splits of the two products
  size_t smem = 0;
};
std::optional<FusedExpertsPlan> fused_experts_plan(const ExpertTable& table, const GemvRows& rows, int64_t tokens);

// act [rows, I] (BF16) = silu(x . gate) * (x . up) and ye [rows, H] (F32) = act . down for each
// group's rows, as gemv(I, H, gate_up, rows, x, act, swiglu) then gemv(H, I, down, rows, act, ye).
void fused_experts(const FusedExpertsPlan& plan, const ExpertTable& table, const GemvRows& rows, const GemvInput& x,
                   __nv_bfloat16* act, float* ye);

}  // namespace ms::cuda
