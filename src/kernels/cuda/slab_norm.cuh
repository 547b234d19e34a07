// The batch-1 slab norm's pieces (norm.cu's moe_slabs_add_rms_norm_kernel): its arguments and
// the body of one of its cluster's blocks, shared with the router that norms its own input first
// (gemv.cu's norm_route_cluster_kernel).
#pragma once
#include <cooperative_groups.h>

#include <cstdint>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// One token's MoE output left as the one-token experts' slabs (ExpertRows::slabs), summed, added
// to the residual and normed, in one launch. It replaces the experts kernel's last step (its
// blocks meeting at a counter a slot, then summing the slot's slabs into ye) and the one-block
// norm after it. One thread-block cluster of H / 256 blocks (H a multiple of 256, at most 2048):
// block b takes columns [256b, 256b + 256), thread (slot j, quad q) summing slot j's slabs of 4
// columns in slab order (sum_slot's sum, whole 32-byte sectors a warp), then a thread a column
// taking the slots in order (MoeAddend's weighted sum), the shared expert and the residual add,
// and storing the rounded sum into the residual. Those 256 columns are warp b's pieces in the
// norm's 256-thread row (a thread a piece of 8), so the block's first warp makes that warp's
// sums of squares and writes them into every block's shared memory (distributed shared memory);
// after one cluster barrier each block reduces them as rms_norm_rows_kernel does (warp w the
// pieces 32w.., lane 0's butterfly sum, then the warps in order: the same bits as the unfused
// path) and norms its own columns from registers. Where the blocks met at a device counter and
// the last reloaded the whole row (two dependent trips through L2), the combine + norm took 0.8
// (Qwen3) to 1.0 us (V2-Lite) longer a layer (BENCHMARKS, session 28). Session 23's cluster,
// whose 16-byte loads used half a sector each and kept fewer in flight, had lost.
struct MoeSlabs {
  const float* parts;  // [K * slabs, H]
  const int32_t* row_of;  // null: slot s is row s (slabs_sum_add_rms_norm's groups)
  const float* weights;   // null: every slot weighs 1
  int K, slabs;
  const __nv_bfloat16* shared;  // [H] or null
  const __nv_bfloat16* gate;    // [1] or null: added ungated
};
constexpr int kSlabQuads = 64, kSlabCols = 4 * kSlabQuads, kSlabThreads = 8 * kSlabQuads;
// Slabs a thread has in flight: Qwen3's 12 in one round trip, V2-Lite's 22 in two. All 22 at once
// (128 registers) made both models slower at batch 1 (BENCHMARKS, session 28).
constexpr int kSlabBatch = 12;
constexpr int kNormRowPieces = 256;  // the norm's 256-thread row: H / 8 <= 256 pieces
constexpr int kSlabMaxBlocks = kNormRowPieces * 8 / kSlabCols;  // 8: a portable cluster

// One launch's arguments: residual [H] += the slabs' sum, out = rms_norm(residual) * weight.
struct SlabNormArgs {
  MoeSlabs m;
  __nv_bfloat16* residual;
  const __nv_bfloat16* weight;
  float eps;
  int H;
  __nv_bfloat16* out;
};

#ifdef __CUDACC__

