// The router's top-k of one token on the GPU, shared by moe_topk's kernel (moe.cu) and the
// router product that runs it in its last block (gemv.cu, for decode batches): one copy of the
// routing rules. One warp a token runs the CPU op's algorithm step for step, in registers (same
// scores, same group ranking with ties to the lower index, non-selected groups masked to 0,
// top-k ties to the lower expert id, weights summed in pick order). Also the sort of the chosen
// (token, slot) pairs by expert, shared by align_kernel (moe_grouped.cu) and that last block.
#pragma once
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {

struct TopkParams {
  int64_t T, E, ls;
  int K, C, fused, pieces, scoring, group_rank, n_group, topk_group, renormalize;  // C: K + the fused slots
  float scale;
  const float* bias;
};

// Pairs of ids [T, K] sorted by expert, for experts [first, first + experts): offsets
// [experts + 1] (rows of each expert), active [experts] with n_active [1] (the experts that have
// rows, in order), token_of_row [T * K] and row_of [T * K] (-1 for an expert outside the range).
struct SortedPairs {
  int32_t *offsets = nullptr, *active = nullptr, *n_active = nullptr, *token_of_row = nullptr, *row_of = nullptr;
  int experts = 0;
};

// What the router product's last block does with its finished logits [T, E] (row stride
// tp.ls): the top-k of every row into ids / weights [T, C], then, when sort.offsets is set, the
// sort of those T * C pairs over experts [0, sort.experts). nv: experts a lane (32 * nv >= E).
struct RouteTail {
  TopkParams tp;
  int32_t* ids;
  float* weights;
  int nv;
  SortedPairs sort;
};

// Experts a lane up to which the router product takes the top-k (256 experts: the kernels it
// instantiates).
constexpr int kRouteMaxLanes = 8;

// Experts a lane: the smallest power of two with 32 * nv >= E.
inline int topk_lanes(int64_t E) {
  int nv = 1;
  while (32 * nv < E) nv *= 2;
  return nv;
}
// Shared memory a warp needs (group scores of a grouped selection), in bytes.
inline size_t topk_warp_smem(const TopkParams& p) {
  const bool grouped = p.group_rank != int(GroupRank::None) && p.n_group > 1;
  return grouped ? size_t(p.E) * sizeof(float) : 0;
}
// Shared memory the sort of pairs over E experts needs (counts and cursors), in bytes.
inline size_t sort_pairs_smem(int E) { return size_t(2) * E * sizeof(int32_t); }

// linear() of x by the router's weight into F32 logits whose streaming product (the path linear
// takes for this shape) also runs `tail` in the block that finishes last: true when it did so,
// false (nothing launched) when linear would take another path. Defined in linear.cu.
bool linear_then_topk(const Tensor& x, const ops::Weight& w, const Tensor* bias, Tensor& logits,
                      const RouteTail& tail);

#ifdef __CUDACC__

// Index of the largest value among lanes (ties: lower index); idx < 0 marks "no candidate".
__device__ __forceinline__ void warp_argmax(float& v, int& idx) {
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

// F32 logits are read past L1 (__ldcg): in the fused path other blocks wrote them during this
// kernel, and L1 is not coherent with their writes.
template <class TL>
__device__ __forceinline__ float load_logit(const TL* p) {
  if constexpr (std::is_same_v<TL, float>) return __ldcg(p);
  else return load_f(p);
}

// Token t's top-k by the calling warp (all 32 lanes) from its logits in registers: expert
// e = i * 32 + lane in x[i] of a lane (32 * NV >= E; -inf past E). The selection keeps everything
// in registers: each of the K rounds is a lane's scan of its NV keys and two warp reductions
// (largest key, then the lowest expert holding it: the CPU op's tie rule). Lane j keeps the j-th
// pick, so ids and weights are written once, together, at the end. cs: this warp's E floats of
// shared memory (used by a grouped selection only).
template <int NV>
__device__ __forceinline__ void topk_select(const float (&x)[NV], const TopkParams& p, int64_t t, float* cs,
                                            int32_t* ids, float* weights) {
  constexpr uint32_t kAll = 0xffffffffu;
  const int lane = threadIdx.x % 32;
  float s[NV], choice[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int e = i * 32 + lane;
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
    __syncwarp();  // cs is rewritten by this warp's next token
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
  if (p.fused > 0 && lane < p.pieces)  // the pieces of the shared expert's replica for token t
    id_out[p.K + lane] = int32_t(p.E + (t % p.fused) * p.pieces + lane), w_out[p.K + lane] = 1.0f;
}

// The same from token t's logits in memory (row: E of them).
template <class TL, int NV>
__device__ __forceinline__ void topk_row(const TL* row, const TopkParams& p, int64_t t, float* cs, int32_t* ids,
                                         float* weights) {
  const int lane = threadIdx.x % 32;
  float x[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) x[i] = i * 32 + lane < p.E ? load_logit(row + i * 32 + lane) : -INFINITY;
  topk_select<NV>(x, p, t, cs, ids, weights);
}

// By one warp (lane = its lane): the exclusive scan of counts[0, out.experts) 32 experts a step
// into out.offsets (and first_row, which may be counts itself: each lane reads its expert's count
// before it writes there), the experts with rows in order into out.active, and their number.
__device__ __forceinline__ void scan_expert_counts(const int32_t* counts, const SortedPairs& out, int32_t* first_row,
                                                   int lane) {
  const int E = out.experts;
  int base = 0, abase = 0;
  for (int c = 0; c < E; c += 32) {
    const int e = c + lane, cnt = e < E ? counts[e] : 0;
    int incl = cnt;
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const unsigned has = __ballot_sync(0xffffffffu, cnt > 0);
    if (e < E) out.offsets[e] = first_row[e] = base + incl - cnt;
    if (cnt > 0) out.active[abase + __popc(has & ((1u << lane) - 1))] = e;
    base += __shfl_sync(0xffffffffu, incl, 31);
    abase += __popc(has);
  }
  if (lane == 0) out.offsets[E] = base, *out.n_active = abase;
}

// Pairs and experts that sort_few_pairs_by_expert takes.
constexpr int kFewPairs = 32, kFewPairsMaxExperts = 8 * 32;

// sort_pairs_by_expert of at most kFewPairs pairs over at most 32 * CHUNKS experts, by one warp
// (lane = its lane) in registers: lane i holds pair i, and as the pairs are handed round the warp
// each lane counts, for itself, the pairs before its own in (expert, index) order (its row) and,
// for its experts e = lane, lane + 32, ..., the pairs of lower experts (offsets[e]) and of e. No
// shared memory and no barrier: at batch 1 (8 pairs) the block-wide sort's barriers and its scan
// of every expert were ~0.8 us of the router's 5 (BENCHMARKS, session 21).
template <int CHUNKS>
__device__ __forceinline__ void sort_few_pairs_by_expert(const int32_t* ids, int pairs, int K, int first,
                                                         const SortedPairs& out, int lane) {
  constexpr uint32_t kAll = 0xffffffffu;
  constexpr int kOther = 1 << 30;  // the key of another rank's expert: after every local one
  const int E = out.experts;
  const int e_mine = lane < pairs ? ids[lane] - first : -1;
  const bool local = e_mine >= 0 && e_mine < E;
  const int key = local ? e_mine : kOther;
  int row = 0, below[CHUNKS] = {}, at[CHUNKS] = {};
  for (int j = 0; j < pairs; ++j) {
    const int kj = __shfl_sync(kAll, key, j);
    row += kj < key || (kj == key && j < lane);
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) below[c] += kj < c * 32 + lane, at[c] += kj == c * 32 + lane;
  }
  if (lane < pairs) {
    out.row_of[lane] = local ? row : -1;
    if (local) out.token_of_row[row] = lane / K;
  }
  int active = 0;
#pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int e = c * 32 + lane;
    const bool has = e < E && at[c] > 0;
    const unsigned mask = __ballot_sync(kAll, has);
    if (e < E) out.offsets[e] = below[c];
    if (has) out.active[active + __popc(mask & ((1u << lane) - 1))] = e;
    active += __popc(mask);
  }
  const unsigned locals = __ballot_sync(kAll, lane < pairs && local);
  if (lane == 0) out.offsets[E] = __popc(locals), *out.n_active = active;
}

// Called by every thread of one block (it has block-wide barriers): the pairs ids [pairs / K, K]
// sorted by expert into `out` for experts [first, first + out.experts). Counts of each expert,
// their scan by warp 0 (32 experts a step) into row offsets and the list of experts with rows,
// then every pair placed at its expert's next row. Rows of one expert come in any order; each
// row is computed on its own and the combine reads them through row_of, so the result does not
// depend on that order. counts: sort_pairs_smem(out.experts) bytes of shared memory. A few pairs
// are sorted by the first warp alone (sort_few_pairs_by_expert).
__device__ __forceinline__ void sort_pairs_by_expert(const int32_t* ids, int pairs, int K, int first,
                                                     const SortedPairs& out, int32_t* counts) {
  const int E = out.experts;
  if (pairs <= kFewPairs && E <= kFewPairsMaxExperts) {
    const int lane = int(threadIdx.x);
    if (lane >= 32) return;
    if (E <= 64) sort_few_pairs_by_expert<2>(ids, pairs, K, first, out, lane);
    else if (E <= 128) sort_few_pairs_by_expert<4>(ids, pairs, K, first, out, lane);
    else sort_few_pairs_by_expert<8>(ids, pairs, K, first, out, lane);
    return;
  }
  int32_t* cursor = counts + E;
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int e = ids[i] - first;
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  if (threadIdx.x < 32) scan_expert_counts(counts, out, cursor, int(threadIdx.x));
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int e = ids[i] - first;
    int32_t r = -1;
    if (e >= 0 && e < E) {
      r = atomicAdd(&cursor[e], 1);
      out.token_of_row[r] = i / K;
    }
    out.row_of[i] = r;
  }
}

