// Mixture-of-experts on the GPU. Routing: one warp per token runs the CPU op's algorithm step
// for step (same scores, same group ranking with ties to the lower index, non-selected groups
// masked to 0, top-k ties to the lower expert id, weights summed in slot order). Experts: the
// token-expert pairs are sorted by expert on the host, the tokens gathered into one BF16 block,
// each selected expert's gate/up/down run as cuBLASLt GEMMs over its rows, and one kernel sums
// every token's k expert outputs with their weights in f32.
#include <algorithm>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"

namespace ms::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;

// Shared-experts fusion (RouterParams::fused_shared_replicas) is being added to ops.h alongside
// this backend; read it when the interface has it, so both sides can land in either order.
template <class P>
int fused_shared_replicas(const P& p) {
  if constexpr (requires { p.fused_shared_replicas; }) return p.fused_shared_replicas;
  else return 0;
}

struct TopkParams {
  int64_t T, E, ls;
  int K, C, fused, scoring, group_rank, n_group, topk_group, renormalize;  // C: columns (K + fused slot)
  float scale;
  const float* bias;
};

// Index of the largest value among lanes (ties: lower index); idx < 0 marks "no candidate".
__device__ void warp_argmax(float& v, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffffu, v, o);
    int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (oi >= 0 && (idx < 0 || ov > v || (ov == v && oi < idx))) v = ov, idx = oi;
  }
}

template <class TL>
__global__ void topk_kernel(const TL* logits, TopkParams p, int32_t* ids, float* weights) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= p.T) return;
  float* s = smem + warp * 2 * p.E;  // scores
  float* choice = s + p.E;
  const TL* row = logits + t * p.ls;
  float mx = -INFINITY;
  for (int e = lane; e < p.E; e += 32) mx = fmaxf(mx, load_f(row + e));
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  for (int e = lane; e < p.E; e += 32) {
    float x = load_f(row + e);
    s[e] = p.scoring == int(Scoring::Sigmoid) ? 1.0f / (1.0f + expf(-x)) : expf(x - mx);
    sum += s[e];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncwarp();
  for (int e = lane; e < p.E; e += 32) {
    if (p.scoring == int(Scoring::Softmax)) s[e] /= sum;
    choice[e] = s[e] + (p.bias ? p.bias[e] : 0.f);
  }
  __syncwarp();
  if (p.group_rank != int(GroupRank::None) && p.n_group > 1) {
    const int per = int(p.E / p.n_group);
    float gscore = -INFINITY;
    if (lane < p.n_group) {  // top-1 (Max) or top-1 + top-2 (SumTop2) of the group's choices
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int e = lane * per; e < (lane + 1) * per; ++e) {
        float c = choice[e];
        if (c > m1) m2 = m1, m1 = c;
        else if (c > m2) m2 = c;
      }
      gscore = p.group_rank == int(GroupRank::Max) ? m1 : m1 + (per > 1 ? m2 : 0.f);
    }
    bool kept = false;
    for (int r = 0; r < p.topk_group; ++r) {
      float v = (lane < p.n_group && !kept) ? gscore : -INFINITY;
      int idx = (lane < p.n_group && !kept) ? lane : -1;
      warp_argmax(v, idx);
      if (lane == idx) kept = true;
    }
    __syncwarp();
    for (int g = 0; g < p.n_group; ++g) {
      const bool keep = __shfl_sync(0xffffffffu, kept, g);
      if (!keep)
        for (int e = g * per + lane; e < (g + 1) * per; e += 32) choice[e] = 0.f;
    }
    __syncwarp();
  }
  float wsum = 0.f;
  int32_t* id_out = ids + t * p.C;
  float* w_out = weights + t * p.C;
  for (int j = 0; j < p.K; ++j) {
    float v = -INFINITY;
    int idx = -1;
    for (int e = lane; e < p.E; e += 32) {
      if (choice[e] == -INFINITY) continue;  // taken
      if (idx < 0 || choice[e] > v) v = choice[e], idx = e;
    }
    warp_argmax(v, idx);
    if (lane == 0) {
      id_out[j] = idx;
      w_out[j] = s[idx];
      choice[idx] = -INFINITY;  // taken
    }
    wsum += s[idx];
    __syncwarp();
  }
  if (lane == 0) {
    const float norm = p.renormalize ? 1.0f / (wsum + 1e-20f) : 1.0f;
    for (int j = 0; j < p.K; ++j) w_out[j] *= norm * p.scale;
    if (p.fused > 0) id_out[p.K] = int32_t(p.E + t % p.fused), w_out[p.K] = 1.0f;  // the shared expert's replica
  }
}

}  // namespace

void moe_topk(const Tensor& logits, const Tensor* bias, const RouterParams& p, Tensor& ids, Tensor& weights) {
  const int64_t T = logits.size(0), E = logits.size(1), K = p.top_k;
  const int fused = fused_shared_replicas(p);
  const int64_t C = K + (fused > 0 ? 1 : 0);
  MS_CHECK(ids.size(1) == C && weights.size(1) == C && K <= E, "moe_topk: top_k ", K, " of ", E, " experts into ",
           ids.describe());
  MS_CHECK(p.group_rank == GroupRank::None || (E % p.n_group == 0 && p.topk_group <= p.n_group && p.n_group <= 32),
           "moe_topk: ", E, " experts do not split into ", p.n_group, " groups (at most 32)");
  check_device_tensor(logits, {DType::F32, DType::BF16}, "moe_topk", "logits");
  check_device_tensor(ids, {DType::I32}, "moe_topk", "ids");
  check_device_tensor(weights, {DType::F32}, "moe_topk", "weights");
  MS_CHECK(logits.strides()[1] == 1 && ids.is_contiguous() && weights.is_contiguous() && ids.size(0) == T &&
               weights.size(0) == T,
           "moe_topk: logits rows, ids and weights must be contiguous [T, k]");
  if (bias) {
    check_device_tensor(*bias, {DType::F32}, "moe_topk", "correction bias");
    MS_CHECK(bias->numel() == E && bias->is_contiguous(), "moe_topk: bias ", bias->describe(), " for ", E, " experts");
  }
  if (T == 0) return;
  TopkParams tp{T, E, logits.strides()[0], int(K), int(C), fused, int(p.scoring), int(p.group_rank), p.n_group, p.topk_group,
                int(p.renormalize), p.scale, bias ? bias->data<float>() : nullptr};
  const size_t smem = size_t(kWarpsPerBlock) * 2 * E * sizeof(float);
  MS_CHECK(smem <= 48 * 1024, "moe_topk: ", E, " experts exceed the kernel's shared memory");
  MS_FLOAT_DISPATCH(logits.dtype(), TL,
    topk_kernel<TL><<<blocks_for(T, kWarpsPerBlock), kWarpsPerBlock * 32, smem, stream()>>>(
        logits.data<TL>(), tp, ids.data<int32_t>(), weights.data<float>()));
  MS_CUDA_LAUNCHED("topk_kernel");
}

}  // namespace ms::cuda
