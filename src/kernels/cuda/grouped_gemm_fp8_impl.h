// What grouped_gemm_fp8.cu (the mma.sync shapes, the split-K launch, the choice of shape) shares
// with grouped_gemm_fp8_wgmma.cu (the Hopper shapes): the kernel parameters, the dequantisation
// of two e4m3 to bf16, the output store, and the launch. Device code only: include from .cu files.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/grouped_tiles.cuh"  // GroupTile, find_group_tile, silu_mul
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
  // The FP8-activation shape: A as e4m3 codes [rows][a8_ld] in group-row order (the token index
  // already applied) and their scales [rows][sa_ld], one per 128 columns.
  const uint8_t* a8;
  int64_t a8_ld;
  const float* sa;
  int64_t sa_ld;
};

// Two e4m3 (low byte first) times the scale, as a bf16 pair: e4m3 -> f16 is exact, so this is
// bf16(float(e4m3) * s) for each.
__device__ __forceinline__ uint32_t fp8x2_bf16x2(uint32_t two, float s) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(two), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return pack_bf16(f.x * s, f.y * s);
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

// The group and rows of this block's row tile blockIdx.y of bm rows (the dense mode: one group of
// dense_rows rows, no table); false past the last tile, and the block has nothing to do.
__device__ __forceinline__ bool fp8_block_tile(const Params& p, int bm, GroupTile& gt) {
  gt = GroupTile{0, int(blockIdx.y) * bm, p.dense_rows};
  if (p.offsets == nullptr) return gt.m0 < p.dense_rows;
  return find_group_tile(p.offsets, p.tile_start, p.experts, bm, blockIdx.y, gt);
}

// A wgmma warpgroup's sums (m64nWG_N's layout, wgmma.cuh) into C: this thread's rows row0 and
// row0 + 8 (those before m_end), for each 8 columns i the columns col0 + 8 i + 2 t, + 1; with
// SwiGLU the first WG_N / 2 columns are gate sums, the rest the same output columns' up sums.
template <int WG_N, bool SWIGLU>
__device__ __forceinline__ void store_warpgroup(const Params& p, const float (&acc)[WG_N / 2], int row0, int m_end,
                                                int col0, int t) {
  const int64_t c_base = int64_t(blockIdx.z) * p.c_split;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + h * 8;
    if (r >= m_end) continue;
    const int64_t row = c_base + int64_t(r) * p.c_ld;
#pragma unroll
    for (int i = 0; i < (SWIGLU ? WG_N / 16 : WG_N / 8); ++i) {
      const int col = col0 + i * 8 + 2 * t;
      if (col >= p.N) continue;
      if constexpr (SWIGLU) {
        const float v0 = silu_mul(acc[4 * i + 2 * h], acc[4 * (i + WG_N / 16) + 2 * h]);
        const float v1 = silu_mul(acc[4 * i + 2 * h + 1], acc[4 * (i + WG_N / 16) + 2 * h + 1]);
        store_pair(p, row + col, v0, v1, col + 1 < p.N);
      } else {
        store_pair(p, row + col, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1], col + 1 < p.N);
      }
    }
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

// The wgmma shapes (grouped_gemm_fp8_wgmma.cu), bm 64 or 128; sm_90a only.
void launch_wgmma(const Params& p, int64_t row_tiles, bool swiglu, int64_t max_rows, int bm);

// The FP8-activation shape (grouped_gemm_fp8_act8.cu), BM 64; sm_90a only. quantize_act8 first
// writes A's rows [0, rows) as e4m3 codes and scales (row r reads a_rows[r], or r; rows from
// *count on are left alone when count is set), K a multiple of 128.
void quantize_act8(const bf16* a, int64_t a_ld, const int32_t* a_rows, const int32_t* count, int64_t rows, int64_t K,
                   uint8_t* codes, float* scales);
void launch_act8(const Params& p, int64_t row_tiles, bool swiglu, int64_t max_rows);

}  // namespace ms::cuda::grouped_fp8
