// grouped_gemm_fp8 with FP8 activations: A quantised to e4m3 per row and 128 columns (scale =
// the group's largest magnitude / 448, as DeepSeek's own inference, SGLang and fp8_gemm.h), and
// the products on FP8 warpgroup MMAs (wgmma m64n64k32, f32 += e4m3 * e4m3) over both operands'
// codes as they lie in memory. Each 128-wide K tile is one scale block of both operands: its
// four wgmmas sum into a tile's partial product, which is then added to the sums times the
// row's scale and the weight block's.
//
// Why: grouped_gemm_fp8_wgmma.cu converts every weight to bf16 in shared memory before its bf16
// wgmmas, about a third of its instructions (session 39's Nsight); at 16-64 rows an expert it
// streams V3's experts at ~1.4-2.4 TB/s, bound by those instructions. Here a weight costs its
// copy and nothing else, and the tensor cores run at FP8's rate.
//
// Tiles (as grouped_gemm_fp8_wgmma.cu's BM 64): BN 128 weight rows, BK 128 (one 128-byte swizzle
// row of codes for both operands, wgmma.cuh's layout), 256 threads = two warpgroups on the same 64
// A rows, warpgroup w the weight rows 64 w.. (with SwiGLU its 32 gate rows, then the same
// columns' up rows). Pipeline: four stages of (A 64 x 128, weights 128 x 128) bytes, three tiles
// in flight; tile j: wait for its copies, fence them to the async proxy, __syncthreads (both
// warpgroups are past tile j - 1's wgmmas, so its stage can be refilled), copy tile j + 3, four
// wgmmas into `part`, wait for them, scale `part` into `acc`.
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/flash_prefill.h"  // cp_async16 / cp_async_commit / cp_async_wait
#include "kernels/cuda/grouped_gemm_fp8_impl.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda::grouped_fp8 {
namespace {

using namespace wg;

constexpr int kBM = 64, kBK = 128, kStages = 4, kAhead = 3, kThreads = 256, kWgN = 64;
constexpr int kABytes = kBM * kRowBytes, kWBytes = kBN * kRowBytes, kStageBytes = kABytes + kWBytes;
constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + kAtomBytes;
constexpr int kACopies = kABytes / 16 / kThreads, kWCopies = kWBytes / 16 / kThreads;  // 16-byte copies a thread
static_assert(kACopies == 2 && kWCopies == 4, "a thread copies chunk tid % 8 of rows tid / 8 + 32 i");
static_assert(kSmemBytes * 2 <= 227 * 1024, "two blocks an SM");

// One warp a (row, 128 columns): lane l quantises columns 4 l .. 4 l + 3 (cuda_common.h's
// quantize_e4m3_group4, as fp8_gemm.cu's quantiser).
__global__ void quantize_act8_kernel(const bf16* a, int64_t a_ld, const int32_t* a_rows, const int32_t* count,
                                     int64_t rows, int K, uint8_t* codes, float* scales) {
  const int lane = threadIdx.x % 32, groups = K / 128;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int64_t valid = count ? int64_t(__ldg(count)) : rows;
  for (int64_t i = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32; i < rows * groups; i += warps) {
    const int64_t r = i / groups;
    if (r >= valid) break;  // a warp's items go up in rows
    const int g = int(i % groups);
    const int64_t src = a_rows ? int64_t(__ldg(a_rows + r)) : r;
    const uint2 raw = *reinterpret_cast<const uint2*>(a + src * a_ld + g * 128 + lane * 4);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    const float v[4] = {lo.x, lo.y, hi.x, hi.y};
    float s;
    *reinterpret_cast<uint32_t*>(codes + r * K + g * 128 + lane * 4) = quantize_e4m3_group4(v, s);
    if (lane == 0) scales[r * groups + g] = s;
  }
}

template <bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemm_fp8_act8_kernel(const Params p) {
  pdl_wait();  // offsets, tile table and A's codes come from the kernels before
  const bool dense = p.offsets == nullptr;
  GroupTile gt;
  if (!fp8_block_tile(p, kBM, gt)) return;
  const int e = gt.group, m0 = gt.m0, m_end = gt.m_end;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  uint8_t* const smem = smem_raw + ((kAtomBytes - uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes) % kAtomBytes);
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, wg = tid / 128, chunk = tid % 8;

  // Copies: chunk tid % 8 of A rows and weight rows tid / 8 + 32 i.
  const uint8_t* a_src[kACopies];
  bool a_ok[kACopies];
#pragma unroll
  for (int i = 0; i < kACopies; ++i) {
    const int gr = m0 + tid / 8 + 32 * i;
    a_ok[i] = gr < m_end;
    a_src[i] = p.a8 + (a_ok[i] ? int64_t(gr) : 0) * p.a8_ld + chunk * 16;
  }
  const uint8_t* w_e = dense ? p.w_one : p.w[e];
  const uint8_t* w2_e = SWIGLU ? (dense ? p.w2_one : p.w2[e]) : nullptr;
  const uint8_t* w_src[kWCopies];
  bool w_ok[kWCopies];
#pragma unroll
  for (int i = 0; i < kWCopies; ++i) {
    const int r = tid / 8 + 32 * i;
    bool up = false;
    int n;
    if constexpr (SWIGLU) {
      up = (r / (kWgN / 2)) % 2;  // warpgroup r / 64's 32 gate rows, then the same columns' up rows
      n = int(blockIdx.x) * (kBN / 2) + (r / kWgN) * (kWgN / 2) + r % (kWgN / 2);
    } else {
      n = int(blockIdx.x) * kBN + r;
    }
    w_ok[i] = n < p.N;
    w_src[i] = (up ? w2_e : w_e) + (w_ok[i] ? int64_t(n) * p.w_ld : 0) + chunk * 16;
  }
  // This warpgroup's weight scale rows (its columns lie in one 128-row block; clamped past N,
  // whose columns are not stored) and this thread's A rows' scales (rows g and g + 8 of its warp's 16).
  const int n_blocks = (p.N + 127) / 128;
  const int n0 = SWIGLU ? int(blockIdx.x) * (kBN / 2) + wg * (kWgN / 2) : int(blockIdx.x) * kBN + wg * kWgN;
  const float* s_e = dense ? p.s_one : p.s[e];
  const float* sw_row = s_e + int64_t(min(n0 / 128, n_blocks - 1)) * p.s_ld;
  const float* su_row = nullptr;
  if constexpr (SWIGLU) su_row = (dense ? p.s2_one : p.s2[e]) + int64_t(min(n0 / 128, n_blocks - 1)) * p.s_ld;
  const int lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = m0 + ((tid % 128) / 32) * 16 + g;
  const float* sa_row[2];
  bool sa_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) sa_ok[h] = row0 + 8 * h < m_end, sa_row[h] = p.sa + (sa_ok[h] ? row0 + 8 * h : 0) * p.sa_ld;

