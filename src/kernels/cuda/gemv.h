// Weight-streaming products for few rows (decode): out[r, n] = x[r] . W[n] on CUDA cores, each
// weight element read once per step at full memory bandwidth, for BF16 or FP8-block weights
// (dequantised in registers, no scratch copy). Rows come in groups (the experts of a MoE
// layer), each with its own weights; a group that no row chose costs nothing.
#pragma once
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/moe_topk.cuh"

namespace ms::cuda {

// Device arrays describing the weights of `count` groups, all [N, K] with the same row stride:
// w[g] (and w2[g], the up projection of a SwiGLU pair), FP8 scales s[g] / s2[g] or null.
// A single group (dense) passes its pointers directly in w_one / w2_one / s_one / s2_one.
struct GemvWeights {
  const void* const* w = nullptr;
  const void* const* w2 = nullptr;
  const float* const* s = nullptr;
  const float* const* s2 = nullptr;
  const void* w_one = nullptr;
  const void* w2_one = nullptr;
  const float* s_one = nullptr;
  const float* s2_one = nullptr;
  int64_t ld = 0, scale_ld = 0;
  int block_n = 128, block_k = 128;
  bool fp8 = false;
  bool fetch_early = false;  // a dense weight the product may start loading before it waits (ops::Weight)
};

// Whether the product takes FP8 blocks of block_k columns: its 64-wide K chunk (one mma step of
// a warp's quad) must lie in one block, as the block's scale multiplies the chunk's sums.
inline bool gemv_fp8_block_k(int block_k) { return block_k > 0 && block_k % 64 == 0; }

// Which rows each group owns. Dense: one group, rows [0, rows). Grouped: group g owns rows
// [offsets[g], offsets[g + 1]); block b of the grid serves group active[b] when b < *n_active.
struct GemvRows {
  int rows = 0;
  const int32_t* offsets = nullptr;
  const int32_t* active = nullptr;
  const int32_t* n_active = nullptr;
  int max_groups = 1;  // grid size over groups (a bound on *n_active, fixed for graph capture)
  int expected_groups = 1;  // groups likely active: sizes the grid over output tiles
};

// Input rows: row r of the product reads x[x_rows ? x_rows[r] : r] (row stride x_ld, BF16;
// spelled __nv_bfloat16 so host-compiled tests can include this header).
struct GemvInput {
  const __nv_bfloat16* x;
  int64_t x_ld;
  const int32_t* x_rows = nullptr;
  // x was written before the kernel launched last, and the product's output is not a buffer that
  // kernel uses (ops::Overlap::BesideLast): a dense product then runs beside that kernel, waiting
  // for it only at its end (so the kernel after still follows both).
  bool beside_last = false;
};

// out[r, n] (row stride out_ld, BF16 or F32) = x_r . w[n] (+ bias[n]); with `swiglu`,
// out[r, n] = silu(x_r . w[n]) * (x_r . w2[n]).
struct GemvOutput {
  void* out;
  DType dtype;
  int64_t out_ld;
  const float* bias = nullptr;
};

// Whether the kernel takes this shape: K a multiple of the 16-byte chunk (FP8: of the 64-wide
// chunk, so that no lane of a quad lies past K while another does not: each scales the sums of
// the quad's k with its own block's scale, zero past K), rows 16-byte aligned.
bool gemv_supported(int64_t K, int64_t w_ld, bool fp8, const void* x, int64_t x_ld);

// The launch shape, overridable so that one test or bench binary can time variants (0 keeps the
// automatic choice): warps a block (1..8, each takes every warps-th 64-wide chunk of K), blocks_y
// blocks over a group's 16-feature slabs (grid.y, at most the slab count; each walks every
// blocks_y-th slab), nt tiles of 8 rows a pass over the weights (1, 2 or 4). The router's product
// (`route`) keeps its own shape but for route_tasks: set (1..8), the many-block kernel with that
// many warps streaming a block, instead of one cluster where it fits (it always takes the
// automatic split of K, so that its logits stay the unrouted product's). Starts
// as MOESERVE_GEMV_TUNE="warps,blocks_y,nt" says (read once); set_gemv_tuning replaces it for
// later launches (a captured graph keeps the shape it was captured with). Not for concurrent use:
// set it while no other thread launches products.
struct GemvTuning {
  int warps = 0, blocks_y = 0, nt = 0, route_tasks = 0;
};
GemvTuning gemv_tuning();
void set_gemv_tuning(const GemvTuning& t);

// With `route` (a dense product into F32, at most 8 rows, route->nv <= kRouteMaxLanes), the
// product runs as the router's kernel: its work spread a warp a (slab, part of K) over one
// cluster of up to 8 blocks (at most 64 tasks) or over many blocks, the same sums as without
// `route`, and the cluster's first block, or the block that finishes last, adds the parts up and
// runs the router's top-k over the whole output (moe_topk.cuh).
void gemv(int64_t N, int64_t K, const GemvWeights& w, const GemvRows& rows, const GemvInput& in,
          const GemvOutput& out, bool swiglu, const RouteTail* route = nullptr);

}  // namespace ms::cuda
