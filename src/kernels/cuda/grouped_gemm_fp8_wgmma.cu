// The Hopper shapes of grouped_gemm_fp8 (FP8-block weights, BF16 activations): the same grid,
// tile table, gather, split K, ragged edges and SwiGLU as grouped_gemm_fp8.cu's mma.sync kernel,
// but each weight dequantised to bf16(float(e4m3) * scale) (weight_bf16's value; the mma.sync
// kernel puts the scale on its sums instead, which here would take a second set of accumulators
// across the asynchronous wgmmas of two K tiles), and the products on warpgroup MMAs
// (wgmma.mma_async m64nNk16, f32 += bf16 * bf16) that read both operands from shared memory.
//
// Why: the mma.sync kernel is compute-bound from ~32 rows at 150-190 TFLOP/s (registers feed its
// tensor cores, and each B fragment is converted in registers by every warp row). Here the
// block's 256 threads convert the weight tile once into a BF16 tile in exactly the layout
// grouped_gemm_wgmma.cu's copies give BF16 weights (wgmma.cuh: K-major rows of 64, 128-byte
// swizzle), and wgmma reads it, as it reads A, without register traffic. A weight then costs
// ~3 conversion instructions once a block (BM 64 or 128 rows) and HBM a byte.
//
// Tiles: BN 128 weight rows, BK 64 (one swizzle row of BF16, inside one 128-wide scale block),
// 256 threads = two warpgroups. BM 128: warpgroup w owns A rows 64 w.. and all 128 columns
// (m64n128k16). BM 64: both take the 64 A rows, warpgroup w the columns 64 w.. (m64n64k16).
// With SwiGLU a warpgroup's tile rows are its gate rows then the same columns' up rows, so both
// sums of a column sit in one thread.
//
// Pipeline, K tile j (STAGES 4 buffers of A (BM x 128 bytes, swizzled) and weight bytes (128 x
// 64, plain), two BF16 weight tiles): wait for tile j's copies, __syncthreads (everyone's copies;
// every warpgroup has waited for tile j - 2's wgmmas), issue tile j + 2's copies (into tile
// j - 2's buffer), convert tile j's bytes into BF16 tile j % 2 while tile j - 1's wgmmas run,
// fence.proxy.async (the generic-proxy writes, st.shared and cp.async, before wgmma's async-proxy
// reads), __syncthreads, four wgmmas, commit, wait until only this tile's are pending.
// Each thread converts exactly the weight bytes it copied (the same 16-byte chunks).
#include <cstdint>

