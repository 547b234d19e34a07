// The warp-specialized, persistent Hopper shapes of the grouped GEMM ("ws128x256x64",
// "ws128x128x64", "wspp128x128x64", "wsg128x256x64", "wsppg128x128x64"): the same tile table,
// row tiles of 128, gather through a_rows, ragged edges, SwiGLU epilogue and wgmma products
// (m64nBNk16 on 128-byte swizzled tiles) as grouped_gemm_wgmma.cu, but the copies leave the
// threads that multiply, and a block stays on its SM for many tiles.
//
// Why: in grouped_gemm_wgmma.cu every thread issues the cp.async copies of a later K tile
// between its waits and wgmmas, and the block meets at a __syncthreads a K tile; the copy
// instructions and the barrier sit on the path of the products. Worse, a block's life is one
// tile: its prologue (tile search, address set-up, the first stages' latency from L2) and its
// epilogue (SiLU, the stores) leave the tensor cores idle, and at one block an SM nothing else
// fills that gap. Qwen3's down product has only 12 K tiles of 64 (K = 768), so that fixed cost
// is a large part of each tile: it ran ~415-450 TFLOP/s against ~550 for gate|up (K = 2048).
//
// Roles (as flash_prefill_wgmma_ws.cu): warpgroup 0 is the producer, warpgroups 1 and 2 the
// consumers, each owning 64 of the tile's 128 rows and all BN columns (cooperative; ping-pong
// below). The stages hand over through mbarriers: full[s] completes when the 128 producer
// threads' copies of the stage have landed (cp.async.mbarrier.arrive.noinc: one arrival a thread
// when its copies are done); empty[s] when the consumer warps that read it (8; ping-pong 4) have
// each waited for their wgmmas on it (one arrival a warp, by lane 0, after wgmma.wait_group).
// A consumer keeps one K tile's wgmmas in flight while it waits for the next stage (wait_group
// 1, then it releases the stage before), so its tensor-core work is back to back. cp.async
// writes are generic-proxy and wgmma reads through the async proxy: a consumer fences
// (fence.proxy.async) after its full wait.
//
// Persistent grid: one block an SM; block b takes units b, b + grid, ... of the
// existing launch order (unit u: row tile u / n_tiles, N tile u % n_tiles), so the blocks running
// at once still share a few experts' weights through L2. The producer does not stop at a tile's
// end: it fills the next tile's stages while the consumers run their epilogue, so the next tile's
// first wgmmas find their operands waiting. The stage counter runs on across tiles (phase of
// stage s at use q: (q / STAGES) & 1). A consumer looks up its next tile while the last K tile's
// wgmmas run. Epilogue stores go straight from the accumulators, as grouped_gemm_wgmma.cu.
//
// Ping-pong (wspp128x128x64): in the cooperative shapes both consumers finish a tile together,
// so the tensor cores idle through every epilogue (at K = 768 about 1 clock in 25). Here each
// consumer owns all 128 rows (two m64n128 slices, 128 sums a thread) of every other unit: while
// one runs its epilogue the other multiplies. The price: tiles of 128 x 128 read 256 K-rows of
// operands from L2 for 128 x 128 outputs, a third more a product than 128 x 256. The ring is
// still filled in unit order, and a consumer starts a unit only after the other has waited for
// every stage of the unit before (turn[c], one arrival a warp): without that turn a consumer
// back from its epilogue could wait for a stage use two phases ahead of the barrier, which an
// mbarrier's parity wait cannot tell from one phase behind.
//
// Session 8 measured a design like ws128x256x64 (helper-42, reverted in e69b1da: all 256
// consumer threads arriving on empty[s], the producer announcing by arrive.noinc) 10-30 % behind
// grouped_gemm_wgmma.cu, the cause not found. These shapes differ in what could have cost that:
// one empty arrival a warp (256 same-address shared atomics a stage were on the shared-memory
// pipe that the wgmmas read from); ping-pong (the epilogue); and the "g" shapes, whose producer
// does not rely on cp.async.mbarrier.arrive.noinc to keep several stages of copies in flight:
// it commits each stage as a cp.async group, waits until the stage kLag = 2 uses back has landed
// (cp.async.wait_group, as the single-role kernel) and announces that one (a plain arrive, whose
// release orders the landed copies before the consumers' acquiring wait). The announcement comes
// kLag uses late, but the producer runs more than kLag uses ahead of the consumers.
//
// A: gathered row by row (a_rows), so no tensor-map copy fits it; W: a tensor map would need one
// per expert, built on the device (the host only holds a device array of expert pointers), so
// both go by cp.async, 16 bytes a producer thread a row chunk: thread t moves chunk t % 8 of tile
// rows t / 8 + 16 i (a warp reads four whole 128-byte rows an instruction, and every row of a
// thread has the same swizzle phase).
//
// Registers: one block an SM, launched at 168 a thread (384 threads). ptxas holds the
// producer's code to its setmaxnreg.dec count (below 88 it spills: the 16-byte copies' 64-bit
// addresses) and the consumers fit 168 without spilling (128 accumulators at BN 256), so the
// split is 88 / 208 (128 x 88 + 256 x 208 = 384 x 168), the consumers' headroom unneeded but free.
// ws128x256x64: 4 stages of 48 KiB; ws128x128x64 and wspp128x128x64: 6 stages of 32 KiB (more
// tiles of copies in flight; ws128x128x64 holds half the accumulators). Two blocks an SM do not
// fit: at 80 registers a thread ptxas cannot place even an m64n128 wgmma's 64 accumulators.
//
// Consumers run every wgmma even where their 64-row slice lies past the expert's end (a branch
// around a wgmma makes ptxas serialize them, see grouped_gemm_wgmma.cu).
#include <algorithm>
#include <cstdint>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/flash_prefill.h"  // cp_async16 / cp_async_commit / cp_async_wait
#include "kernels/cuda/grouped_gemm_impl.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda::grouped_gemm_impl {
namespace {

using namespace wg;
constexpr int kBK = 64;  // K a tile: one 128-byte swizzle row (see wgmma.cuh)

constexpr int kThreads = 384, kLaunchRegs = 168;  // 65536 / 384, rounded down to ptxas's 8
constexpr int kProducerRegs = 88, kConsumerRegs = 208;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs, "the block's registers");

