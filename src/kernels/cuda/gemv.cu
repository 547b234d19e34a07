// The weight-streaming product (gemv.h). A block of 8 warps serves one group and a run of
// output tiles; its input rows are staged once in shared memory as f32. Within a tile the 8 warps
// are G row-groups x S splits of K: every lane streams 16-byte chunks of RW weight rows (of two
// matrices for SwiGLU), converts them to f32 once and multiplies them against up to 8 input rows,
// so one shared-memory read feeds RW x (1 or 2) FMAs. Partial sums are reduced across the warp by
// a transpose (31 shuffles for 32 sums) and across the S splits through shared memory.
#include "kernels/cuda/gemv.h"

#include <algorithm>

namespace ms::cuda {
namespace {

constexpr int kWarps = 8, kMR = 8, kNV = 32;  // kNV = RW * mats * kMR sums per lane
constexpr size_t kSmemBudget = 160 * 1024;

struct GemvParams {
  GemvWeights w;
  GemvRows rows;
  GemvInput in;
  void* out;
  int64_t out_ld;
  const float* bias;
  int N, K, S, G, rows_cap, tiles;
};

// Lane L ends with the warp's total of v[L] (recursive halving: each step trades half the values).
__device__ __forceinline__ float transpose_reduce(float (&v)[kNV], int lane) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) {
    const bool upper = lane & o;
#pragma unroll
    for (int i = 0; i < o; ++i) {
      const float send = upper ? v[i] : v[i + o], keep = upper ? v[i + o] : v[i];
      v[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
  return v[0];
}

// Eight weights of a 16-byte chunk as f32 (half h of an fp8 chunk, the whole of a bf16 one).
template <bool FP8>
__device__ __forceinline__ void convert8(const uint4& raw, int h, float scale, float (&out)[8]) {
  if constexpr (FP8) {
    const uint32_t words[2] = {h ? raw.z : raw.x, h ? raw.w : raw.y};
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = fp8_to_f(uint8_t(words[i / 4] >> (8 * (i % 4)))) * scale;
  } else {
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[i]));
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  }
}

template <bool FP8>
__device__ __forceinline__ const void* group_ptr(const void* const* arr, const void* one, int g) {
  return arr ? arr[g] : one;
}

// Stages input rows [first, first + n) as f32 rows of K in shared memory.
__device__ void stage_rows(const GemvParams& p, int first, int n, float* xs) {
  const int chunks = p.K / 8;
  for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
    const int r = i / chunks, c = i % chunks;
    const int src = p.in.x_rows ? p.in.x_rows[first + r] : first + r;
    const uint4 raw = *reinterpret_cast<const uint4*>(p.in.x + int64_t(src) * p.in.x_ld + c * 8);
    float f[8];
    convert8<false>(raw, 0, 1.f, f);
    float4* dst = reinterpret_cast<float4*>(xs + int64_t(r) * p.K + c * 8);
    dst[0] = make_float4(f[0], f[1], f[2], f[3]);
    dst[1] = make_float4(f[4], f[5], f[6], f[7]);
  }
}

