// What grouped_gemm.cu (the tile table, the launch, the mma.sync shapes) shares with
// grouped_gemm_wgmma.cu and grouped_gemm_wgmma_ws.cu (the Hopper shapes): the kernel parameters,
// the row tile every shape uses, the pair store, the wgmma shapes' epilogue and their launches.
// Device code only: include from .cu files.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda::grouped_gemm_impl {

// Rows a block tile, the same in every shape: the tile table and the grid's bound depend on it
// (grouped_gemm_fits answers before a shape is chosen).
constexpr int kBM = 128;

struct Params {
  int N, K;
  const bf16* a;
  int64_t a_ld;
  const int32_t* a_rows;
  const bf16* const* w;
  const bf16* const* w2;
  int64_t w_ld;
  const int32_t* offsets;
  const int32_t* tile_start;
  int experts;
  bf16* c;
  int64_t c_ld;
  bool pair_stores;  // c_ld even and c 4-byte aligned: two columns a store
};

__device__ __forceinline__ void store_pair(bf16* p, float lo, float hi, bool pair, bool has_hi) {
  if (pair && has_hi) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
  } else {
    p[0] = __float2bfloat16_rn(lo);
    if (has_hi) p[1] = __float2bfloat16_rn(hi);
  }
}

// The wgmma shapes' stores: the block's 128 x BN sums, two m64 warpgroups' wgmma accumulators
// (wgmma.cuh's layout), thread wtid of the 256 that hold them; rows [m0, m_end) of the expert,
// column tile bx. SwiGLU: sums column j (gate) and j + BN / 2 (up) of the tile give output column j.
template <int BN, bool SWIGLU>
__device__ __forceinline__ void store_wgmma_tile(const Params& p, const float (&acc)[BN / 2], int m0, int m_end,
                                                 int bx, int wtid) {
  // Thread (g, t) of its warp holds rows g and g + 8 of the warp's 16, columns 8 i + 2 t, + 1.
  const int lane = wtid % 32, g = lane / 4, t = lane % 4;
  const int row0 = m0 + (wtid / 32) * 16 + g;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + h * 8;
    if (r >= m_end) continue;
    bf16* crow = p.c + int64_t(r) * p.c_ld;
    if constexpr (SWIGLU) {
#pragma unroll
      for (int i = 0; i < BN / 16; ++i) {
        const int col = bx * (BN / 2) + i * 8 + 2 * t;
        if (col >= p.N) continue;
        float v[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float gate = acc[4 * i + 2 * h + q], up = acc[4 * (i + BN / 16) + 2 * h + q];
          v[q] = gate / (1.0f + expf(-gate)) * up;
        }
        store_pair(crow + col, v[0], v[1], p.pair_stores, col + 1 < p.N);
      }
    } else {
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) {
        const int col = bx * BN + i * 8 + 2 * t;
        if (col >= p.N) continue;
        store_pair(crow + col, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1], p.pair_stores, col + 1 < p.N);
      }
    }
  }
}

// The wgmma shapes (grouped_gemm_wgmma.cu, and warp-specialized grouped_gemm_wgmma_ws.cu):
// launch over row_tiles row tiles, as kTiles' entries.
void launch_wgmma_128x128x64(const Params& p, int64_t row_tiles, bool swiglu);
void launch_wgmma_128x256x64(const Params& p, int64_t row_tiles, bool swiglu);
void launch_wgmma_ws_128x128x64(const Params& p, int64_t row_tiles, bool swiglu);
void launch_wgmma_ws_128x256x64(const Params& p, int64_t row_tiles, bool swiglu);

}  // namespace ms::cuda::grouped_gemm_impl
