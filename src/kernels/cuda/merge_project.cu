// A batch-1 GQA decode's split merge inside the output projection (merge_project.h).
//
// Why: at batch 1 the attention's tail was three dependent kernels, the decode (writing split
// partials), the split merge (a few KB read and written, yet ~5.5 µs of a Qwen3 layer) and o's
// product (16.8 MB), whose early fetch held its weight in registers (230 a thread) and so could
// not share a multiprocessor with the decode or the merge: o's weight streamed only once both had
// left (BENCHMARKS, session 29). Here o's product is split by head (K) instead of by output row:
// block (r, h) needs only head h's partials, merges them itself (merge_many over its 8 warps)
// and multiplies them by o's 512 x 128 piece of rows [512 r, 512 r + 512), columns of head h.
// That piece (128 KB) is loaded before the wait, into shared memory but for its last 64 rows,
// which go into registers, so that a block fits beside a decode block (106 KB of shared memory,
// 154 registers a thread) and o's weight streams during the attention. The heads' products are
// summed by the norm after (slabs_sum_add_rms_norm), a sum it makes anyway. Qwen3 at batch 1: the
// merge and o's product 9.6 -> ~5.9 µs after the decode, the decode +1.7 µs under o's stream,
// -2.6 % a step (BENCHMARKS, session 30).
#include "kernels/cuda/merge_project.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/mma.h"
#include "kernels/cuda/split_merge.cuh"

namespace ms::cuda {
namespace {

constexpr int kHead = 128;              // dims of a head (the partials' dv)
constexpr int kPieces = kHead / 8;      // 16-byte pieces of a weight row's head columns
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kRows = 2 * kThreads;     // output features a block
constexpr int kSmemRows = 448;          // of them copied into shared memory (112 KB); the rest into registers
constexpr size_t kSmemBytes = size_t(kSmemRows) * kPieces * 16;
static_assert(kSmemRows >= kThreads && kSmemRows <= kRows, "a thread's first row is in shared memory");

struct MergeProjectParams {
  SplitPartials part;  // rows: the query's heads
  const bf16* w;       // o [N, ld]
  int64_t ld;
  float* slabs;        // [heads, N]
  int N;
  bool evict_first;
};

// Where piece c of shared row r lies: the pieces of each row permuted by r % 8, so that 8
// consecutive rows' piece c (ldmatrix's 8 rows of a matrix) fall in 8 different bank groups.
__device__ __forceinline__ int slot(int r, int c) { return r * kPieces + (c ^ (r & 7)); }

// acc + the 8 products of a weight piece and the matching piece of x (BF16 each).
__device__ __forceinline__ float dot_piece(uint4 w, uint4 x, float acc) {
  float wf[8], xf[8];
  unpack8(w, wf), unpack8(x, xf);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(wf[i], xf[i], acc);
  return acc;
}

// The warps whose threads also hold a register row (the last kRows - kSmemRows rows), and the
// 16-row tiles of shared rows a warp takes: fewer for those warps, which also make a dot product.
constexpr int kRegWarps = (kRows - kSmemRows) / 32, kTilesMost = 4, kTilesFew = 2;
static_assert((kWarps - kRegWarps) * kTilesMost + kRegWarps * kTilesFew == kSmemRows / 16, "every tile a warp's");

// Tiles [tile0, tile0 + NT) of the shared rows on the tensor cores: A from ldmatrix, B every column
// x (so C's columns are equal and lane 4g holds rows g and g + 8). The tiles' chains of 8 mmas are
// interleaved (k outer), so the warp waits for one mma's latency a step, not a tile's chain; each
// tile still sums its k in order (the kernel 5.5-5.7 -> 5.2-5.3 us a Qwen3 layer against one
// tile after another: BENCHMARKS, session 32). On the CUDA cores (a thread a row) a block's
// product took ~1250 cycles longer (session 30's stamps).
template <int NT>
__device__ __forceinline__ void tiles_mma(const uint4* w_s, const uint32_t (&b)[kPieces / 2][2], float* out,
                                          int tile0, int r0, int N) {
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  float c[NT][4] = {};
#pragma unroll
  for (int kt = 0; kt < kPieces / 2; ++kt)
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int row = (tile0 + i) * 16 + lane % 8 + (lane / 8 % 2) * 8;  // this lane's ldmatrix row
      uint32_t a[4];
      ldmatrix_x4<false>(reinterpret_cast<const bf16*>(w_s + slot(row, 2 * kt + lane / 16)), a);
      mma_bf16(c[i], a, b[kt][0], b[kt][1]);
    }
  if (q == 0)
#pragma unroll
    for (int i = 0; i < NT; ++i) {
      const int r = (tile0 + i) * 16 + g;
      if (r0 + r < N) out[r] = c[i][0];
      if (r0 + r + 8 < N) out[r + 8] = c[i][2];
    }
}

// The shared rows' products: B from the merged head x, then the warp's tiles.
__device__ __forceinline__ void shared_rows_mma(const uint4* w_s, const uint4* x_s, float* out, int r0, int N) {
  const int warp = threadIdx.x / 32, q = threadIdx.x % 4;
  const bf16* xb = reinterpret_cast<const bf16*>(x_s);
  uint32_t b[kPieces / 2][2];
#pragma unroll
  for (int kt = 0; kt < kPieces / 2; ++kt) {
    b[kt][0] = *reinterpret_cast<const uint32_t*>(xb + kt * 16 + 2 * q);
    b[kt][1] = *reinterpret_cast<const uint32_t*>(xb + kt * 16 + 8 + 2 * q);
  }
  constexpr int kMost = kWarps - kRegWarps;
  if (warp < kMost) tiles_mma<kTilesMost>(w_s, b, out, warp * kTilesMost, r0, N);
  else tiles_mma<kTilesFew>(w_s, b, out, kMost * kTilesMost + (warp - kMost) * kTilesFew, r0, N);
}

__global__ void __launch_bounds__(kThreads) merge_project_kernel(MergeProjectParams p) {
  extern __shared__ uint4 w_s[];  // [kSmemRows][kPieces], permuted a row (slot)
  __shared__ MergeManyScratch<4, kWarps> scratch;
  __shared__ uint4 x_s[kPieces];  // the head's merged output, BF16
  const int t = int(threadIdx.x), h = int(blockIdx.y), r0 = int(blockIdx.x) * kRows;
  const uint64_t policy = l2_policy(p.evict_first);
  const bf16* w = p.w + int64_t(h) * kHead;
  // No kernel of a step writes weights, so all of the block's are asked for before the wait: the
  // shared rows 16 bytes a thread in row order (a warp two whole 256-byte rows; rows past N
  // zero-filled), then the last rows into registers, thread t's second row t + 256. Loaded after
  // the wait, those register rows kept the product waiting on HBM (session 30's stamps).
  for (int i = t; i < kSmemRows * kPieces; i += kThreads) {
    const int r = i / kPieces, n = r0 + r;
    cp_async16(w_s + slot(r, i % kPieces), w + int64_t(n < p.N ? n : 0) * p.ld + (i % kPieces) * 8, n < p.N, policy);
  }
  cp_async_commit();
  const int n2 = r0 + t + kThreads;
  const bool in_regs = t + kThreads >= kSmemRows;
  uint4 wr[kPieces];
#pragma unroll
  for (int c = 0; c < kPieces; ++c)
    wr[c] = in_regs && n2 < p.N ? ldg16(w + int64_t(n2) * p.ld + c * 8, policy) : make_uint4(0, 0, 0, 0);
  pdl_wait();  // the partials are the attention kernel's
  pdl_trigger();
  const float v = merge_many<4, kWarps>(p.part, h, 0, scratch);
  if (t < kHead) reinterpret_cast<bf16*>(x_s)[t] = __float2bfloat16_rn(v);  // as the merge kernel stores it
  cp_async_wait<0>();
  __syncthreads();
  float* out = p.slabs + int64_t(h) * p.N + r0;
  shared_rows_mma(w_s, x_s, out, r0, p.N);
  if (in_regs) {
    float y = 0.f;
#pragma unroll
    for (int c = 0; c < kPieces; ++c) y = dot_piece(wr[c], x_s[c], y);
    if (n2 < p.N) out[t + kThreads] = y;
  }
}

std::atomic<bool>& merge_project_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("MOESERVE_MERGE_PROJECT");
    return !env || std::string(env) != "0";
  }()};
  return on;
}

}  // namespace