__device__ __forceinline__ float bf16_rounded(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

// The kernel's body, for a block of kSlabThreads threads of a cluster of H / kSlabCols (also the
// router's cluster that norms its input first: gemv.cu). It waits for the kernel before (PDL)
// and lets the next one launch.
template <class TW>
__device__ __forceinline__ void slabs_add_rms_norm_block(const MoeSlabs& m, bf16* x, const TW* w, float eps, int H,
                                                         bf16* out) {
  __shared__ float ys[8][kSlabCols];            // [slot][column]
  __shared__ float xs[kSlabCols];               // this block's columns as stored
  __shared__ float piece_ss[kNormRowPieces];    // every piece's sum of squares, from every block
  __shared__ float warp_ss[kNormRowPieces / 32];
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int j = int(threadIdx.x) / kSlabQuads, q = int(threadIdx.x) % kSlabQuads;
  const int c0 = int(blockIdx.x) * kSlabCols, col = c0 + int(threadIdx.x);
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const bool mixes = threadIdx.x < kSlabCols;
  const float wc = mixes ? load_f(w + col) : 0.f;  // no kernel writes the norm's weight
  if (threadIdx.x < kNormRowPieces && int(threadIdx.x) >= H / 8) piece_ss[threadIdx.x] = 0.f;  // past the row
  pdl_wait();  // the parts are the experts kernel's
  // The next kernel may launch now: the experts' blocks have left, so its blocks spread over every
  // multiprocessor (launched while they streamed, Qwen3's q|k|v crowded onto the idle ones and
  // took 3.4 us more).
  pdl_trigger();
  // Every input but the parts asked for at once: the slots' rows and weights, the residual, the
  // shared expert and its gate.
  int32_t rows[8];
  float weights[8];
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    rows[s] = s >= m.K ? -1 : m.row_of ? m.row_of[s] : s;
    weights[s] = s >= m.K ? 0.f : m.weights ? m.weights[s] : 1.f;
  }
  const float residual = mixes ? __bfloat162float(x[col]) : 0.f;
  const float sh = mixes && m.shared ? __bfloat162float(m.shared[col]) : 0.f;
  const float gate = m.gate ? load_f(m.gate) : 0.f;
  int32_t my_row = -1;  // rows[j], kept in registers
#pragma unroll
  for (int s = 0; s < 8; ++s)
    if (s == j) my_row = rows[s];
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (my_row >= 0) {  // slot j's slabs in order, from 0 (sum_slot's sum)
    const float* src = m.parts + int64_t(j) * m.slabs * H + c0 + 4 * q;
    for (int k0 = 0; k0 < m.slabs; k0 += kSlabBatch) {
      float4 part[kSlabBatch];
#pragma unroll
      for (int u = 0; u < kSlabBatch; ++u)
        if (k0 + u < m.slabs) part[u] = __ldcg(reinterpret_cast<const float4*>(src + int64_t(k0 + u) * H));
#pragma unroll
      for (int u = 0; u < kSlabBatch; ++u)
        if (k0 + u < m.slabs) v.x += part[u].x, v.y += part[u].y, v.z += part[u].z, v.w += part[u].w;
    }
  }
  *reinterpret_cast<float4*>(&ys[j][4 * q]) = v;
  __syncthreads();
  float xc = 0.f;  // column col as stored: the norm's input
  if (mixes) {     // column col: the slots in order (MoeAddend's combine), rounded; the shared expert
    float a = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s)
      if (rows[s] >= 0) a = fmaf(weights[s], ys[s][threadIdx.x], a);
    a = bf16_rounded(a);
    if (m.shared) {
      if (m.gate) a = fmaf(1.0f / (1.0f + expf(-gate)), sh, a);
      else a += sh;
      a = bf16_rounded(a);
    }
    const bf16 stored = __float2bfloat16_rn(a + residual);  // the residual add
    x[col] = stored;
    xs[threadIdx.x] = xc = __bfloat162float(stored);
  }
  __syncthreads();
  if (warp == 0) {  // piece 32b + lane: its 8 columns in order, as the norm's thread of that piece
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += xs[8 * lane + i] * xs[8 * lane + i];
    const int piece = int(blockIdx.x) * 32 + lane;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) cluster.map_shared_rank(piece_ss, r)[piece] = ss;
  }
  cluster.sync();  // every block's pieces in every block's shared memory (release / acquire)
  if (warp < kNormRowPieces / 32) {
    float ss = piece_ss[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) warp_ss[warp] = ss;
  }
  __syncthreads();
  float ss = 0.f;
  for (int k = 0; k < kNormRowPieces / 32; ++k) ss += warp_ss[k];
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  if (mixes) out[col] = __float2bfloat16_rn(xc * inv * wc);
}

#endif  // __CUDACC__

}  // namespace ms::cuda
