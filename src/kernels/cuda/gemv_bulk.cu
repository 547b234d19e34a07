// The weight-streaming product (gemv.h) with its weights brought into shared memory by 1-D bulk
// copies (Hopper TMA): small dense weights at most 8 rows (gemv.cu's bulk_takes).
//
// Why: gemv_kernel keeps only U x 2 rows x 32 bytes a lane in flight and then computes, so at
// K = 2048 a warp makes two serial round trips to memory and the HBM idles between them (2.3 -
// 3.0 TB/s of the 4.3 it copies at). Here one warp of each block puts whole stages in flight, one
// bulk copy a weight row, and the block computes from shared memory while the next stages land.
//
// Shape: a block walks its tiles (one slab of 16 features x one K-range of KS, and the SwiGLU
// twin's) in a ring of kStages stages of 32 KB of weight each (KS = 1024 bf16 / 2048 fp8 k, half
// that for a SwiGLU pair): 3 stages + the warps' partials are ~110 KB, so 2 blocks an SM and
// 4 stages (128 KB) an SM in flight while 2 are computed; 132 SMs x 128 KB = 17 MB requested,
// against the ~4.3 TB/s x ~1.5 us = 6.5 MB that keeps HBM busy, and at batch 1 a layer's
// product (17 - 50 MB) is mostly in flight from the start. A dense weight is known before the
// kernel before this one ends, so a block issues its first stages before pdl_wait (grouped rows
// must wait: the routing picks the expert). Blocks over slabs: two resident an SM, each walking
// an equal count of slabs, so that the ring keeps flowing from one slab to the next.
//
// A row of a stage is padded by 16 bytes (bf16) or 64 (fp8) so that the 8 lanes of a quarter
// warp (rows g, g + 1 at 4 offsets q) read distinct banks. Rows past N are not copied (their
// stale values reach only features that are not stored); k past K is zeroed before the mma.
// Compute is the register kernel's: lane (g, q) takes 16 k of rows g and g + 8 (mma_piece).
#include "kernels/cuda/gemv_impl.cuh"
#include "kernels/cuda/mbarrier.cuh"

#include <algorithm>

namespace ms::cuda::gemv_detail {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int kStagePayload = 32 * 1024;  // weight bytes a stage
constexpr int kBarBytes = 128;            // the stages' mbarriers, padded

template <bool FP8, bool SWIGLU>
struct Layout {
  static constexpr int kMats = SWIGLU ? 2 : 1;
  static constexpr int kElem = FP8 ? 1 : 2;
  static constexpr int kKs = kStagePayload / (kSlab * kMats * kElem);  // k a stage
  static constexpr int kRowBytes = kKs * kElem + (FP8 ? 64 : 16);
  static constexpr int kStageBytes = kMats * kSlab * kRowBytes;
  static constexpr int kPerWarp = kKs / kChunk / kWarps;  // chunks a warp a stage
  static constexpr int kRedBytes = kWarps * kMats * kSlab * 8 * int(sizeof(float));
  static constexpr int kSmem = kBarBytes + kStages * kStageBytes + kRedBytes;
  static_assert(kKs % (kChunk * kWarps) == 0 && kRowBytes % 16 == 0 && kStageBytes % 16 == 0);
  static_assert(2 * (kSmem + 1024) <= 228 * 1024, "two blocks an SM");
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

template <bool FP8, class TO, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 2) gemv_bulk_kernel(GemvParams p, int nks) {
  using L = Layout<FP8, SWIGLU>;
  constexpr int MATS = L::kMats, E = L::kElem, KS = L::kKs;
  extern __shared__ __align__(128) unsigned char smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);  // [kStages], one phase a use of the stage
  unsigned char* stages = smem + kBarBytes;
  float* red = reinterpret_cast<float*>(stages + kStages * L::kStageBytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  // Tile t: slab blockIdx.y + (t / nks) * gridDim.y, K-range t % nks.
  const int tiles = ((p.slabs - 1 - int(blockIdx.y)) / int(gridDim.y) + 1) * nks;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) wg::mbar_init(smem_u32(full + s), 1);
    wg::mbar_fence_init();
  }
  __syncthreads();
  const char* W[2] = {nullptr, nullptr};
  // Warp 0: lane 0 expects the tile's bytes, lane m * 16 + r copies row r of matrix m.
  auto issue = [&](int t) {
    const int stage = t % kStages, n0 = (int(blockIdx.y) + t / nks * int(gridDim.y)) * kSlab, k0 = t % nks * KS;
    const int rows = min(kSlab, p.N - n0);
    const uint32_t bytes = uint32_t(min(KS, p.K - k0) * E), bar = smem_u32(full + stage);
    if (lane == 0) wg::mbar_arrive_expect_tx(bar, bytes * uint32_t(rows * MATS));
    __syncwarp();
    const int m = lane / kSlab, r = lane % kSlab;
    if (m < MATS && r < rows)
      wg::bulk_copy_g2s(smem_u32(stages + stage * L::kStageBytes + (m * kSlab + r) * L::kRowBytes),
                        (m == 0 ? W[0] : W[1]) + (int64_t(n0 + r) * p.w.ld + k0) * E, bytes, bar);
  };
  const bool early = !p.w.w;  // dense: the weight does not depend on the kernel before
  if (early) {
    W[0] = static_cast<const char*>(p.w.w_one), W[1] = static_cast<const char*>(p.w.w2_one);
    if (warp == 0)
      for (int t = 0; t < min(kStages, tiles); ++t) issue(t);
  }
  pdl_wait();
  pdl_trigger();
  int group = 0;
  if (p.rows.active) {
    if (int(blockIdx.x) >= *p.rows.n_active) return;  // nothing issued
    group = p.rows.active[blockIdx.x];
  }
  if (!early) {
    W[0] = static_cast<const char*>(p.w.w[group]), W[1] = static_cast<const char*>(p.w.w2 ? p.w.w2[group] : nullptr);
    if (warp == 0)
      for (int t = 0; t < min(kStages, tiles); ++t) issue(t);
  }
  const int r_begin = p.rows.offsets ? p.rows.offsets[group] : 0;
  const int r_end = p.rows.offsets ? p.rows.offsets[group + 1] : p.rows.rows;  // <= r_begin + 8
  const int src = r_begin + g < r_end ? (p.in.x_rows ? p.in.x_rows[r_begin + g] : r_begin + g) : -1;
  const float* SC[2] = {FP8 ? (p.w.s ? p.w.s[group] : p.w.s_one) : nullptr,
                        FP8 ? (p.w.s2 ? p.w.s2[group] : p.w.s2_one) : nullptr};
  float acc[MATS][1][4] = {};
  for (int t = 0; t < tiles; ++t) {
    const int stage = t % kStages, ks = t % nks;
    const int n0 = (int(blockIdx.y) + t / nks * int(gridDim.y)) * kSlab, k0 = ks * KS, klen = min(KS, p.K - k0);
    // The inputs first (L2 hits, independent of the stage), then the stage's weights.
    uint32_t xs[L::kPerWarp][8];
#pragma unroll
    for (int u = 0; u < L::kPerWarp; ++u) load_inputs(p, src, k0 + (warp + u * kWarps) * kChunk + q * 16, xs[u]);
    wg::mbar_wait(smem_u32(full + stage), (t / kStages) & 1);
    const unsigned char* st = stages + stage * L::kStageBytes;
#pragma unroll
    for (int u = 0; u < L::kPerWarp; ++u) {
      const int kk = (warp + u * kWarps) * kChunk + q * 16;  // this lane's 16 k within the tile
      if (kk - q * 16 >= klen) break;                          // the whole chunk past K: warp-uniform
      uint32_t a[MATS][2][8];
#pragma unroll
      for (int m = 0; m < MATS; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = g + 8 * h;
          uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
          if (kk < klen) {
            const uint4* w = reinterpret_cast<const uint4*>(st + (m * kSlab + row) * L::kRowBytes + kk * E);
            lo = w[0];
            if (!FP8 && kk + 8 < klen) hi = w[1];
          }
          to_bf16<FP8>(lo, hi, FP8 ? fp8_scale(p, SC[m], n0 + row, k0 + kk) : 0.f, a[m][h]);
        }
#pragma unroll
      for (int m = 0; m < MATS; ++m) mma_piece(acc[m][0], a[m], xs[u]);
    }
    const bool last = ks == nks - 1;  // the slab's sums are complete
    if (last) {
      stash_partials<MATS, 1>(red, warp, lane, acc);
#pragma unroll
      for (int m = 0; m < MATS; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[m][0][i] = 0.f;
    }
    __syncthreads();  // every warp is done with the stage (and has stashed its partials)
    if (warp == 0 && t + kStages < tiles) issue(t + kStages);
    if (last) {
      reduce_store<TO, SWIGLU, 1>(p, red, kWarps, r_begin, r_end, n0);
      __syncthreads();  // red is rewritten by the next slab
    }
  }
}

