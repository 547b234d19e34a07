// Warp-specialized Hopper shapes of the grouped GEMM ("wgmma_ws128x128x64", "wgmma_ws128x256x64"):
// grouped_gemm_wgmma.cu's block tiles, tile table, a_rows gather, ragged edges, products and
// SwiGLU epilogue, but the copies leave the consumers (and the grid is persistent, below). A block has three warpgroups: warpgroup 0 only
// copies (cp.async, A rows gathered through a_rows) into STAGES buffers; warpgroups 1 and 2 own
// 64 of the block's 128 rows each and only issue wgmmas and store.
//
// Why: in the single-role kernel every thread issues its copies between the wgmmas and the block
// meets at a __syncthreads each K tile, so a warpgroup's late wgmmas hold up both, and the copy
// instructions share the consumers' issue slots; the prefill attention gained 38% from this
// split (flash_prefill_wgmma_ws.cu). Here the stages hand over through mbarriers: full[s]
// completes when the producer's 128 threads' copies of the stage have landed
// (cp.async.mbarrier.arrive.noinc), empty[s] when all 256 consumer threads have seen the stage's
// wgmmas complete. No __syncthreads in the main loop: the producer runs up to STAGES K tiles ahead.
// Consumers keep one wgmma group in flight: tile kt's four wgmmas are issued, then tile kt - 1's
// are waited for (wgmma_wait<1>) and its stage released. cp.async writes are generic-proxy and
// wgmma reads async-proxy: a consumer fences (fence.proxy.async) after its full wait.
// setmaxnreg moves registers from the producer (address arithmetic only) to the consumers (the
// BN / 2 f32 sums), as in the attention kernel; the split must fit what the launch gives the
// block (the kernel's register count, the launch bounds' cap, times 384 threads). ptxas holds
// the code after a decrease to the lower count, but never lets the consumers' code past the cap
// (at two blocks an SM, 80: too few for an m64n128 wgmma's sums and operands, a C7602 error), so
// both shapes run one block an SM at 168 registers.
//
// One block an SM, hence persistent: the grid is one block an SM, each walking every
// gridDim-th tile of the (column tile, row tile) grid, and both roles count K tiles across the
// block's tiles, so the producer fetches the next tile's first stages while the consumers finish
// and store the last one (a block an SM of the one-tile-a-block grid would leave the SM's
// tensor cores idle through each block's first copies and its stores).
// Shapes: 128x128 has 6 stages of 32 KB, 128x256 4 stages of 48 KB (192 KB each; the single-role
// kernel: 3 at two blocks an SM, 4).
#include <algorithm>
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

template <int BN, int STAGES, int PRODUCER_REGS, int CONSUMER_REGS>
struct WsTile {
  static constexpr int kBN = BN, kStages = STAGES;
  static constexpr int kProducerRegs = PRODUCER_REGS, kConsumerRegs = CONSUMER_REGS;
  static constexpr int kThreads = 384, kAcc = BN / 2;  // f32 sums a consumer thread
  static constexpr int kABytes = kBM * kRowBytes, kStageBytes = (kBM + BN) * kRowBytes;
  static constexpr int kBarrierOffset = kStages * kStageBytes;  // full[kStages], empty[kStages]
  static constexpr size_t kSmemBytes = kBarrierOffset + 2 * kStages * 8 + kAtomBytes;  // + alignment slack
  // Producer copies: thread i moves 16-byte chunk i % 8 of tile rows i / 8 + 16 j.
  static constexpr int kChunks = kBK / 8, kRowsPass = 128 / kChunks;
  static constexpr int kACopies = kBM / kRowsPass, kBCopies = BN / kRowsPass;
  // The registers the launch gives a thread at one block an SM: the cap ptxas compiles to.
  static constexpr int kLaunchRegs = (65536 / kThreads) / 8 * 8;
  static_assert(kBM == 128 && (BN == 128 || BN == 256), "two m64 consumer warpgroups, one wgmma N");
  static_assert(kStages >= 2, "a stage filling while another is read");
  static_assert(kRowsPass % 8 == 0, "a thread's rows share one swizzle phase");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs, "setmaxnreg within the launch's");
};
// One block an SM, 168 registers a thread at launch: producer 72 (ptxas holds the producer's
// code to it; at 56 the 24 unrolled copies of 128x256 spill), consumers 216.
using WsTile128x128x64 = WsTile<128, 6, 72, 216>;
using WsTile128x256x64 = WsTile<256, 4, 72, 216>;

