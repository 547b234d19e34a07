// The Hopper shapes of the grouped GEMM (grouped_gemm.h): the same grid, tile table, gather,
// ragged edges and SwiGLU as grouped_gemm.cu's mma.sync kernel, but the products on warpgroup
// MMAs (wgmma.mma_async m64nNk16, f32 += bf16 * bf16) that read both operands straight from
// shared memory. Two warpgroups of 128 threads each own 64 of the block's 128 rows and all BN
// columns (one m64nBNk16 a 16 of K); every thread also copies operands in.
//
// Why: mma.sync feeds its tensor cores through registers (ldmatrix, then one instruction a
// 16x8x16 product) and reaches ~200 TFLOP/s on the H200; wgmma reads its tiles from shared
// memory itself, with no register traffic and no per-product issue, and is the only way to the
// ~800 TFLOP/s rate. In grouped_gemm.cu's units (bytes of shared memory an m16n8k16 product) a
// 64 x BN x 16 wgmma reads (64 + BN) * 32 bytes for BN / 2 products: 80 at BN 256, 96 at 128,
// against 128 for the mma.sync kernel's 64x64 warps; the cp.async fills add 48 and 64.
//
// Pipeline: K tiles of 64 go through STAGES buffers by cp.async (the A rows are gathered through
// a_rows a row at a time, so a tensor-map copy does not fit A; W could take one, not done here).
// Each K tile: wait for its copies, fence.proxy.async (cp.async writes are generic-proxy writes,
// wgmma reads through the async proxy), __syncthreads, issue the copies of a later tile into the
// buffer whose wgmmas are known finished, then wgmma.fence, four wgmmas, commit, and wait until
// at most IN_FLIGHT of this warpgroup's groups are pending. With IN_FLIGHT 1 a tile's wgmmas run
// while the next iteration waits and copies; the buffer reused is then the one of two tiles back,
// so STAGES - 1 - IN_FLIGHT tiles are in flight as copies.
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/flash_prefill.h"  // cp_async16 / cp_async_commit / cp_async_wait
#include "kernels/cuda/grouped_gemm_impl.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda::grouped_gemm_impl {
namespace {

using namespace wg;
constexpr int kBK = 64;  // K a tile: one 128-byte swizzle row (see wgmma.cuh)

// A block of kBM x BN outputs on two warpgroups, K tiles through STAGES buffers of A and B.
template <int BN, int STAGES, int IN_FLIGHT, int MIN_BLOCKS>
struct WgTile {
  static constexpr int kBN = BN, kStages = STAGES, kInFlight = IN_FLIGHT, kMinBlocks = MIN_BLOCKS;
  static constexpr int kThreads = 256, kAcc = BN / 2;  // f32 sums a thread
  static constexpr int kABytes = kBM * kRowBytes, kStageBytes = (kBM + BN) * kRowBytes;
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageBytes + kAtomBytes;  // + alignment slack
  static constexpr int kChunks = kBK / 8, kRowsPass = kThreads / kChunks;  // 32 rows a pass of copies
  static constexpr int kACopies = kBM / kRowsPass, kBCopies = kBN / kRowsPass;
  static_assert(kBM == 128 && (BN == 128 || BN == 256), "two m64 warpgroups, one wgmma N");
  static_assert(kStages - 1 - kInFlight >= 1, "at least one tile of copies ahead");
  static_assert(kRowsPass % 8 == 0, "a thread's rows share one swizzle phase");
  static_assert(kSmemBytes * kMinBlocks <= 227 * 1024, "shared memory of the blocks an SM");
};
// 97 KiB, two blocks an SM: each waits for its own wgmmas, the other block's fill the gap.
using WgTile128x128x64 = WgTile<128, 3, 0, 2>;
// 193 KiB, one block an SM: a K tile's wgmmas overlap the next tile's wait and copies.
using WgTile128x256x64 = WgTile<256, 4, 1, 1>;

template <class T, bool SWIGLU>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) grouped_gemm_wgmma_kernel(const Params p) {
  constexpr int kBN = T::kBN, kStages = T::kStages, kRowsPass = T::kRowsPass;
  pdl_wait();  // offsets, tile table and A come from the kernels before
  GroupTile gt;
  if (!find_group_tile(p.offsets, p.tile_start, p.experts, kBM, blockIdx.y, gt)) return;
  const int e = gt.group, m0 = gt.m0, m_end = gt.m_end;

  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The tiles' 1024-byte alignment (the swizzle's): the dynamic base is only 16-byte aligned.
  uint8_t* const smem = smem_raw + ((kAtomBytes - uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes) % kAtomBytes);
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const int tid = threadIdx.x, wg = tid / 128;

  // This thread's copies: chunk tid % 8 of tile rows tid / 8 + 32 i (all one swizzle phase).
  const int chunk = tid % T::kChunks, kc = chunk * 8;
  const uint32_t dst = swizzled_offset(tid / T::kChunks, chunk);
  const bf16* a_src[T::kACopies];
  const bf16* b_src[T::kBCopies];
  bool a_ok[T::kACopies], b_ok[T::kBCopies];
#pragma unroll
  for (int i = 0; i < T::kACopies; ++i) {
    const int gr = m0 + tid / T::kChunks + i * kRowsPass;
    a_ok[i] = gr < m_end;
    const int64_t src_row = a_ok[i] ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : 0;
    a_src[i] = p.a + src_row * p.a_ld + kc;
  }
  const bf16* w_e = p.w[e];
  const bf16* w2_e = SWIGLU ? p.w2[e] : nullptr;