template <int BN, int STAGES, bool PINGPONG, bool GROUP_ARRIVE>
struct WsTile {
  static constexpr int kBN = BN, kStages = STAGES, kAcc = BN / 2;  // f32 sums a thread an m64 slice
  static constexpr bool kPingPong = PINGPONG, kGroupArrive = GROUP_ARRIVE;
  // GROUP_ARRIVE: a producer thread announces stage use q - kLag after issuing use q.
  static constexpr int kLag = 2;
  static constexpr int kEmptyArrivals = PINGPONG ? 4 : 8;  // the warps that read a stage
  static constexpr int kABytes = kBM * kRowBytes, kStageBytes = (kBM + BN) * kRowBytes;
  static constexpr int kBarrierOffset = kStages * kStageBytes;  // full[kStages], empty[kStages], turn[2]
  static constexpr size_t kSmemBytes = size_t(kBarrierOffset) + (2 * kStages + 2) * 8 + kAtomBytes;  // + align slack
  static constexpr int kRowsPass = 128 / 8;  // the producer's 128 threads, 8 chunks a row
  static constexpr int kACopies = kBM / kRowsPass, kBCopies = BN / kRowsPass;
  static_assert(kBM == 128 && (BN == 128 || BN == 256), "two m64 slices, one wgmma N");
  static_assert(!PINGPONG || BN == 128, "a ping-pong consumer holds 2 x BN / 2 sums: 128 fit");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
  // The consumers release use q - kStages only once they have use q - kStages + 1 (wait_group 1).
  static_assert(!GROUP_ARRIVE || kLag <= kStages - 2, "announced before the producer needs it back");
};
using WsTile128x256x64 = WsTile<256, 4, false, false>;
using WsTile128x128x64 = WsTile<128, 6, false, false>;
using WsPingPong128x128x64 = WsTile<128, 6, true, false>;
using WsGroupTile128x256x64 = WsTile<256, 4, false, true>;
using WsGroupPingPong128x128x64 = WsTile<128, 6, true, true>;

