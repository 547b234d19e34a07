// Mixture-of-experts on the GPU. Routing: one warp per token runs the CPU op's algorithm step
// for step (moe_topk.cuh), in its own kernel after the router product, or, for a decode batch,
// in the router product's last block (moe_route), which then also sorts the chosen pairs by
// expert for moe_experts (moe_grouped.h): one kernel where there were three. Experts:
// moe_experts.cu.
#include <algorithm>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/moe_grouped.h"
#include "kernels/cuda/moe_topk.cuh"

namespace ms::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;  // tokens a block, a warp each

// Decode batches up to this many tokens run the top-k in the router product's last block
// (moe_route): one kernel instead of two, each of which costs mostly its launch and ramp.
constexpr int64_t kFusedRouteMaxTokens = 8;

template <class TL, int NV>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) topk_kernel(const TL* logits, TopkParams p, int32_t* ids,
                                                                    float* weights) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= p.T) return;  // the whole warp: no block-wide barrier below
  topk_row<TL, NV>(logits + t * p.ls, p, t, smem + warp * p.E, ids, weights);
}

template <class TL>
void launch_topk(int nv, unsigned grid, size_t smem, const TL* logits, const TopkParams& tp, int32_t* ids,
                 float* weights) {
  switch (nv) {
    case 1: topk_kernel<TL, 1><<<grid, kWarpsPerBlock * 32, smem, stream()>>>(logits, tp, ids, weights); break;
    case 2: topk_kernel<TL, 2><<<grid, kWarpsPerBlock * 32, smem, stream()>>>(logits, tp, ids, weights); break;
    case 4: topk_kernel<TL, 4><<<grid, kWarpsPerBlock * 32, smem, stream()>>>(logits, tp, ids, weights); break;
    case 8: topk_kernel<TL, 8><<<grid, kWarpsPerBlock * 32, smem, stream()>>>(logits, tp, ids, weights); break;
    case 16: topk_kernel<TL, 16><<<grid, kWarpsPerBlock * 32, smem, stream()>>>(logits, tp, ids, weights); break;
    case 32: topk_kernel<TL, 32><<<grid, kWarpsPerBlock * 32, smem, stream()>>>(logits, tp, ids, weights); break;
    default: fail("moe_topk: ", nv, " experts a lane");
  }
}

// The kernel's parameters for logits [T, E] (row stride ls) into ids / weights, after checking
// the shapes the kernel takes.
TopkParams topk_params(int64_t T, int64_t E, int64_t ls, const Tensor* bias, const RouterParams& p, const Tensor& ids,
                       const Tensor& weights) {
  const int64_t K = p.top_k, C = p.columns();
  MS_CHECK(ids.dim() == 2 && weights.dim() == 2 && ids.size(1) == C && weights.size(1) == C && K <= E,
           "moe_topk: top_k ", K, " of ", E, " experts into ", ids.describe());
  MS_CHECK(K <= 32 && E <= 1024, "moe_topk: top_k ", K, " of ", E, " experts (the kernel takes at most 32 of 1024)");
  MS_CHECK(p.fused_shared_pieces >= 1 && p.fused_shared_pieces <= 32, "moe_topk: a fused shared expert in ",
           p.fused_shared_pieces, " pieces (a lane each: at most 32)");
  MS_CHECK(p.group_rank == GroupRank::None || (E % p.n_group == 0 && p.topk_group <= p.n_group && p.n_group <= 32),
           "moe_topk: ", E, " experts do not split into ", p.n_group, " groups (at most 32)");
  check_device_tensor(ids, {DType::I32}, "moe_topk", "ids");
  check_device_tensor(weights, {DType::F32}, "moe_topk", "weights");
  MS_CHECK(ids.is_contiguous() && weights.is_contiguous() && ids.size(0) == T && weights.size(0) == T,
           "moe_topk: ids and weights must be contiguous [T, k]");
  if (bias) {
    check_device_tensor(*bias, {DType::F32}, "moe_topk", "correction bias");
    MS_CHECK(bias->numel() == E && bias->is_contiguous(), "moe_topk: bias ", bias->describe(), " for ", E, " experts");
  }
  return TopkParams{T, E, ls, int(K), int(C), p.fused_shared_replicas, p.fused_shared_pieces, int(p.scoring),
                    int(p.group_rank), p.n_group, p.topk_group, int(p.renormalize), p.scale,
                    bias ? bias->data<float>() : nullptr};
}

}  // namespace

void moe_topk(const Tensor& logits, const Tensor* bias, const RouterParams& p, Tensor& ids, Tensor& weights) {
  check_device_tensor(logits, {DType::F32, DType::BF16}, "moe_topk", "logits");
  MS_CHECK(logits.dim() == 2 && logits.strides()[1] == 1, "moe_topk: logits rows must be contiguous");
  const int64_t T = logits.size(0), E = logits.size(1);
  const TopkParams tp = topk_params(T, E, logits.strides()[0], bias, p, ids, weights);
  drop_routed_pairs();  // ids are rewritten: a sort of them made with an earlier routing is stale
  if (T == 0) return;
  const size_t smem = size_t(kWarpsPerBlock) * topk_warp_smem(tp);
  MS_FLOAT_DISPATCH(logits.dtype(), TL,
    launch_topk<TL>(topk_lanes(E), blocks_for(T, kWarpsPerBlock), smem, logits.data<TL>(), tp, ids.data<int32_t>(),
                    weights.data<float>()));
  MS_CUDA_LAUNCHED("topk_kernel");
}

void moe_route(const Tensor& x, const Weight& gate, const Tensor* gate_bias, const Tensor* bias, const RouterParams& p,
               Tensor& ids, Tensor& weights) {
  const int64_t T = x.size(0), E = gate.out_features();
  // F32 logits, as the reference computes them (bf16 logits would flip near-tied expert choices).
  Tensor logits = scratch(DType::F32, {T, E});
  drop_routed_pairs();
  if (T > 0 && T <= kFusedRouteMaxTokens && topk_lanes(E) <= kRouteMaxLanes) {
    const TopkParams tp = topk_params(T, E, E, bias, p, ids, weights);
    // The sort of the pairs by expert, over every expert id the router names (the shared
    // expert's replicas too), in the same kernel: moe_experts takes it when it holds all of them
    // (no expert parallelism) instead of launching its own (align_kernel).
    const int experts = int(E) + p.fused_shared_experts();
    Permuted perm = permuted_scratch(T * tp.C, experts);
    const RouteTail tail{tp, ids.data<int32_t>(), weights.data<float>(), topk_lanes(E), sorted_pairs(perm, experts)};
    if (linear_then_topk(x, gate, gate_bias, logits, tail)) {
      keep_routed_pairs(ids, experts, std::move(perm));
      return;
    }
  }
  cuda::linear(x, gate, gate_bias, logits);
  cuda::moe_topk(logits, bias, p, ids, weights);
}

}  // namespace ms::cuda
