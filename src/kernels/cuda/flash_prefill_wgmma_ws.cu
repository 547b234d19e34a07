// The warp-specialized kernel for flash_prefill_wgmma.cu's 128-row blocks ("n128ws", the
// default on a Hopper): the same contract, tiles, slot gather, causal rule and products, on
// 128-key tiles, but the copies leave the consumers. A block has three warpgroups: warpgroup 0 only
// copies K and V into three 64 KB stages; warpgroups 1 and 2 own 64 query rows each and only compute.
// A whole tile of keys whose slots run on (FlashParams::runs; a fresh pool's prefill) is four boxes
// of the caches, which producer thread 0 asks the copy engine for (cp.async.bulk.tensor, bytes
// counted on the stage's barrier); any other tile is gathered by slot (cp.async, 16 bytes a thread
// a row chunk, zeros past the keys). Measured on the H200 (BENCHMARKS, session 38; Qwen3's 32 / 4
// heads at 8192 tokens): 647 TFLOP/s on consecutive slots against 497 when every tile is
// gathered ("n128wscp", kept for that comparison and as the tests' bit-for-bit partner), whose
// 128 threads' copies and address math shared the schedulers with the consumers' softmax; on
// shuffled slots the two are within 1 %.
//
// Why: in the single-role kernel every thread issues 16 copies a tile and the block meets at a
// __syncthreads per tile, so the slowest warpgroup's softmax holds up both warpgroups' next
// products, and the copy instructions share the issue slots of the softmax. Here the stages
// hand over through mbarriers: full[s] completes when the producer's copies of the stage have
// landed (cp.async.mbarrier.arrive.noinc, one arrival a producer thread when its copies are
// done), empty[s] when all 256 consumer threads have waited for their P V of the stage. The
// producer runs up to three tiles ahead (the single-role kernel: one). setmaxnreg moves
// registers from the producer (56) to the consumers (224): 128 x 56 + 256 x 224 = 64512 of the
// 65536 a multiprocessor has, the same as the launch's 168 x 384.
//
// 128-key tiles: each m64n128k16 of S reads Q's 2 KB once for 128 keys (n64 reads it twice), and
// the per-tile waits, fences and max / sum shuffles come half as often.
// Consumers: S of tile t + 1 issued before P V of tile t, the last P V after the loop (a stale
// product past the last tile would wait for a stage nobody fills). cp.async writes are
// generic-proxy and wgmma reads async-proxy: a consumer fences (fence.proxy.async) after its
// full wait, before its products.
// Measured on the H200 (BENCHMARKS, session 8; Qwen3's 32 / 4 heads, causal, every tile
// gathered): 522 TFLOP/s at 8192 tokens against 379 for the single-role 64-key kernel; FA3's
// ping-pong of the two consumers on named barriers measured 476 and was dropped.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda {
namespace {

using namespace wg;

constexpr int kD = 128, kKeys = 128, kStages = 3, kThreads = 384;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
constexpr int kHalfBytes = kKeys * kRowBytes;  // 128 keys x 64 dims: one swizzled column block
constexpr int kTileBytes = 2 * kHalfBytes;     // 128 keys x 128 dims of K (or V)
constexpr int kStageBytes = 2 * kTileBytes;    // K, then V
constexpr int kQHalf = 128 * kRowBytes, kQBytes = 2 * kQHalf;
constexpr int kBarrierOffset = kQBytes + kStages * kStageBytes;  // full[kStages], empty[kStages]
constexpr size_t kSmemBytes = kBarrierOffset + 2 * kStages * 8 + kAtomBytes;  // + alignment slack
// Producer copies: thread i moves 16-byte chunk i % 16 of rows i / 16 + 8 n.
constexpr int kRowsPass = 128 / 16, kPieces = kKeys / kRowsPass;
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "the register file");

// The caches as [pool slots][KV heads][128] for the tensor copies.
struct KvMaps {
  CUtensorMap k, v;
};