#include "kernels/cuda/flash_prefill.h"  // cp_async16 / cp_async_commit / cp_async_wait
#include "kernels/cuda/grouped_gemm_fp8_impl.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda::grouped_fp8 {
namespace {

using namespace wg;

template <int BM, int MIN_BLOCKS>
struct WgF8Tile {
  static constexpr int kBM = BM, kMinBlocks = MIN_BLOCKS, kBK = 64, kStages = 4, kAhead = 2;
  static constexpr int kThreads = 256;
  static constexpr int kWgN = BM == 128 ? kBN : kBN / 2;  // columns (weight rows) a warpgroup
  static constexpr int kAcc = kWgN / 2;                   // f32 sums a thread
  static constexpr int kABytes = BM * kRowBytes, kWBytes = kBN * kBK;  // A tile; weight bytes
  static constexpr int kStageBytes = kABytes + kWBytes, kBf16Bytes = kBN * kRowBytes;
  static constexpr size_t kSmemBytes = 2 * size_t(kBf16Bytes) + size_t(kStages) * kStageBytes + kAtomBytes;
  static constexpr int kACopies = BM * 8 / kThreads, kWCopies = kWBytes / 16 / kThreads;  // 16-byte copies
  static_assert(BM == 64 || BM == 128, "one or two m64 warpgroup row slices");
  static_assert(kABytes % kAtomBytes == 0 && kWBytes % kAtomBytes == 0, "tiles stay 1024-byte aligned");
  static_assert(kWCopies == 2 && kThreads / 4 == 64, "a thread's weight rows: tid / 4 and tid / 4 + 64");
  static_assert(kStages - kAhead >= 2, "the buffer refilled is two tiles back");
  static_assert(kSmemBytes * MIN_BLOCKS <= 227 * 1024, "shared memory of the blocks an SM");
};
using WgF8Tile64 = WgF8Tile<64, 2>;    // 97 KiB
using WgF8Tile128 = WgF8Tile<128, 1>;  // 129 KiB

template <class T>
__device__ __forceinline__ void wgmma_tile(float (&d)[T::kAcc], uint64_t a, uint64_t b) {
  if constexpr (T::kWgN == 128) wgmma_bf16<128>(d, a, b);
  else wgmma_bf16_n64(d, a, b, true);
}

template <class T, bool SWIGLU>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) grouped_gemm_fp8_wgmma_kernel(const Params p) {
  constexpr int kBM = T::kBM, kBK = T::kBK, kStages = T::kStages, kAhead = T::kAhead, kWgN = T::kWgN;
  pdl_wait();  // offsets, tile table and A come from the kernels before
  const bool dense = p.offsets == nullptr;  // one group of dense_rows rows, no table
  GroupTile gt;
  if (!fp8_block_tile(p, kBM, gt)) return;
  const int e = gt.group, m0 = gt.m0, m_end = gt.m_end;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The tiles' 1024-byte alignment (the swizzle's): the dynamic base is only 16-byte aligned.
  uint8_t* const smem = smem_raw + ((kAtomBytes - uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes) % kAtomBytes);
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  uint8_t* const bf = smem;                              // two BF16 weight tiles
  uint8_t* const stages = smem + 2 * T::kBf16Bytes;      // kStages x (A, weight bytes)
  const int tid = threadIdx.x, wg = tid / 128;

  // A copies: chunk tid % 8 of tile rows tid / 8 + 32 i (all one swizzle phase).
  const int a_chunk = tid % 8;
  const uint32_t a_dst = swizzled_offset(tid / 8, a_chunk);
  const bf16* a_src[T::kACopies];
  bool a_ok[T::kACopies];
#pragma unroll
  for (int i = 0; i < T::kACopies; ++i) {
    const int gr = m0 + tid / 8 + i * 32;
    a_ok[i] = gr < m_end;
    const int64_t src_row = a_ok[i] ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : 0;
    a_src[i] = p.a + src_row * p.a_ld + a_chunk * 8;
  }
  // Weight copies and conversions: 16 bytes (K 16 c .. 16 c + 15) of tile rows tid / 4 + 64 i.
  const uint8_t* w_e = dense ? p.w_one : p.w[e];
  const uint8_t* w2_e = SWIGLU ? (dense ? p.w2_one : p.w2[e]) : nullptr;
  const float* s_e = dense ? p.s_one : p.s[e];
  const float* s2_e = SWIGLU ? (dense ? p.s2_one : p.s2[e]) : nullptr;
  const int c = tid % 4, n_blocks = (p.N + 127) / 128;
  const uint8_t* w_src[T::kWCopies];
  const float* s_row[T::kWCopies];
  bool w_ok[T::kWCopies];
