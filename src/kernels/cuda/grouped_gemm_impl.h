// What grouped_gemm.cu (the tile table, the launch, the mma.sync shapes) shares with
// grouped_gemm_wgmma.cu (the Hopper shapes): the kernel parameters, the row tile every shape
// uses, the pair store, and the wgmma shapes' launches. Device code only: include from .cu files.
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

// The wgmma shapes (grouped_gemm_wgmma.cu): launch over row_tiles row tiles, as kTiles' entries.
void launch_wgmma_128x128x64(const Params& p, int64_t row_tiles, bool swiglu);
void launch_wgmma_128x256x64(const Params& p, int64_t row_tiles, bool swiglu);
// The persistent shape with weight tiles by tensor copies (grouped_gemm_tma.cu).
void launch_tma_128x256x64(const Params& p, int64_t row_tiles, bool swiglu);

}  // namespace ms::cuda::grouped_gemm_impl