  const int KT = p.K / kBK;
  const int kt0 = blockIdx.z * (p.k_split / kBK), kt1 = min(KT, kt0 + p.k_split / kBK);
  auto load_stage = [&](int stage, int kt) {
    uint8_t* as = smem + stage * kStageBytes;
    uint8_t* ws = as + kABytes;
    const int k = kt * kBK;
#pragma unroll
    for (int i = 0; i < kACopies; ++i) cp_async16(as + swizzled_offset(tid / 8 + 32 * i, chunk), a_src[i] + k, a_ok[i]);
#pragma unroll
    for (int i = 0; i < kWCopies; ++i) cp_async16(ws + swizzled_offset(tid / 8 + 32 * i, chunk), w_src[i] + k, w_ok[i]);
  };

  float acc[32], part[32];
#pragma unroll
  for (int i = 0; i < 32; ++i) acc[i] = 0.f;
  const uint64_t a_desc0 = smem_desc(smem_addr), b_desc0 = smem_desc(smem_addr + kABytes + wg * kWgN * kRowBytes);
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (kt0 + s < kt1) load_stage(s, kt0 + s);
    cp_async_commit();
  }
  int read_stage = 0, write_stage = kAhead;
  for (int kt = kt0; kt < kt1; ++kt) {
    // The tile's scales, asked for before its wait.
    const float sa0 = sa_ok[0] ? __ldg(sa_row[0] + kt) : 0.f, sa1 = sa_ok[1] ? __ldg(sa_row[1] + kt) : 0.f;
    const float sw = __ldg(sw_row + kt), su = SWIGLU ? __ldg(su_row + kt) : 0.f;
    cp_async_wait<kAhead - 1>();  // tile kt has landed (this thread's copies)
    fence_proxy_async();          // ... for wgmma's reads
    __syncthreads();              // everyone's; both warpgroups are past tile kt - 1's wgmmas
    if (kt + kAhead < kt1) load_stage(write_stage, kt + kAhead);  // tile kt - 1's stage
    cp_async_commit();
    const uint64_t off = uint64_t(read_stage * kStageBytes) >> 4;
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == kStages - 1 ? 0 : write_stage + 1;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk) wgmma_e4m3_n64(part, a_desc0 + off + kk * 2, b_desc0 + off + kk * 2, kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(part);
    // part[4 i + 2 h + q]: row g + 8 h, column 8 i + 2 t + q of the warpgroup's 64 (SwiGLU: i < 4 gate).
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float sb = SWIGLU && i >= 4 ? su : sw;
      const float s0 = sa0 * sb, s1 = sa1 * sb;
      acc[4 * i] += part[4 * i] * s0, acc[4 * i + 1] += part[4 * i + 1] * s0;
      acc[4 * i + 2] += part[4 * i + 2] * s1, acc[4 * i + 3] += part[4 * i + 3] * s1;
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind

  const int col0 = SWIGLU ? int(blockIdx.x) * (kBN / 2) + wg * (kWgN / 2) : int(blockIdx.x) * kBN + wg * kWgN;
  store_warpgroup<kWgN, SWIGLU>(p, acc, row0, m_end, col0, t);
}

}  // namespace

void quantize_act8(const bf16* a, int64_t a_ld, const int32_t* a_rows, const int32_t* count, int64_t rows, int64_t K,
                   uint8_t* codes, float* scales) {
  if (rows == 0) return;
  const int threads = 256;
  const int64_t items = rows * (K / 128), blocks = std::min<int64_t>((items + 7) / 8, 8 * int64_t(sm_count()));
  quantize_act8_kernel<<<unsigned(blocks), threads, 0, stream()>>>(a, a_ld, a_rows, count, rows, int(K), codes, scales);
  MS_CUDA_LAUNCHED("quantize_act8");
}

void launch_act8(const Params& p, int64_t row_tiles, bool swiglu, int64_t max_rows) {
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_fp8_act8_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_fp8_act8_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
  });
  launch(p, row_tiles, swiglu, max_rows,
         Kernels{grouped_gemm_fp8_act8_kernel<false>, grouped_gemm_fp8_act8_kernel<true>, kBK, kThreads, kSmemBytes});
}

}  // namespace ms::cuda::grouped_fp8
