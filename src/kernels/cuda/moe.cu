// Mixture-of-experts on the GPU. Routing: one warp per token runs the CPU op's algorithm step
// for step, in registers (same scores, same group ranking with ties to the lower index,
// non-selected groups masked to 0, top-k ties to the lower expert id, weights summed in pick
// order). Experts: the token-expert pairs are sorted by expert on the host, the tokens gathered
// into one BF16 block, each selected expert's gate/up/down run as cuBLASLt GEMMs over its rows,
// and one kernel sums every token's k expert outputs with their weights in f32.
#include <algorithm>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"

namespace ms::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;  // tokens a block, a warp each

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

// An unsigned key that orders as the float does (-0 taken as +0 so equal floats give equal keys;
// router scores are never NaN): a warp's largest choice is then one redux instruction, and key 0,
// below every float, marks an expert already taken (or a padding slot past E).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f == 0.f ? 0.f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// One warp a token, expert e = i * 32 + lane in register i of a lane (32 * NV >= E). The
// selection keeps everything in registers: each of the K rounds is a lane's scan of its NV keys
// and two warp reductions (largest key, then the lowest expert holding it: the CPU op's tie rule).
// Lane j keeps the j-th pick, so ids and weights are written once, together, at the end.
template <class TL, int NV>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) topk_kernel(const TL* logits, TopkParams p, int32_t* ids,
                                                                    float* weights) {
  constexpr uint32_t kAll = 0xffffffffu;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (t >= p.T) return;  // the whole warp: no block-wide barrier below
  const TL* row = logits + t * p.ls;
  float x[NV], s[NV], choice[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int e = i * 32 + lane;
    x[i] = e < p.E ? load_f(row + e) : -INFINITY;
    choice[i] = p.bias && e < p.E ? p.bias[e] : 0.f;
  }
  float mx = -INFINITY, sum = 0.f;
#pragma unroll
  for (int i = 0; i < NV; ++i) mx = fmaxf(mx, x[i]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kAll, mx, o));
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    s[i] = p.scoring == int(Scoring::Sigmoid) ? 1.0f / (1.0f + expf(-x[i])) : expf(x[i] - mx);
    if (i * 32 + lane >= p.E) s[i] = 0.f;
    sum += s[i];
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kAll, sum, o);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    if (p.scoring == int(Scoring::Softmax)) s[i] /= sum;
    choice[i] += s[i];
  }
  if (p.group_rank != int(GroupRank::None) && p.n_group > 1) {
    // Group scores through shared memory: lane g < n_group ranks group g from its `per` choices.
    extern __shared__ float smem[];
    float* cs = smem + warp * p.E;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (i * 32 + lane < p.E) cs[i * 32 + lane] = choice[i];
    __syncwarp();
    const int per = int(p.E / p.n_group);
    float gscore = -INFINITY;
    if (lane < p.n_group) {  // top-1 (Max) or top-1 + top-2 (SumTop2) of the group's choices
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int e = lane * per; e < (lane + 1) * per; ++e) {
        float c = cs[e];
        if (c > m1) m2 = m1, m1 = c;
        else if (c > m2) m2 = c;
      }
      gscore = p.group_rank == int(GroupRank::Max) ? m1 : m1 + (per > 1 ? m2 : 0.f);
    }
    bool kept = false;
    for (int r = 0; r < p.topk_group; ++r) {  // best groups first, ties to the lower group (stable sort)
      float v = (lane < p.n_group && !kept) ? gscore : -INFINITY;
      int idx = (lane < p.n_group && !kept) ? lane : -1;
      warp_argmax(v, idx);
      if (lane == idx) kept = true;
    }
    const uint32_t kept_groups = __ballot_sync(kAll, kept);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int e = i * 32 + lane;
      if (e < p.E && !((kept_groups >> (e / per)) & 1u)) choice[i] = 0.f;  // the reference masks with 0
    }
  }
  uint32_t key[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) key[i] = i * 32 + lane < p.E ? order_key(choice[i]) : 0u;
  float wsum = 0.f, my_s = 0.f;
  int my_id = 0;
  for (int j = 0; j < p.K; ++j) {
    uint32_t best = 0u;  // the lane's largest key, its lowest slot on ties (strict >)
    int slot = 0;
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (key[i] > best) best = key[i], slot = i;
    const uint32_t top = __reduce_max_sync(kAll, best);
    const int e = int(__reduce_min_sync(kAll, best == top ? uint32_t(slot * 32 + lane) : kAll));
    float se = 0.f;  // the owner lane takes e out of the running and hands over its score
#pragma unroll
    for (int i = 0; i < NV; ++i)
      if (i * 32 + lane == e) key[i] = 0u, se = s[i];
    se = __shfl_sync(kAll, se, e % 32);
    wsum += se;  // in pick order, as the CPU op sums
    if (lane == j) my_id = e, my_s = se;
  }
  const float norm = p.renormalize ? 1.0f / (wsum + 1e-20f) : 1.0f;
  int32_t* id_out = ids + t * p.C;
  float* w_out = weights + t * p.C;
  if (lane < p.K) id_out[lane] = my_id, w_out[lane] = my_s * (norm * p.scale);
  if (lane == 0 && p.fused > 0) id_out[p.K] = int32_t(p.E + t % p.fused), w_out[p.K] = 1.0f;  // the shared expert's replica
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

}  // namespace

void moe_topk(const Tensor& logits, const Tensor* bias, const RouterParams& p, Tensor& ids, Tensor& weights) {
  const int64_t T = logits.size(0), E = logits.size(1), K = p.top_k;
  const int fused = fused_shared_replicas(p);
  const int64_t C = K + (fused > 0 ? 1 : 0);
  MS_CHECK(ids.size(1) == C && weights.size(1) == C && K <= E, "moe_topk: top_k ", K, " of ", E, " experts into ",
           ids.describe());
  MS_CHECK(K <= 32 && E <= 1024, "moe_topk: top_k ", K, " of ", E, " experts (the kernel takes at most 32 of 1024)");
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
  int nv = 1;  // experts a lane: a power of two, 32 * nv >= E
  while (32 * nv < E) nv *= 2;
  const bool grouped = p.group_rank != GroupRank::None && p.n_group > 1;
  const size_t smem = grouped ? size_t(kWarpsPerBlock) * E * sizeof(float) : 0;
  MS_FLOAT_DISPATCH(logits.dtype(), TL,
    launch_topk<TL>(nv, blocks_for(T, kWarpsPerBlock), smem, logits.data<TL>(), tp, ids.data<int32_t>(),
                    weights.data<float>()));
  MS_CUDA_LAUNCHED("topk_kernel");
}

}  // namespace ms::cuda