#pragma unroll
  for (int i = 0; i < T::kWCopies; ++i) {
    const int r = tid / 4 + 64 * i;
    bool up = false;
    int n;
    if constexpr (SWIGLU) {
      // Warpgroup column block r / kWgN: kWgN / 2 gate rows, then the same columns' up rows.
      up = (r / (kWgN / 2)) % 2;
      n = int(blockIdx.x) * (kBN / 2) + (r / kWgN) * (kWgN / 2) + r % (kWgN / 2);
    } else {
      n = int(blockIdx.x) * kBN + r;
    }
    w_ok[i] = n < p.N;
    w_src[i] = (up ? w2_e : w_e) + (w_ok[i] ? int64_t(n) * p.w_ld : 0) + c * 16;
    // Clamped: rows wholly past N read zero-filled weights.
    s_row[i] = (up ? s2_e : s_e) + int64_t(min(n / 128, n_blocks - 1)) * p.s_ld;
  }

  const int KT = (p.K + kBK - 1) / kBK;
  const int kt0 = blockIdx.z * (p.k_split / kBK), kt1 = min(KT, kt0 + p.k_split / kBK);
  // K a multiple of BK (every published block-FP8 shape): each copy's columns are in range, and a
  // copy of a row past the group or N keeps row 0's address, so no copy tests its column.
  const bool k_whole = p.K % kBK == 0;
  auto load_stage = [&](int stage, int kt) {
    uint8_t* as = stages + stage * T::kStageBytes;
    uint8_t* ws = as + T::kABytes;
    const int k = kt * kBK;
    if (k_whole) {
#pragma unroll
      for (int i = 0; i < T::kACopies; ++i) cp_async16(as + a_dst + i * 32 * kRowBytes, a_src[i] + k, a_ok[i]);
#pragma unroll
      for (int i = 0; i < T::kWCopies; ++i) cp_async16(ws + tid * 16 + i * (T::kWBytes / 2), w_src[i] + k, w_ok[i]);
      return;
    }
    // An invalid copy reads nothing (zero fill); its address stays the row's start, inside the operand.
    const bool ka = k + a_chunk * 8 < p.K;
#pragma unroll
    for (int i = 0; i < T::kACopies; ++i) {
      const bool v = a_ok[i] && ka;
      cp_async16(as + a_dst + i * 32 * kRowBytes, a_src[i] + (v ? k : 0), v);
    }
    const bool kw = k + c * 16 < p.K;
#pragma unroll
    for (int i = 0; i < T::kWCopies; ++i) {
      const bool v = w_ok[i] && kw;
      cp_async16(ws + tid * 16 + i * (T::kWBytes / 2), w_src[i] + (v ? k : 0), v);
    }
  };
  // This thread's weight bytes of a stage, times the scales, into BF16 tile `buf`: tile row r,
  // K 16 c.. are swizzled chunks 2 c and 2 c + 1 (16 bytes each). A quarter-warp's stores (rows
  // r, r + 1, chunks 2 c) land on distinct banks: even rows take even chunk slots, odd rows odd.
  uint32_t w_dst[T::kWCopies][2];  // this thread's two swizzled chunks of each BF16 tile row it converts