template <class T, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 1) grouped_gemm_ws_kernel(const Params p, int n_tiles) {
  constexpr int kBN = T::kBN, kStages = T::kStages, kRowsPass = T::kRowsPass;
  constexpr int kTileN = SWIGLU ? kBN / 2 : kBN;  // output columns a unit
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The tiles' 1024-byte alignment (the swizzle's): the dynamic base is only 16-byte aligned.
  uint8_t* const smem = smem_raw + ((kAtomBytes - uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes) % kAtomBytes);
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t full = smem_addr + T::kBarrierOffset, empty = full + 8 * kStages, turn = empty + 8 * kStages;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + 8 * s, 128);
      mbar_init(empty + 8 * s, T::kEmptyArrivals);
    }
    for (int c = 0; c < 2; ++c) mbar_init(turn + 8 * c, 4);
  }
  __syncthreads();
  pdl_wait();  // offsets, tile table and A come from the kernels before
  const int KT = (p.K + kBK - 1) / kBK;
  auto unit_tile = [&](int u, GroupTile& gt) {
    return find_group_tile(p.offsets, p.tile_start, p.experts, kBM, u / n_tiles, gt);
  };

  if (wg == 0) {
    set_max_regs_dec<kProducerRegs>();
    const int chunk = tid % 8, kc = chunk * 8, r0 = tid / 8;
    const uint32_t dst = swizzled_offset(r0, chunk);
    uint32_t q = 0;  // stages filled so far, over all units
    GroupTile gt;
    for (int u = blockIdx.x; unit_tile(u, gt); u += gridDim.x) {
      const bf16* a_src[T::kACopies];
#pragma unroll
      for (int i = 0; i < T::kACopies; ++i) {
        const int gr = gt.m0 + r0 + i * kRowsPass;
        const int64_t src_row = gr < gt.m_end ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : 0;
        a_src[i] = p.a + src_row * p.a_ld + kc;
      }
      // B row r0 + 16 i of the tile is weight row nb + 16 i; with SwiGLU rows [0, BN / 2) are gate
      // rows of the unit's BN / 2 columns and [BN / 2, BN) the same up rows, so that sums column j
      // and j + BN / 2 sit in one consumer thread (as grouped_gemm_wgmma.cu).
      const int nb = (u % n_tiles) * kTileN + r0;
      const bf16* const w_e = p.w[gt.group];
      const bf16* const w2_e = SWIGLU ? p.w2[gt.group] : nullptr;
      for (int kt = 0; kt < KT; ++kt, ++q) {
        const int s = q % kStages;
        if (q >= kStages) mbar_wait(empty + 8 * s, (q / kStages + 1) & 1);  // use q - kStages released
        uint8_t* const as = smem + s * T::kStageBytes + dst;
        uint8_t* const bs = as + T::kABytes;
        const int k = kt * kBK;
        const bool k_ok = k + kc < p.K;
        // An invalid copy reads nothing (zero fill); its address stays inside the operand.
#pragma unroll
        for (int i = 0; i < T::kACopies; ++i) {
          const bool v = gt.m0 + r0 + i * kRowsPass < gt.m_end && k_ok;
          cp_async16(as + i * kRowsPass * kRowBytes, a_src[i] + (v ? k : 0), v);
        }
#pragma unroll
        for (int i = 0; i < T::kBCopies; ++i) {
          constexpr int kHalf = T::kBCopies / 2;
          const int n = nb + (SWIGLU ? i % kHalf : i) * kRowsPass;
          const bf16* const base = SWIGLU && i >= kHalf ? w2_e : w_e;
          const bool v = n < p.N && k_ok;
          cp_async16(bs + i * kRowsPass * kRowBytes, base + (v ? int64_t(n) * p.w_ld + k : 0) + kc, v);
        }
        if constexpr (T::kGroupArrive) {
          cp_async_commit();
          cp_async_wait<T::kLag>();  // use q - kLag has landed
          if (q >= T::kLag) mbar_arrive(full + 8 * ((q - T::kLag) % kStages));
        } else {
          mbar_arrive_copies(full + 8 * s);
        }
      }
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy in flight behind the producer
    if constexpr (T::kGroupArrive)
      for (uint32_t r = q > T::kLag ? q - T::kLag : 0; r < q; ++r) mbar_arrive(full + 8 * (r % kStages));
    return;
  }

  set_max_regs_inc<kConsumerRegs>();
  // Cooperative: this consumer's 64 rows of every unit. Ping-pong: all 128 rows (two m64
  // slices) of every other unit, starting at unit cw.
  const int cw = wg - 1, lane = tid % 32, g = lane / 4, t = lane % 4;
  constexpr int kSlices = T::kPingPong ? 2 : 1, kUnitStep = T::kPingPong ? 2 : 1;
  const int slice0 = T::kPingPong ? 0 : cw;
  const int warp_row = ((tid % 128) / 32) * 16 + g;  // the thread's rows of a slice: this and + 8
  // Descriptors of stage 0's tiles (slice i's 64 A rows: 8 i atoms in); a stage, and a 16 of K,
  // add (bytes >> 4) to the start-address field (addresses < 256 KiB: no carry out).
  const uint64_t a_desc0 = smem_desc(smem_addr + slice0 * 64 * kRowBytes);
  const uint64_t b_desc0 = smem_desc(smem_addr + T::kABytes);
  float acc[kSlices][T::kAcc];
  int j = T::kPingPong ? cw : 0;  // the block's j-th unit: unit u = blockIdx.x + j * grid
  int u = blockIdx.x + j * gridDim.x;
  GroupTile gt;
  bool have = unit_tile(u, gt);
  while (have) {
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl)
#pragma unroll
      for (int i = 0; i < T::kAcc; ++i) acc[sl][i] = 0.f;
    // Ping-pong: the other consumer has waited for every stage of unit j - 1 (its (j - 1) / 2-th
    // unit): the stages' full phases are then at most one behind this unit's uses.
    if (T::kPingPong && j > 0) mbar_wait(turn + 8 * cw, ((j - 1) / 2) & 1);
    uint32_t q = uint32_t(j) * KT;  // the unit's first stage use, as the producer counts them
    for (int kt = 0; kt < KT; ++kt, ++q) {
      const int s = q % kStages;
      mbar_wait(full + 8 * s, (q / kStages) & 1);
      fence_proxy_async();
      const uint64_t stage_off = uint64_t(s * T::kStageBytes) >> 4;
#pragma unroll
      for (int sl = 0; sl < kSlices; ++sl) fence_operands(acc[sl]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)
#pragma unroll
        for (int sl = 0; sl < kSlices; ++sl)  // 64 rows = 8 KiB = 512 << 4; 32 bytes of K = 2 << 4
          wgmma_bf16<kBN>(acc[sl], a_desc0 + stage_off + sl * 512 + kk * 2, b_desc0 + stage_off + kk * 2);
      wgmma_commit();
      wgmma_wait<1>();  // the wgmmas of use q - 1 are done: its stage goes back
#pragma unroll
      for (int sl = 0; sl < kSlices; ++sl) fence_operands(acc[sl]);
      if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * ((q - 1) % kStages));
    }
    if (T::kPingPong && lane == 0) mbar_arrive(turn + 8 * (1 - cw));  // the other's turn
    const GroupTile cur = gt;
    const int col0 = u % n_tiles * kTileN;
    j += kUnitStep, u += kUnitStep * gridDim.x;
    have = unit_tile(u, gt);  // while the last K tile's wgmmas run
    wgmma_wait<0>();
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl) fence_operands(acc[sl]);
    if (KT > 0 && lane == 0) mbar_arrive(empty + 8 * ((q - 1) % kStages));

    // Thread (g, t) of its warp holds rows g and g + 8 of the warp's 16, columns 8 i + 2 t, + 1.
