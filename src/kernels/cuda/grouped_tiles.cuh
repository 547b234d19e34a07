// The row-tile scheduling shared by the grouped GEMMs (grouped_gemm.cu for BF16 weights,
// grouped_gemm_fp8.cu for FP8 blocks): a one-warp kernel turns the device offsets into each
// group's first row tile, and a block of the GEMM finds its group and rows from that table.
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
#endif

}  // namespace ms::cuda