template <bool FP8, class TO, bool SWIGLU>
void launch(const GemvParams& p, dim3 grid) {
  using L = Layout<FP8, SWIGLU>;
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(gemv_bulk_kernel<FP8, TO, SWIGLU>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 L::kSmem));
  });
  const int nks = (p.K + L::kKs - 1) / L::kKs;
  launch_pdl(gemv_bulk_kernel<FP8, TO, SWIGLU>, grid, dim3(kThreads), size_t(L::kSmem), p, nks);
}

template <bool FP8, bool SWIGLU>
void dispatch_out(const GemvParams& p, DType dtype, dim3 grid) {
  if (dtype == DType::BF16) launch<FP8, bf16, SWIGLU>(p, grid);
  else if (dtype == DType::F32) launch<FP8, float, SWIGLU>(p, grid);
  else fail("gemv: unsupported output dtype ", dtype_name(dtype));
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

}  // namespace

bool gemv_bulk(const GemvParams& p, DType out_dtype, bool swiglu, int blocks_y) {
  // Bulk copies are sm_90's. gemv_supported already holds: K and the row stride in whole 16-byte
  // pieces. A grouped weight's pointers live on the device; like gemv_kernel's 16-byte loads, the
  // copies need them aligned.
  if (!hopper() || p.rows.rows > 8 || !aligned16(p.w.w_one) || !aligned16(p.w.w2_one)) return false;
  const int resident = 2 * sm_count(), eg = std::max(1, p.rows.expected_groups);
  const int y0 = std::min(p.slabs, std::max(1, (resident + eg - 1) / eg));
  const int per_block = (p.slabs + y0 - 1) / y0;
  const int y = blocks_y ? std::min(p.slabs, blocks_y) : (p.slabs + per_block - 1) / per_block;
  const dim3 grid(unsigned(p.rows.max_groups), unsigned(y));
  if (p.w.fp8) {
    if (swiglu) dispatch_out<true, true>(p, out_dtype, grid);
    else dispatch_out<true, false>(p, out_dtype, grid);
  } else {
    if (swiglu) dispatch_out<false, true>(p, out_dtype, grid);
    else dispatch_out<false, false>(p, out_dtype, grid);
  }
  return true;
}

}  // namespace ms::cuda::gemv_detail
