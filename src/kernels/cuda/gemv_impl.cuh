// What the two weight-streaming kernels share (gemv.cu, the registers-only one, and gemv_bulk.cu,
// the one whose weights arrive in shared memory by bulk copies): their parameters, the loads and
// conversion of 16-k pieces, the mma over one piece with its fragment permutation (gemv.cu's
// header), and the epilogue that sums the warps' partials in shared memory and stores.
#pragma once
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/mma.h"

namespace ms::cuda::gemv_detail {

constexpr int kChunk = 64;   // k per warp step: 16 per lane of a quad
constexpr int kSlab = 16;    // output features per mma tile

struct GemvParams {
  GemvWeights w;
  GemvRows rows;
  GemvInput in;
  void* out;
  int64_t out_ld;
  const float* bias;
  int N, K, chunks, slabs;
  RouteTail route;  // read by the kernels with NV > 0 only
};

// 16 weights (lo, and hi for BF16's second 8) as 8 bf16 pairs; FP8 codes times their block scale.
template <bool FP8>
__device__ __forceinline__ void to_bf16(uint4 lo, uint4 hi, float scale, uint32_t (&w)[8]) {
  if constexpr (FP8) {
    const uint32_t words[4] = {lo.x, lo.y, lo.z, lo.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float f[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) f[b] = fp8_to_f(uint8_t(words[i] >> (8 * b))) * scale;
      w[2 * i] = pack_bf16(f[0], f[1]), w[2 * i + 1] = pack_bf16(f[2], f[3]);
    }
  } else {
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
  }
}

// The FP8 block scale of weight (n, k), 0 past N or K.
__device__ __forceinline__ float fp8_scale(const GemvParams& p, const float* S, int n, int k) {
  return n < p.N && k < p.K ? S[int64_t(n / p.w.block_n) * p.w.scale_ld + k / p.w.block_k] : 0.f;
}

// 16 weights of row n at k0 as 8 bf16 pairs (zeros past N or K).
template <bool FP8>
__device__ __forceinline__ void load_weights(const GemvParams& p, const char* W, const float* S, int n, int k0,
                                             uint32_t (&w)[8]) {
  uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
  if (n < p.N && k0 < p.K) {
    if constexpr (FP8) {
      lo = __ldg(reinterpret_cast<const uint4*>(W + int64_t(n) * p.w.ld + k0));
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(W + (int64_t(n) * p.w.ld + k0) * 2);
      lo = __ldg(src);
      if (k0 + 8 < p.K) hi = __ldg(src + 1);
    }
  }
  to_bf16<FP8>(lo, hi, FP8 ? fp8_scale(p, S, n, k0) : 0.f, w);
}

// 16 inputs of source row `src` (< 0: none) at k0 as 8 bf16 pairs.
__device__ __forceinline__ void load_inputs(const GemvParams& p, int src, int k0, uint32_t (&x)[8]) {
  uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
  if (src >= 0 && k0 < p.K) {
    const uint4* s = reinterpret_cast<const uint4*>(p.in.x + int64_t(src) * p.in.x_ld + k0);
    lo = __ldg(s);
    if (k0 + 8 < p.K) hi = __ldg(s + 1);
  }
  x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
}

// acc += one 16-k piece: weight rows g and g + 8 (w[0], w[1]) times input row g, the A and B
// operands permuted alike (k order does not matter to a dot product).
__device__ __forceinline__ void mma_piece(float (&acc)[4], const uint32_t (&w)[2][8], const uint32_t (&x)[8]) {
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t frag[4] = {w[0][2 * s], w[1][2 * s], w[0][2 * s + 1], w[1][2 * s + 1]};
    mma_bf16(acc, frag, x[2 * s], x[2 * s + 1]);
  }
}

template <class TO>
__device__ __forceinline__ void store_out(const GemvParams& p, int row, int n, float v) {
  store_f(static_cast<TO*>(p.out) + int64_t(row) * p.out_ld + n, v);
}

// red is [S warps][MATS][NT][16 features][8 rows]. Lane (g, q) holds features g and g + 8 for
// rows 2q and 2q + 1 of each tile of rows.
template <int MATS, int NT>
__device__ __forceinline__ void stash_partials(float* red, int warp, int lane, const float (&acc)[MATS][NT][4]) {
  const int g = lane / 4, q = lane % 4;
#pragma unroll
  for (int m = 0; m < MATS; ++m)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float* r = red + (((warp * MATS + m) * NT + t) * kSlab) * 8;
      r[g * 8 + 2 * q] = acc[m][t][0], r[g * 8 + 2 * q + 1] = acc[m][t][1];
      r[(g + 8) * 8 + 2 * q] = acc[m][t][2], r[(g + 8) * 8 + 2 * q + 1] = acc[m][t][3];
    }
}

// After a __syncthreads: sums the S warps' partials of slab n0 for rows [pass, min(pass + NT * 8,
// r_end)) and stores them (+ bias, or silu(gate) * up for a SwiGLU pair).
template <class TO, bool SWIGLU, int NT>
__device__ __forceinline__ void reduce_store(const GemvParams& p, const float* red, int S, int pass, int r_end,
                                             int n0) {
  constexpr int MATS = SWIGLU ? 2 : 1;
  for (int i = threadIdx.x; i < NT * 8 * kSlab; i += blockDim.x) {
    const int t = i / (8 * kSlab), row8 = (i / kSlab) % 8, f = i % kSlab;
    const int row = pass + t * 8 + row8, n = n0 + f;
    if (row >= r_end || n >= p.N) continue;
    float v[MATS];
#pragma unroll
    for (int m = 0; m < MATS; ++m) {
      v[m] = 0.f;
      for (int w = 0; w < S; ++w) v[m] += red[(((w * MATS + m) * NT + t) * kSlab + f) * 8 + row8];
    }
    float out = v[0];
    if constexpr (SWIGLU) out = v[0] / (1.0f + expf(-v[0])) * v[MATS - 1];
    else if (p.bias) out += p.bias[n];
    store_out<TO>(p, row, n, out);
  }
}

// The bulk variant (gemv_bulk.cu) where it takes the product: at most 8 rows (every group's rows
// one tile), no router tail; false leaves it to gemv_kernel. blocks_y: 0 or a tuning override.
bool gemv_bulk(const GemvParams& p, DType out_dtype, bool swiglu, int blocks_y);

}  // namespace ms::cuda::gemv_detail