template <bool TMA>
__global__ void __launch_bounds__(kThreads, 1)
    flash_prefill_wgmma_ws_kernel(const FlashParams p, const __grid_constant__ KvMaps maps) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // [Q: 2 column blocks of 128 rows][stage: K column blocks 0, 1; V column blocks 0, 1][barriers], 1024-aligned.
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes;
  uint8_t* const smem = smem_raw + (kAtomBytes - misalign) % kAtomBytes;
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t full = smem_addr + kBarrierOffset, empty = full + 8 * kStages;
  const int4 tile = p.tiles[blockIdx.x / p.heads];
  const int h = blockIdx.x % p.heads, kvh = h / p.group;
  const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
  const int keys = vis0 + rows - 1, ntiles = (keys + kKeys - 1) / kKeys;
  const int tid = threadIdx.x, wg = tid / 128;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + 8 * s, 128);
      mbar_init(empty + 8 * s, 256);
    }
  }
  __syncthreads();

  if (wg == 0) {
    set_max_regs_dec<kProducerRegs>();
    const int cc = tid % 16, cr = tid / 16;
    const uint32_t swz = swizzled_offset(cr, cc % 8);
    // Q first: its copies complete before stage 0's arrival, which the consumers wait for.
    {
      const bf16* src = p.q + h * p.q_s1 + cc * 8;
      uint8_t* dst = smem + (cc / 8) * kQHalf + swz;
#pragma unroll 4
      for (int n = 0; n < 128 / kRowsPass; ++n) {
        const int r = cr + n * kRowsPass;
        cp_async16(dst + n * kRowsPass * kRowBytes, src + (r < rows ? int64_t(q0 + r) * p.q_s0 : 0), r < rows);
      }
    }
    // A whole tile of keys on consecutive slots is four boxes of the caches, which thread 0 alone
    // asks the copy engine for; every producer thread still arrives (its Q copies). The next
    // tile's run and first slot are loaded a tile ahead: read where they are needed, their
    // latency came before every gather (6 % at 8192 shuffled keys, session 38).
    int next_run = TMA ? p.runs[kv0] : 0, next_slot = TMA ? p.slots[kv0] : 0;
    for (int t = 0; t < ntiles; ++t) {
      const int stage = t % kStages, run = next_run, first_slot = next_slot;
      if (TMA && t + 1 < ntiles) next_run = p.runs[kv0 + (t + 1) * kKeys], next_slot = p.slots[kv0 + (t + 1) * kKeys];
      if (t >= kStages) mbar_wait(empty + 8 * stage, (t / kStages + 1) & 1);  // tile t - kStages released
      if (TMA && (t + 1) * kKeys <= keys && run >= kKeys) {
        if (tid == 0) {
          const uint32_t bar = full + 8 * stage, dst = smem_addr + kQBytes + stage * kStageBytes;
          fence_proxy_async();  // the stage's last writer may have been cp.async (generic proxy)
          expect_bytes_only(bar, kStageBytes);
          tma_load_3d(dst, &maps.k, 0, kvh, first_slot, bar);
          tma_load_3d(dst + kHalfBytes, &maps.k, 64, kvh, first_slot, bar);
          tma_load_3d(dst + kTileBytes, &maps.v, 0, kvh, first_slot, bar);
          tma_load_3d(dst + kTileBytes + kHalfBytes, &maps.v, 64, kvh, first_slot, bar);
        }
        mbar_arrive_copies(full + 8 * stage);
        continue;
      }
      uint8_t* ks = smem + kQBytes + stage * kStageBytes + (cc / 8) * kHalfBytes + swz;
      uint8_t* vs = ks + kTileBytes;
      // Unrolled: the 16 slot loads go out together, one L2 latency a tile (the producer runs
      // up to three tiles ahead of the products).
#pragma unroll
      for (int n = 0; n < kPieces; ++n) {
        const int j = t * kKeys + cr + n * kRowsPass;
        const int slot = j < keys ? p.slots[kv0 + j] : -1;  // -1 past the keys: copied as zeros
        const int64_t s = slot >= 0 ? slot : 0;
        const int off = n * kRowsPass * kRowBytes;
        cp_async16(ks + off, p.k + s * p.k_s0 + kvh * p.k_s1 + cc * 8, slot >= 0);
        cp_async16(vs + off, p.v + s * p.v_s0 + kvh * p.v_s1 + cc * 8, slot >= 0);
      }
      mbar_arrive_copies(full + 8 * stage);
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy in flight behind the producer
    return;
  }

  set_max_regs_inc<kConsumerRegs>();
  const int cw = wg - 1;  // this consumer's 64 rows: cw * 64..
  // warp: of the block's 128 rows (consumer 0 has warps 0-3), as in the single-role kernel.
  const int warp = tid / 32 - 4, lane = tid % 32, g = lane / 4, qd = lane % 4;

  // This lane's two rows (g and g + 8 of the warp's 16); rows past the tile mask like its last.
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};
  // Keys below warp_full are seen by every row of the warp: tiles that end there need no mask.
  const int warp_full = vis0 + min(warp * 16, rows - 1);
  float o[kD / 8][4] = {};
  float(&o_acc)[kD / 2] = reinterpret_cast<float(&)[kD / 2]>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[kKeys / 16][4];
  const uint64_t q_desc = smem_desc(smem_addr + cw * 64 * kRowBytes);
  const uint32_t kv_addr = smem_addr + kQBytes;

  auto wait_full = [&](int t) {
    mbar_wait(full + 8 * (t % kStages), (t / kStages) & 1);
    fence_proxy_async();
  };
  float s[kKeys / 8][4];  // each tile's first wgmma overwrites it
  float(&s_acc)[kKeys / 2] = reinterpret_cast<float(&)[kKeys / 2]>(s);
  auto scores = [&](int t) {
    // Offsets added to the stage's descriptor: see flash_mla_expanded_wgmma_ws.cu.
    const uint64_t k_desc = smem_desc(kv_addr + (t % kStages) * kStageBytes);
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t q_off = (kk / 4) * kQHalf + (kk % 4) * 32, k_off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
      wgmma_bf16_n128(s_acc, q_desc + (q_off >> 4), k_desc + (k_off >> 4), kk > 0);
    }
    wgmma_commit();
  };
  auto pv = [&](int t) {
    const uint64_t v_desc = smem_desc_nmajor(kv_addr + (t % kStages) * kStageBytes + kTileBytes, kHalfBytes);
    // Keys [16 kk, +16) of V start 16 rows (2048 bytes) on; dims 64.. are the next column block.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_bf16_rs_nmajor128(o_acc, pa[kk], v_desc + ((kk * 16 * kRowBytes) >> 4));
    wgmma_commit();
  };
  float alpha[2];
  wait_full(0);
  wgmma_fence();
  scores(0);
  wgmma_wait<0>();
  fence_operands(s_acc);
  flash_softmax_probs<kKeys>(s, kKeys > warp_full, 0, seen, p.scale_log2, lane, m, l, alpha);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
  // finish(t): P V of tile t done (its stage released), o rescaled, P of tile t + 1 packed. At the
  // top of the next iteration: see flash_mla_expanded_wgmma_ws.cu (ptxas hoisted its wait above
  // the softmax when they shared a basic block).
  auto finish = [&](int t) {
    wgmma_wait<0>();
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    mbar_arrive(empty + 8 * (t % kStages));
    // Once a row's max has settled its factor is exactly 1: a warp whose rows all kept theirs skips the 64 products.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) flash_rescale<kD>(o, alpha);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
  };
  for (int t = 0; t < ntiles - 1; ++t) {
    if (t > 0) finish(t - 1);
    wait_full(t + 1);
    // P and o are written before the wgmma.fence, which orders them before P V reads them.
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    wgmma_fence();
    scores(t + 1);
    pv(t);
    wgmma_wait<1>();  // S of tile t + 1 (committed first)
    fence_operands(s_acc);
    const int k1 = (t + 1) * kKeys;
    flash_softmax_probs<kKeys>(s, k1 + kKeys > warp_full, k1, seen, p.scale_log2, lane, m, l, alpha);
  }
  if (ntiles > 1) finish(ntiles - 2);
  fence_operands(o_acc);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
  wgmma_fence();
  pv(ntiles - 1);
  wgmma_wait<0>();
  fence_operands(o_acc);
  flash_store_rows<kD>(o, l, row, rows,
                        [&](int r) { return p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd; });
}