// Sums of one warp for rows [n0, n0 + RW) against staged rows [m0, m0 + mr): acc[(r * MATS + mat) * kMR + m].
template <bool FP8, bool SWIGLU>
__device__ void tile_sums(const GemvParams& p, const char* const (&W)[2], const float* const (&SC)[2], int n0,
                          const float* xs, int m0, int mr, int s, int lane, float (&acc)[kNV]) {
  constexpr int RW = SWIGLU ? 2 : 4, MATS = SWIGLU ? 2 : 1, E = FP8 ? 16 : 8, Q = RW * MATS;
  constexpr int esize = FP8 ? 1 : 2;
  const int chunks = p.K / E;
#pragma unroll
  for (int i = 0; i < kNV; ++i) acc[i] = 0.f;
  for (int c = s * 32 + lane; c < chunks; c += 32 * p.S) {
    uint4 raw[Q];
    float scale[Q];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      const int n = n0 + q / MATS, mat = q % MATS;
      raw[q] = make_uint4(0, 0, 0, 0);
      scale[q] = 1.f;
      if (n < p.N) {
        raw[q] = __ldg(reinterpret_cast<const uint4*>(W[mat] + (int64_t(n) * p.w.ld + int64_t(c) * E) * esize));
        if constexpr (FP8) scale[q] = SC[mat][int64_t(n / p.w.block_n) * p.w.scale_ld + (c * E) / p.w.block_k];
      }
    }
#pragma unroll
    for (int h = 0; h < E / 8; ++h) {
      float wf[Q][8];
#pragma unroll
      for (int q = 0; q < Q; ++q) convert8<FP8>(raw[q], h, scale[q], wf[q]);
      const int k = c * E + h * 8;
#pragma unroll
      for (int m = 0; m < kMR; ++m) {
        if (m >= mr) break;
        const float4* xr = reinterpret_cast<const float4*>(xs + int64_t(m0 + m) * p.K + k);
        const float4 a = xr[0], b = xr[1];
        const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int q = 0; q < Q; ++q) {
          float d = acc[q * kMR + m];
#pragma unroll
          for (int i = 0; i < 8; ++i) d = fmaf(wf[q][i], xv[i], d);
          acc[q * kMR + m] = d;
        }
      }
    }
  }
}

template <class TO>
__device__ __forceinline__ void store_out(const GemvParams& p, int row, int n, float v) {
  store_f(static_cast<TO*>(p.out) + int64_t(row) * p.out_ld + n, v);
}

template <bool FP8, class TO, bool SWIGLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvParams p) {
  constexpr int RW = SWIGLU ? 2 : 4, MATS = SWIGLU ? 2 : 1;
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  float* red = xs + int64_t(p.rows_cap) * p.K;  // [kWarps][32]
  int group = 0;
  if (p.rows.active) {
    if (int(blockIdx.x) >= *p.rows.n_active) return;
    group = p.rows.active[blockIdx.x];
  }
  const int r_begin = p.rows.offsets ? p.rows.offsets[group] : 0;
  const int r_end = p.rows.offsets ? p.rows.offsets[group + 1] : p.rows.rows;
  const char* const W[2] = {static_cast<const char*>(group_ptr<FP8>(p.w.w, p.w.w_one, group)),
                            static_cast<const char*>(group_ptr<FP8>(p.w.w2, p.w.w2_one, group))};
  const float* const SC[2] = {FP8 ? (p.w.s ? p.w.s[group] : p.w.s_one) : nullptr,
                              FP8 ? (p.w.s2 ? p.w.s2[group] : p.w.s2_one) : nullptr};
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, s = warp % p.S, g = warp / p.S;
  for (int pass = r_begin; pass < r_end; pass += p.rows_cap) {
    const int np = min(p.rows_cap, r_end - pass);
    __syncthreads();  // the previous pass has finished reading xs
    stage_rows(p, pass, np, xs);
    __syncthreads();
    for (int tile = blockIdx.y; tile < p.tiles; tile += gridDim.y) {
      const int n0 = (tile * p.G + g) * RW;
      for (int m0 = 0; m0 < np; m0 += kMR) {
        float acc[kNV];
        tile_sums<FP8, SWIGLU>(p, W, SC, n0, xs, m0, min(kMR, np - m0), s, lane, acc);
        red[warp * 32 + lane] = transpose_reduce(acc, lane);
        __syncthreads();
        const int per_group = RW * kMR;
        if (int(threadIdx.x) < p.G * per_group) {
          const int g2 = threadIdx.x / per_group, r = (threadIdx.x % per_group) / kMR, m = threadIdx.x % kMR;
          const int n = (tile * p.G + g2) * RW + r, row = pass + m0 + m;
          float v[MATS];
#pragma unroll
          for (int mat = 0; mat < MATS; ++mat) {
            v[mat] = 0.f;
            for (int s2 = 0; s2 < p.S; ++s2) v[mat] += red[(g2 * p.S + s2) * 32 + (r * MATS + mat) * kMR + m];
          }
          if (n < p.N && m0 + m < np) {
            float out = v[0];
            if constexpr (SWIGLU) out = v[0] / (1.0f + expf(-v[0])) * v[1];
            else if (p.bias) out += p.bias[n];
            store_out<TO>(p, row, n, out);
          }
        }
        __syncthreads();
      }
    }
  }
}

