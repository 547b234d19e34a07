// The merge of split-KV partial softmaxes, by the attention op's merge kernels (attention.cu)
// and by MLA's merge + expansion (mla_absorb.cu): one copy of the arithmetic, so that both give
// the same bits.
//   out[row] = sum_z e^(m_z - M) acc_z / sum_z e^(m_z - M) l_z   over the splits z.
#pragma once
#include <type_traits>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// A split-KV kernel's partials: acc [splits][rows][dv] (unnormalised output), ml [splits][rows]
// (max in natural-log units, sum). A row is one (query, head); an empty split has (-inf, 0).
struct SplitPartials {
  const float* acc;
  const float* ml;
  int64_t rows;
  int dv, splits;
};

constexpr int kFewSplits = 16;     // the most splits merge_few loads at once
constexpr int kCombineWarps = 16;  // merge_many's warps, each merging every 16th split
constexpr int kCombineBatch = 8;   // splits a warp loads before it merges them: 128 a pass
constexpr int kCombineCols = 32;   // V-wide pieces a merge_many block writes: one a lane

#ifdef __CUDACC__

// Up to NS splits: V-float piece `col` of `row`, every split's (m, l) and piece loaded at once
// (one round trip to L2, where the partials were just written). out: the piece, normalised.
template <int V, int NS>
__device__ __forceinline__ void merge_few(const SplitPartials& p, int64_t row, int col, float (&out)[V]) {
  using Vec = std::conditional_t<V == 4, float4, float2>;
  float2 ml[NS];
  Vec a[NS];
#pragma unroll
  for (int z = 0; z < NS; ++z) {
    const bool in = z < p.splits;
    ml[z] = in ? reinterpret_cast<const float2*>(p.ml)[z * p.rows + row] : make_float2(-INFINITY, 0.f);
    a[z] = in ? reinterpret_cast<const Vec*>(p.acc + (z * p.rows + row) * p.dv)[col] : Vec{};
  }
  float M = -INFINITY;
#pragma unroll
  for (int z = 0; z < NS; ++z) M = fmaxf(M, ml[z].x);
  float acc[V] = {}, L = 0.f;
#pragma unroll
  for (int z = 0; z < NS; ++z) {
    const float w = ml[z].x == -INFINITY ? 0.f : expf(ml[z].x - M);  // an empty split weighs nothing
    const float* af = reinterpret_cast<const float*>(&a[z]);
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] += w * af[i];
    L += w * ml[z].y;
  }
  const float inv = L > 0.f ? 1.0f / L : 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = acc[i] * inv;
}

template <int V, int WARPS = kCombineWarps>
struct MergeManyScratch {
  float acc[WARPS][kCombineCols * V];
  float2 ml[WARPS];
};

// More splits than a row's pieces alone can keep in flight: called by every thread of a block of
// WARPS warps (it has a barrier), which merges dims [c 32V, (c + 1) 32V) of `row`. Each warp
// loads the (m, l) and the V-float piece of kCombineBatch of its splits at once and merges them
// online; the warps' merges meet in shared memory. Returns dim c 32V + threadIdx.x for the
// block's first 32V threads (garbage past dv and for the other threads). The bits depend on WARPS.
template <int V, int WARPS = kCombineWarps>
__device__ __forceinline__ float merge_many(const SplitPartials& p, int64_t row, int c,
                                            MergeManyScratch<V, WARPS>& s) {
  using Vec = std::conditional_t<V == 4, float4, float2>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = c * kCombineCols + lane;  // in V-wide pieces
  const bool in = col * V < p.dv;
  float m = -INFINITY, l = 0.f, acc[V] = {};
  for (int z0 = warp; z0 < p.splits; z0 += WARPS * kCombineBatch) {
    float2 ml[kCombineBatch];
    Vec a[kCombineBatch];
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      const int64_t z = z0 + b * WARPS;
      ml[b] = z < p.splits ? reinterpret_cast<const float2*>(p.ml)[z * p.rows + row] : make_float2(-INFINITY, 0.f);
      a[b] = z < p.splits && in ? reinterpret_cast<const Vec*>(p.acc + (z * p.rows + row) * p.dv)[col] : Vec{};
    }
#pragma unroll
    for (int b = 0; b < kCombineBatch; ++b) {
      const float m_new = fmaxf(m, ml[b].x);
      if (m_new == -INFINITY) continue;  // no keys so far, nor in this split (uniform over the warp)
      const float keep = expf(m - m_new), w = expf(ml[b].x - m_new);  // an empty split weighs nothing
      const float* af = reinterpret_cast<const float*>(&a[b]);
#pragma unroll
      for (int i = 0; i < V; ++i) acc[i] = acc[i] * keep + af[i] * w;
      l = l * keep + ml[b].y * w, m = m_new;
    }
  }
#pragma unroll
  for (int i = 0; i < V; ++i) s.acc[warp][lane * V + i] = acc[i];
  if (lane == 0) s.ml[warp] = make_float2(m, l);
  __syncthreads();
  if (threadIdx.x >= kCombineCols * V) return 0.f;
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) M = fmaxf(M, s.ml[w].x);
  float total = 0.f, L = 0.f;
#pragma unroll
  for (int w = 0; w < WARPS; ++w) {
    const float f = s.ml[w].x == -INFINITY ? 0.f : expf(s.ml[w].x - M);
    total += f * s.acc[w][threadIdx.x], L += f * s.ml[w].y;
  }
  return L > 0.f ? total / L : 0.f;
}

#endif  // __CUDACC__

}  // namespace ms::cuda