template <bool TMA>
void launch(const FlashParams& p, unsigned blocks) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(flash_prefill_wgmma_ws_kernel<TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
  });
  KvMaps maps{};
  if (TMA) {
    const uint64_t dims[3] = {uint64_t(kD), uint64_t(p.heads / p.group), uint64_t(p.pool_slots)};
    const uint64_t k_strides[2] = {uint64_t(p.k_s1) * 2, uint64_t(p.k_s0) * 2};
    const uint64_t v_strides[2] = {uint64_t(p.v_s1) * 2, uint64_t(p.v_s0) * 2};
    const uint32_t box[3] = {64, 1, uint32_t(kKeys)};
    maps.k = tiled_bf16_map(p.k, 3, dims, k_strides, box, "attention prefill (k cache)");
    maps.v = tiled_bf16_map(p.v, 3, dims, v_strides, box, "attention prefill (v cache)");
  }
  flash_prefill_wgmma_ws_kernel<TMA><<<blocks, kThreads, kSmemBytes, stream()>>>(p, maps);
  MS_CUDA_LAUNCHED("flash_prefill_wgmma_ws_kernel");
}

}  // namespace

void flash_prefill_wgmma_ws(const FlashParams& p, unsigned blocks) { launch<true>(p, blocks); }
void flash_prefill_wgmma_ws_gather(const FlashParams& p, unsigned blocks) { launch<false>(p, blocks); }

}  // namespace ms::cuda