#pragma unroll
  for (int i = 0; i < T::kBCopies; ++i) {
    const int row = tid / T::kChunks + i * kRowsPass;
    int n;
    const bf16* base = w_e;
    if constexpr (SWIGLU) {
      // Tile rows [0, BN / 2): gate rows of the block's BN / 2 columns; [BN / 2, BN): the same up
      // rows. Sums column j and j + BN / 2 then sit in one thread (d[4i..] and d[4i + BN / 4..]).
      n = blockIdx.x * (kBN / 2) + row % (kBN / 2);
      if (row >= kBN / 2) base = w2_e;
    } else {
      n = blockIdx.x * kBN + row;
    }
    b_ok[i] = n < p.N;
    b_src[i] = base + (b_ok[i] ? int64_t(n) * p.w_ld : 0) + kc;
  }
  auto load_stage = [&](int stage, int kt) {
    uint8_t* as = smem + stage * T::kStageBytes;
    uint8_t* bs = as + T::kABytes;
    const int k = kt * kBK;
    const bool k_ok = k + kc < p.K;
    // An invalid copy reads nothing (zero fill); its address stays the row's start, inside the operand.
#pragma unroll
    for (int i = 0; i < T::kACopies; ++i) {
      const bool v = a_ok[i] && k_ok;
      cp_async16(as + dst + i * kRowsPass * kRowBytes, a_src[i] + (v ? k : 0), v);
    }
#pragma unroll
    for (int i = 0; i < T::kBCopies; ++i) {
      const bool v = b_ok[i] && k_ok;
      cp_async16(bs + dst + i * kRowsPass * kRowBytes, b_src[i] + (v ? k : 0), v);
    }
  };

  float acc[T::kAcc];
#pragma unroll
  for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.f;
  // Descriptors of stage 0's tiles for this warpgroup (its 64 A rows: 8 atoms in); a stage, and
  // a 16 of K, add (bytes >> 4) to the start-address field (addresses < 256 KiB: no carry out).
  const uint64_t a_desc0 = smem_desc(smem_addr + wg * 64 * kRowBytes);
  const uint64_t b_desc0 = smem_desc(smem_addr + T::kABytes);

  // Both warpgroups run every wgmma, even one whose 64 rows all lie past the expert's end (its A
  // rows are zeros, its stores skipped): a branch around them, though warpgroup-uniform, makes
  // ptxas serialize the wgmmas (C7518, "WG.DP in divergent path").
  const int KT = (p.K + kBK - 1) / kBK;
  constexpr int kAhead = kStages - 1 - T::kInFlight;  // tiles of copies in flight
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kAhead - 1>();  // tile kt has landed (this thread's copies) ...
    fence_proxy_async();          // ... is visible to wgmma ...
    __syncthreads();              // ... everyone's; and every warpgroup has waited for tile kt - 1 - IN_FLIGHT
    const int next = kt + kAhead;
    if (next < KT) load_stage(next % kStages, next);  // the buffer of tile kt - 1 - IN_FLIGHT
    cp_async_commit();
    const uint64_t stage_off = uint64_t((kt % kStages) * T::kStageBytes) >> 4;
    fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma_bf16<kBN>(acc, a_desc0 + stage_off + kk * 2, b_desc0 + stage_off + kk * 2);  // 32 bytes = 2 << 4
    wgmma_commit();
    wgmma_wait<T::kInFlight>();
    fence_operands(acc);
  }
  wgmma_wait<0>();
  fence_operands(acc);
  cp_async_wait<0>();  // only empty groups remain; leave none behind

  // Thread (g, t) of its warp holds rows g and g + 8 of the warp's 16, columns 8 i + 2 t, + 1.
  const int lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = m0 + wg * 64 + ((tid % 128) / 32) * 16 + g;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + h * 8;
    if (r >= m_end) continue;
    bf16* crow = p.c + int64_t(r) * p.c_ld;
    if constexpr (SWIGLU) {
#pragma unroll
      for (int i = 0; i < kBN / 16; ++i) {
        const int col = blockIdx.x * (kBN / 2) + i * 8 + 2 * t;
        if (col >= p.N) continue;
        float v[2];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const float gate = acc[4 * i + 2 * h + q], up = acc[4 * (i + kBN / 16) + 2 * h + q];
          v[q] = silu_mul(gate, up);
        }
        store_pair(crow + col, v[0], v[1], p.pair_stores, col + 1 < p.N);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBN / 8; ++i) {
        const int col = blockIdx.x * kBN + i * 8 + 2 * t;
        if (col >= p.N) continue;
        store_pair(crow + col, acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1], p.pair_stores, col + 1 < p.N);
      }
    }
  }
}

template <class T>
void launch(const Params& p, int64_t row_tiles, bool swiglu) {
  const int64_t bn = swiglu ? T::kBN / 2 : T::kBN;
  const dim3 grid(unsigned((p.N + bn - 1) / bn), unsigned(row_tiles));
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_wgmma_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_wgmma_kernel<T, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  if (swiglu) launch_pdl(grouped_gemm_wgmma_kernel<T, true>, grid, dim3(T::kThreads), T::kSmemBytes, p);
  else launch_pdl(grouped_gemm_wgmma_kernel<T, false>, grid, dim3(T::kThreads), T::kSmemBytes, p);
}

}  // namespace

void launch_wgmma_128x128x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WgTile128x128x64>(p, row_tiles, swiglu);
}
void launch_wgmma_128x256x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WgTile128x256x64>(p, row_tiles, swiglu);
}

}  // namespace ms::cuda::grouped_gemm_impl