constexpr int kRouteMaxParts = 8;

// The router's last step, by one block: each logit's parts [parts][T][E] summed in order from
// 0.f, plus bias[e] (the linear's own; may be null), as the streaming product sums its warps'
// parts, written to logits [T, E] (row stride r.tp.ls); the top-k of every row, a warp a row;
// then (r.sort) the sort of the chosen pairs by expert, with smem (warps * topk_warp_smem bytes,
// and sort_pairs_smem) free for them. SHARED: the parts are in this block's shared memory (a
// cluster's leader), else in global memory that other blocks wrote.
template <int NV, bool SHARED>
__device__ __forceinline__ void route_tail(const RouteTail& r, const float* part, int parts, const float* bias,
                                           float* logits, float* smem) {
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const int64_t T = r.tp.T, E = r.tp.E;
  for (int64_t t = warp; t < T; t += warps) {
    float sum[NV] = {};  // each logit's parts summed in order from 0.f
    if constexpr (SHARED) {
      // A part in shared memory is a few cycles away: a loop over the parts. (Unrolled, with a
      // predicate for every part and expert of the lane, it cost the top-k warp ~500 of its ~1400
      // instructions: BENCHMARKS, session 24.)
#pragma unroll 1
      for (int s = 0; s < parts; ++s)
#pragma unroll
        for (int i = 0; i < NV; ++i)
          if (i * 32 + lane < E) sum[i] += part[(s * T + t) * E + i * 32 + lane];
    } else {
      // Every part of the lane's NV logits requested before the first is added: one round trip.
      float v[NV][kRouteMaxParts];
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int s = 0; s < kRouteMaxParts; ++s) {
          const int64_t e = i * 32 + lane, at = (s * T + t) * E + e;
          // Past L1: other blocks wrote them.
          v[i][s] = s < parts && e < E ? __ldcg(part + at) : 0.f;
        }
#pragma unroll
      for (int i = 0; i < NV; ++i)
#pragma unroll
        for (int s = 0; s < kRouteMaxParts; ++s)
          if (s < parts) sum[i] += v[i][s];
    }
    float x[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int e = i * 32 + lane;
      x[i] = -INFINITY;
      if (e >= E) continue;
      if (bias) sum[i] += bias[e];
      logits[t * r.tp.ls + e] = x[i] = sum[i];
    }
    topk_select<NV>(x, r.tp, t, smem + warp * E, r.ids, r.weights);
  }
  if (r.sort.offsets) {
    __syncthreads();  // every row's ids written (a barrier makes this block's writes visible to it)
    sort_pairs_by_expert(r.ids, int(T) * r.tp.C, r.tp.C, 0, r.sort, reinterpret_cast<int32_t*>(smem));
  }
}

// Called by every thread of every block of the router's product once its share of the partial
// sums `part` [parts][T][E] is written (and no block-wide barrier of the kernel follows): the
// block that finishes last runs route_tail. `done` counts finished blocks; the last one sets it
// back to 0, so the next launch (or graph replay) starts from 0 with no memset. parts <=
// kRouteMaxParts.
template <int NV>
__device__ __forceinline__ void route_in_last_block(const RouteTail& r, const float* part, int parts,
                                                    const float* bias, float* logits, unsigned* done, float* smem) {
  __shared__ bool last;
  __threadfence();  // this thread's parts visible device-wide before the block counts as done
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == gridDim.x * gridDim.y * gridDim.z - 1;
  __syncthreads();
  if (!last) return;  // the whole block: the barriers below see every thread
  __threadfence();  // every other block's parts, counted before, are seen after this
  route_tail<NV, false>(r, part, parts, bias, logits, smem);
  if (threadIdx.x == 0) *done = 0u;
}

#endif  // __CUDACC__

}  // namespace ms::cuda