void set_merge_project(bool on) { merge_project_flag().store(on); }

bool merge_project_takes(int64_t hq, const ops::Weight& o) {
  return merge_project_flag().load() && hq >= 1 && o.w.dtype() == DType::BF16 && o.w.dim() == 2 &&
         o.in_features() == hq * kHead && o.w.strides()[1] == 1 && aligned16(o.w.raw(), o.w.strides()[0] * 2) &&
         o.out_features() <= (int64_t(1) << 30) && o.w.device() == Device::CUDA;
}

void merge_project(const SplitPartials& part, const ops::Weight& o, Tensor& slabs) {
  const int64_t hq = part.rows, N = o.out_features();
  MS_CHECK(merge_project_takes(hq, o) && part.dv == kHead && part.splits >= 2 && slabs.dtype() == DType::F32 &&
               slabs.is_contiguous() && slabs.dim() == 2 && slabs.size(0) == hq && slabs.size(1) == N,
           "merge_project: ", part.splits, " splits of ", hq, " heads of ", part.dv, " by o ", o.w.describe(),
           " into ", slabs.describe());
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(merge_project_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
  });
  const MergeProjectParams p{part, o.w.data<bf16>(), o.w.strides()[0], slabs.data<float>(), int(N),
                             weights_evict_first()};
  launch_pdl(merge_project_kernel, dim3(unsigned(blocks_for(N, kRows)), unsigned(hq)), dim3(kThreads), kSmemBytes, p);
  MS_CUDA_LAUNCHED("merge_project_kernel");
}

}  // namespace ms::cuda