#pragma unroll
  for (int i = 0; i < T::kWCopies; ++i)
    w_dst[i][0] = swizzled_offset(tid / 4 + 64 * i, 2 * c), w_dst[i][1] = swizzled_offset(tid / 4 + 64 * i, 2 * c + 1);
  auto convert = [&](int stage, int buf, const float (&sc)[T::kWCopies]) {
    const uint8_t* ws = stages + stage * T::kStageBytes + T::kABytes;
#pragma unroll
    for (int i = 0; i < T::kWCopies; ++i) {
      const uint4 raw = *reinterpret_cast<const uint4*>(ws + tid * 16 + i * (T::kWBytes / 2));
      const uint4 lo = make_uint4(fp8x2_bf16x2(raw.x & 0xffffu, sc[i]), fp8x2_bf16x2(raw.x >> 16, sc[i]),
                                  fp8x2_bf16x2(raw.y & 0xffffu, sc[i]), fp8x2_bf16x2(raw.y >> 16, sc[i]));
      const uint4 hi = make_uint4(fp8x2_bf16x2(raw.z & 0xffffu, sc[i]), fp8x2_bf16x2(raw.z >> 16, sc[i]),
                                  fp8x2_bf16x2(raw.w & 0xffffu, sc[i]), fp8x2_bf16x2(raw.w >> 16, sc[i]));
      uint8_t* dst = bf + buf * T::kBf16Bytes;
      *reinterpret_cast<uint4*>(dst + w_dst[i][0]) = lo;
      *reinterpret_cast<uint4*>(dst + w_dst[i][1]) = hi;
    }
  };

  float acc[T::kAcc];
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.f;
  // Descriptors of stage 0's A rows and BF16 tile 0's weight rows for this warpgroup; a stage, a
  // tile and a 16 of K add (bytes >> 4) to the start-address field (addresses < 256 KiB: no carry).
  const uint64_t a_desc0 =
      smem_desc(smem_addr + 2 * T::kBf16Bytes + (kBM == 128 ? wg * 64 * kRowBytes : 0));
  const uint64_t b_desc0 = smem_desc(smem_addr + (kBM == 64 ? wg * 64 * kRowBytes : 0));

  // Both warpgroups run every wgmma, even one whose rows all lie past the group's end (its A rows
  // are zeros, its stores skipped): a branch around them makes ptxas serialize the wgmmas (C7518).
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (kt0 + s < kt1) load_stage(s, kt0 + s);
    cp_async_commit();
  }
  int read_stage = 0, write_stage = kAhead;  // (kt - kt0) % kStages, (kt - kt0 + kAhead) % kStages
  for (int kt = kt0; kt < kt1; ++kt) {
    const int j = kt - kt0;
    float sc[T::kWCopies];
#pragma unroll
    for (int i = 0; i < T::kWCopies; ++i) sc[i] = __ldg(s_row[i] + kt * kBK / 128);
    cp_async_wait<kAhead - 1>();  // tile kt has landed (this thread's copies)
    __syncthreads();              // everyone's; tile kt - 2's wgmmas are done in both warpgroups
    const int next = kt + kAhead;
    if (next < kt1) load_stage(write_stage, next);  // the buffer of tile kt - 2
    cp_async_commit();
    convert(read_stage, j % 2, sc);  // while tile kt - 1's wgmmas run
    fence_proxy_async();              // this thread's st.shared and cp.async writes, to wgmma ...
    __syncthreads();                  // ... everyone's
    const uint64_t a_off = uint64_t(read_stage * T::kStageBytes) >> 4;
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == kStages - 1 ? 0 : write_stage + 1;
    const uint64_t b_off = uint64_t((j % 2) * T::kBf16Bytes) >> 4;
    fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma_tile<T>(acc, a_desc0 + a_off + kk * 2, b_desc0 + b_off + kk * 2);  // 32 bytes = 2 << 4
    wgmma_commit();
    wgmma_wait<1>();
    fence_operands(acc);
  }
  wgmma_wait<0>();
  fence_operands(acc);
  cp_async_wait<0>();  // only empty groups remain; leave none behind

  // Thread (g, t) of its warp holds rows g and g + 8 of the warp's 16, columns 8 i + 2 t, + 1 of
  // the warpgroup's kWgN.
  const int lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = m0 + (kBM == 128 ? wg * 64 : 0) + ((tid % 128) / 32) * 16 + g;
  const int col0 = SWIGLU ? int(blockIdx.x) * (kBN / 2) + (kBM == 64 ? wg * (kWgN / 2) : 0)
                          : int(blockIdx.x) * kBN + (kBM == 64 ? wg * kWgN : 0);
  store_warpgroup<kWgN, SWIGLU>(p, acc, row0, m_end, col0, t);
}

template <class T>
void launch_tile(const Params& p, int64_t row_tiles, bool swiglu, int64_t max_rows) {
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_fp8_wgmma_kernel<T, true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_fp8_wgmma_kernel<T, false>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, int(T::kSmemBytes)));
  });
  launch(p, row_tiles, swiglu, max_rows,
         Kernels{grouped_gemm_fp8_wgmma_kernel<T, false>, grouped_gemm_fp8_wgmma_kernel<T, true>, T::kBK,
                 T::kThreads, T::kSmemBytes});
}

}  // namespace

void launch_wgmma(const Params& p, int64_t row_tiles, bool swiglu, int64_t max_rows, int bm) {
  if (bm == 128) launch_tile<WgF8Tile128>(p, row_tiles, swiglu, max_rows);
  else launch_tile<WgF8Tile64>(p, row_tiles, swiglu, max_rows);
}

}  // namespace ms::cuda::grouped_fp8
