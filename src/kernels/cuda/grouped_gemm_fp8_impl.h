// What grouped_gemm_fp8.cu (the mma.sync shapes, the split-K launch, the choice of shape) shares
// with grouped_gemm_fp8_wgmma.cu (the Hopper shapes): the kernel parameters, the dequantisation
// of two e4m3 to bf16, the output store, and the launch. Device code only: include from .cu files.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/mma.h"

namespace ms::cuda::grouped_fp8 {

constexpr int kBN = 128;  // weight rows a block tile (64 gate + 64 up columns with SwiGLU), every shape

struct Params {
  int N, K;
  const bf16* a;
  int64_t a_ld;
  const int32_t* a_rows;
  const uint8_t* const* w;
  const uint8_t* const* w2;
  const float* const* s;
  const float* const* s2;
  const uint8_t* w_one;
  const uint8_t* w2_one;
  const float* s_one;
  const float* s2_one;
  int64_t w_ld, s_ld;
  const int32_t* offsets;  // null: one group of dense_rows rows
  const int32_t* tile_start;
  int experts, dense_rows;
  void* c;
  int64_t c_ld;
  bool c_f32, pair_stores;
  int k_split;      // K elements a grid.z slice covers (a multiple of BK)
  int64_t c_split;  // elements between successive slices' outputs
};

// Two e4m3 (low byte first) times the scale, as a bf16 pair: e4m3 -> f16 is exact, so this is
// bf16(float(e4m3) * s) for each.
__device__ __forceinline__ uint32_t fp8x2_bf16x2(uint32_t two, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return pack_bf16(f.x * s, f.y * s);
}

// The same values without the e4m3 conversion instruction ("int" dequantisation). Hopper's
// conversion unit retires 16 results a clock an SM (the CUDA guide's "other conversions"), and
// the path above spends two per two weights (e4m3x2 -> f16x2, f32 pair -> bf16x2): one a weight
// caps an SM at 16 weights a clock, what HBM (4.3 TB/s / 132 SMs / ~1.9 GHz) needs at 100% of
// that unit. Here e4m3 -> f16 is integer ops (64 a clock), seven for four weights: a byte
// p = [s eeee mmm] becomes the f16 [s 0 eeee mmm 0000000] (its high byte: the sign and p's bits
// 6..1, from q and q >> 1; its low byte: p's bit 0 at the top, from q << 7; one byte permute
// pairs them for two weights), whose value is float(e4m3) * 2^-8 exactly, subnormals included
// (exponent field 0 in both: 0.mmm * 2^-14 = (0.mmm * 2^-6) * 2^-8). That times s * 2^8 (exact,
// a power of two, for any scale below 2^120) is the same real product as float(e4m3) * s, so the
// same f32 rounding and the same bf16; the f16 -> f32 steps run on the FMA pipes, and one
// conversion (the bf16 pack) is left a pair. The one difference: code 0x7f / 0xff (NaN in e4m3)
// reads as +-480 instead of NaN; weights never hold it.
template <bool INT_DEQ>
__device__ __forceinline__ float fp8_scale(float s) {
  return INT_DEQ ? s * 256.f : s;
}
__device__ __forceinline__ uint32_t f16x2_bf16x2(uint32_t h, float s) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
  return pack_bf16(f.x * s, f.y * s);
}
// Four e4m3 (low byte first) times s (fp8_scale's) as bf16 pairs: bytes 0, 1 in lo, 2, 3 in hi.
template <bool INT_DEQ>
__device__ __forceinline__ void fp8x4_bf16x4(uint32_t q, float s, uint32_t& lo, uint32_t& hi) {
  if constexpr (INT_DEQ) {
    const uint32_t high = (q & 0x80808080u) | ((q >> 1) & 0x3f3f3f3fu);  // each byte [s 0 eeee m2 m1]
    const uint32_t low = (q << 7) & 0x80808080u;                         // each byte [m0 0000000]
    lo = f16x2_bf16x2(__byte_perm(low, high, 0x5140), s);  // [high 1, low 1, high 0, low 0]
    hi = f16x2_bf16x2(__byte_perm(low, high, 0x7362), s);  // [high 3, low 3, high 2, low 2]
  } else {
    lo = fp8x2_bf16x2(q & 0xffffu, s);
    hi = fp8x2_bf16x2(q >> 16, s);
  }
}

__device__ __forceinline__ void store_pair(const Params& p, int64_t off, float lo, float hi, bool has_hi) {
  if (p.c_f32) {
    float* c = static_cast<float*>(p.c) + off;
    if (p.pair_stores && has_hi) {
      *reinterpret_cast<float2*>(c) = make_float2(lo, hi);
    } else {
      c[0] = lo;
      if (has_hi) c[1] = hi;
    }
    return;
  }
  bf16* c = static_cast<bf16*>(p.c) + off;
  if (p.pair_stores && has_hi) {
    *reinterpret_cast<__nv_bfloat162*>(c) = __floats2bfloat162_rn(lo, hi);
  } else {
    c[0] = __float2bfloat16_rn(lo);
    if (has_hi) c[1] = __float2bfloat16_rn(hi);
  }
}

// One shape's kernels (plain and SwiGLU) and what their launch needs.
struct Kernels {
  void (*plain)(Params);
  void (*swiglu)(Params);
  int bk, threads;
  size_t smem;
};

// Launches a shape over row_tiles row tiles (grouped_gemm_fp8.cu): a dense plain product of too
// few blocks splits K over grid.z into an F32 scratch, summed in order by a second kernel.
void launch(Params p, int64_t row_tiles, bool swiglu, int64_t max_rows, const Kernels& k);

// The wgmma shapes (grouped_gemm_fp8_wgmma.cu), bm 64 or 128; sm_90a only. int_deq: the
// kernels that dequantise with fp8x4_bf16x4's integer ops.
void launch_wgmma(const Params& p, int64_t row_tiles, bool swiglu, int64_t max_rows, int bm, bool int_deq);

}  // namespace ms::cuda::grouped_fp8