template <bool FP8, class TO, bool SWIGLU>
void launch(const GemvParams& p, dim3 grid, size_t smem) {
  auto kernel = gemv_kernel<FP8, TO, SWIGLU>;
  static const bool raised = [&] {
    MS_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBudget + kWarps * 32 * sizeof(float))));
    return true;
  }();
  (void)raised;
  kernel<<<grid, kWarps * 32, smem, stream()>>>(p);
  MS_CUDA_LAUNCHED("gemv_kernel");
}

template <bool FP8, bool SWIGLU>
void dispatch_out(const GemvParams& p, DType dtype, dim3 grid, size_t smem) {
  if (dtype == DType::BF16) launch<FP8, bf16, SWIGLU>(p, grid, smem);
  else if (dtype == DType::F32) launch<FP8, float, SWIGLU>(p, grid, smem);
  else fail("gemv: unsupported output dtype ", dtype_name(dtype));
}

}  // namespace

bool gemv_supported(int64_t K, int64_t w_ld, bool fp8, const void* x, int64_t x_ld) {
  const int64_t E = fp8 ? 16 : 8;
  return K > 0 && K % E == 0 && (w_ld * (fp8 ? 1 : 2)) % 16 == 0 && x_ld % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0 && size_t(K) * sizeof(float) <= kSmemBudget;
}

void gemv(int64_t N, int64_t K, const GemvWeights& w, const GemvRows& rows, const GemvInput& in,
          const GemvOutput& out, bool swiglu) {
  MS_CHECK(gemv_supported(K, w.ld, w.fp8, in.x, in.x_ld), "gemv: unsupported shape K=", K);
  if (N == 0 || rows.rows == 0) return;
  GemvParams p{w, rows, in, out.out, out.out_ld, out.bias, int(N), int(K), 8, 1, 1, 0};
  // Split K over the warps only while every lane keeps at least two chunks to stream.
  const int chunks = int(K / (w.fp8 ? 16 : 8));
  while (p.S > 1 && chunks < 64 * p.S) p.S /= 2;
  p.G = kWarps / p.S;
  const int rw = swiglu ? 2 : 4;
  p.tiles = int((N + int64_t(p.G) * rw - 1) / (int64_t(p.G) * rw));
  const int fit = int(kSmemBudget / (size_t(K) * sizeof(float)));
  // At most kMR staged rows: decode groups rarely have more, and small staging lets several
  // blocks share a multiprocessor; many blocks per group keep the tiles a block walks through
  // in sequence (one memory round trip each) few.
  p.rows_cap = std::min({rows.rows, fit, kMR});
  const int per_group = std::max(1, (16 * sm_count() + rows.expected_groups - 1) / rows.expected_groups);
  dim3 grid(unsigned(rows.max_groups), unsigned(std::min(p.tiles, per_group)));
  const size_t smem = size_t(p.rows_cap) * K * sizeof(float) + kWarps * 32 * sizeof(float);
  if (w.fp8) {
    if (swiglu) dispatch_out<true, true>(p, out.dtype, grid, smem);
    else dispatch_out<true, false>(p, out.dtype, grid, smem);
  } else {
    if (swiglu) dispatch_out<false, true>(p, out.dtype, grid, smem);
    else dispatch_out<false, false>(p, out.dtype, grid, smem);
  }
}

}  // namespace ms::cuda