// The block's tiles: t = blockIdx.x, + gridDim.x, ... of the nx x row-tile grid, x fastest (the
// column tiles of one row tile run together and share its A rows in L2); the row tiles past
// the table's last end the walk, which producer and consumers take alike.
__device__ __forceinline__ bool next_tile(const Params& p, int64_t t, int nx, GroupTile& gt, int& bx) {
  bx = int(t % nx);
  return find_group_tile(p.offsets, p.tile_start, p.experts, kBM, int(t / nx), gt);
}

template <class T, bool SWIGLU>
__global__ void __launch_bounds__(T::kThreads, 1) grouped_gemm_wgmma_ws_kernel(const Params p, int nx) {
  constexpr int kBN = T::kBN, kStages = T::kStages, kRowsPass = T::kRowsPass;
  pdl_wait();  // offsets, tile table and A come from the kernels before

  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The tiles' 1024-byte alignment (the swizzle's): the dynamic base is only 16-byte aligned.
  uint8_t* const smem = smem_raw + ((kAtomBytes - uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes) % kAtomBytes);
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t full = smem_addr + T::kBarrierOffset, empty = full + 8 * kStages;
  const int tid = threadIdx.x;
  // At least one K tile (K = 0: a zero-filled one), so a consumer's first wait is always met.
  const int KT = max(1, (p.K + kBK - 1) / kBK);

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + 8 * s, 128);
      mbar_init(empty + 8 * s, 256);
    }
  }
  __syncthreads();

  // Both roles count the K tiles of all the block's tiles (it): stage it % kStages, phase it / kStages.
  GroupTile gt;
  int bx;
  if (tid < 128) {
    set_max_regs_dec<T::kProducerRegs>();
    const int chunk = tid % T::kChunks, kc = chunk * 8, prow = tid / T::kChunks;
    const uint32_t dst = swizzled_offset(prow, chunk);
    constexpr int kHalf = T::kBCopies / 2;
    int it = 0;
    for (int64_t t = blockIdx.x; next_tile(p, t, nx, gt, bx); t += gridDim.x) {
      // A: the source row of tile rows prow + 16 j, -1 past the expert's rows (copied as zeros).
      int a_row[T::kACopies];
#pragma unroll
      for (int j = 0; j < T::kACopies; ++j) {
        const int gr = gt.m0 + prow + j * kRowsPass;
        a_row[j] = gr < gt.m_end ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : -1;
      }
      // B: tile rows [0, BN / 2) and [BN / 2, BN) as two halves. SwiGLU: the gate and the up rows
      // of the tile's BN / 2 output columns (sums j and j + BN / 2 then sit in one thread).
      const bf16* w_e = p.w[gt.group];
      const bf16* b_base[2] = {w_e, SWIGLU ? p.w2[gt.group] : w_e};
      const int n_first = SWIGLU ? bx * (kBN / 2) + prow : bx * kBN + prow;
      const int b_n[2] = {n_first, SWIGLU ? n_first : n_first + kBN / 2};
      for (int kt = 0; kt < KT; ++kt, ++it) {
        const int stage = it % kStages;
        if (it >= kStages) mbar_wait(empty + 8 * stage, (it / kStages + 1) & 1);  // K tile it - kStages released
        uint8_t* as = smem + stage * T::kStageBytes + dst;
        uint8_t* bs = as + T::kABytes;
        const int k = kt * kBK + kc;
        const bool k_ok = k < p.K;
        // An invalid copy reads nothing (zero fill); its address stays the operand's start.
#pragma unroll
        for (int j = 0; j < T::kACopies; ++j) {
          const bool v = a_row[j] >= 0 && k_ok;
          cp_async16(as + j * kRowsPass * kRowBytes, p.a + (v ? int64_t(a_row[j]) * p.a_ld + k : 0), v);
        }
#pragma unroll
        for (int j = 0; j < T::kBCopies; ++j) {
          const int h = j / kHalf, n = b_n[h] + (j % kHalf) * kRowsPass;
          const bool v = n < p.N && k_ok;
          cp_async16(bs + j * kRowsPass * kRowBytes, b_base[h] + (v ? int64_t(n) * p.w_ld + k : 0), v);
        }
        mbar_arrive_copies(full + 8 * stage);
      }
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy in flight behind the producer
    return;
  }

  set_max_regs_inc<T::kConsumerRegs>();
  const int ctid = tid - 128, cw = ctid / 128;  // this consumer's 64 rows: cw * 64..
  // Descriptors of stage 0's tiles for this warpgroup (its 64 A rows: 8 atoms in); a stage, and
  // a 16 of K, add (bytes >> 4) to the start-address field (addresses < 256 KiB: no carry out).
  const uint64_t a_desc0 = smem_desc(smem_addr + cw * 64 * kRowBytes);
  const uint64_t b_desc0 = smem_desc(smem_addr + T::kABytes);
  float acc[T::kAcc];
  // Both consumers run every wgmma, even one whose 64 rows all lie past the expert's end (its A
  // rows are zeros, its stores skipped): a branch around them makes ptxas serialize the wgmmas.
  auto products = [&](int it) {
    const int stage = it % kStages;
    mbar_wait(full + 8 * stage, (it / kStages) & 1);
    fence_proxy_async();
    const uint64_t stage_off = uint64_t(stage * T::kStageBytes) >> 4;
    fence_operands(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      wgmma_bf16<kBN>(acc, a_desc0 + stage_off + kk * 2, b_desc0 + stage_off + kk * 2);  // 32 bytes = 2 << 4
    wgmma_commit();
  };
  int it = 0;
  for (int64_t t = blockIdx.x; next_tile(p, t, nx, gt, bx); t += gridDim.x) {
#pragma unroll
    for (int i = 0; i < T::kAcc; ++i) acc[i] = 0.f;
    products(it);
    for (int kt = 1; kt < KT; ++kt) {
      products(it + kt);
      wgmma_wait<1>();  // K tile kt - 1's wgmmas have read their stage
      fence_operands(acc);
      mbar_arrive(empty + 8 * ((it + kt - 1) % kStages));
    }
    wgmma_wait<0>();
    fence_operands(acc);
    it += KT;
    mbar_arrive(empty + 8 * ((it - 1) % kStages));  // the producer fills it again for the next tile
    // The stores overlap the producer's first copies of the next tile.
    store_wgmma_tile<kBN, SWIGLU>(p, acc, gt.m0, gt.m_end, bx, ctid);
  }
}

template <class T>
void launch(const Params& p, int64_t row_tiles, bool swiglu) {
  const int64_t bn = swiglu ? T::kBN / 2 : T::kBN, nx = (p.N + bn - 1) / bn;
  // One block an SM, each walking its share of the tiles (row_tiles bounds the table's).
  const unsigned blocks = unsigned(std::min<int64_t>(nx * row_tiles, sm_count()));
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_wgmma_ws_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_wgmma_ws_kernel<T, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  if (swiglu) launch_pdl(grouped_gemm_wgmma_ws_kernel<T, true>, dim3(blocks), dim3(T::kThreads), T::kSmemBytes, p, int(nx));
  else launch_pdl(grouped_gemm_wgmma_ws_kernel<T, false>, dim3(blocks), dim3(T::kThreads), T::kSmemBytes, p, int(nx));
}

}  // namespace

void launch_wgmma_ws_128x128x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WsTile128x128x64>(p, row_tiles, swiglu);
}
void launch_wgmma_ws_128x256x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WsTile128x256x64>(p, row_tiles, swiglu);
}

}  // namespace ms::cuda::grouped_gemm_impl