#pragma unroll
    for (int sl = 0; sl < kSlices; ++sl)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = cur.m0 + (slice0 + sl) * 64 + warp_row + h * 8;
        if (r >= cur.m_end) continue;
        bf16* crow = p.c + int64_t(r) * p.c_ld;
        if constexpr (SWIGLU) {
#pragma unroll
          for (int i = 0; i < kBN / 16; ++i) {
            const int col = col0 + i * 8 + 2 * t;
            if (col >= p.N) continue;
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float gate = acc[sl][4 * i + 2 * h + e], up = acc[sl][4 * (i + kBN / 16) + 2 * h + e];
              v[e] = gate / (1.0f + expf(-gate)) * up;
            }
            store_pair(crow + col, v[0], v[1], p.pair_stores, col + 1 < p.N);
          }
        } else {
#pragma unroll
          for (int i = 0; i < kBN / 8; ++i) {
            const int col = col0 + i * 8 + 2 * t;
            if (col >= p.N) continue;
            store_pair(crow + col, acc[sl][4 * i + 2 * h], acc[sl][4 * i + 2 * h + 1], p.pair_stores, col + 1 < p.N);
          }
        }
      }
  }
}

template <class T>
void launch(const Params& p, int64_t row_tiles, bool swiglu) {
  const int64_t bn = swiglu ? T::kBN / 2 : T::kBN;
  const int64_t n_tiles = (p.N + bn - 1) / bn;
  // Units are ints on the device (the unit past the last one, a block's end, included).
  MS_CHECK((row_tiles + 1) * n_tiles + sm_count() < (int64_t(1) << 31), "grouped_gemm: ", row_tiles, " x ", n_tiles,
           " tiles");
  // Units past the last row tile (row_tiles is a bound) find no tile and end their block.
  const int64_t blocks = std::min<int64_t>(row_tiles * n_tiles, int64_t(sm_count()));
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_ws_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_ws_kernel<T, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  const dim3 grid{unsigned(blocks)}, block{unsigned(kThreads)};
  if (swiglu) launch_pdl(grouped_gemm_ws_kernel<T, true>, grid, block, T::kSmemBytes, p, int(n_tiles));
  else launch_pdl(grouped_gemm_ws_kernel<T, false>, grid, block, T::kSmemBytes, p, int(n_tiles));
}

}  // namespace

void launch_ws_128x256x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WsTile128x256x64>(p, row_tiles, swiglu);
}
void launch_ws_128x128x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WsTile128x128x64>(p, row_tiles, swiglu);
}
void launch_wspp_128x128x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WsPingPong128x128x64>(p, row_tiles, swiglu);
}
void launch_wsg_128x256x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WsGroupTile128x256x64>(p, row_tiles, swiglu);
}
void launch_wsppg_128x128x64(const Params& p, int64_t row_tiles, bool swiglu) {
  launch<WsGroupPingPong128x128x64>(p, row_tiles, swiglu);
}

}  // namespace ms::cuda::grouped_gemm_impl
