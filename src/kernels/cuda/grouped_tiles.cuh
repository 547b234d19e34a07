// The row-tile scheduling shared by the grouped GEMMs (grouped_gemm.cu for BF16 weights,
// grouped_gemm_fp8.cu for FP8 blocks): a one-warp kernel turns the device offsets into each
// group's first row tile, and a block of the GEMM finds its group and rows from that table.
// Also their SwiGLU epilogue's silu(gate) * up, so that every shape computes the same bits.
#pragma once
#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// A scratch I32 [E + 1], launched on the stream: tile_start[e] = sum over e' < e of
// ceil(rows of e' / bm), tile_start[E] = all tiles (grouped_gemm.cu).
Tensor grouped_tile_table(const int32_t* offsets, int E, int bm);

#ifdef __CUDACC__
// The group of global row tile y and its rows [m0, m_end) (tile y of bm rows); false when y lies
// past the last tile.
struct GroupTile {
  int group, m0, m_end;
};
__device__ __forceinline__ bool find_group_tile(const int32_t* __restrict__ offsets,
                                                const int32_t* __restrict__ tile_start, int E, int bm, int y,
                                                GroupTile& t) {
  if (y >= __ldg(tile_start + E)) return false;
  // The last e with tile_start[e] <= y (an empty group's equal successor is also <= y, so the
  // search lands on the group that owns the tile).
  int lo = 0, hi = E;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (__ldg(tile_start + mid) <= y) lo = mid;
    else hi = mid;
  }
  t.group = lo;
  t.m0 = __ldg(offsets + lo) + (y - __ldg(tile_start + lo)) * bm;
  t.m_end = __ldg(offsets + lo + 1);
  return true;
}

// silu(gate) * up = gate / (1 + e^-gate) * up in two MUFU instructions (ex2, rcp; each within
// 2 ulp of f32 before the output's bf16 rounding). Why: written with expf and an IEEE division
// (~25 instructions and a slow-path check a value), the SwiGLU epilogue of the persistent grouped
// GEMM took ~25 % of its consumer warps' time (Nsight Compute's stall samples, V2-Lite 8k tokens,
// session 36), during which its tensor cores idled. Large |gate|: e^-gate -> inf gives 0, -> 0 gives gate.
__device__ __forceinline__ float silu_mul(float gate, float up) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(gate * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
  return gate * r * up;
}
#endif

}  // namespace ms::cuda
