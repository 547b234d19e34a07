// Variants of flash_prefill_wgmma_ws.cu's warp-specialized 128-row kernel ("n128ws"), picked by
// name in flash_prefill_wgmma.cu's table so that one binary times them side by side:
//   "n128kv"   K and V of a stage on separate mbarriers, the producer's slot loads one tile early;
//   "n128kvx"  n128kv, plus O's rescale moved under the S product and a quarter of the
//              exponentials on the FMA pipe (a cubic, as FlashAttention-4 does on Blackwell);
//   "n128kvp"  n128kv's kernel launched persistent: one CTA a multiprocessor walks its items;
//   "n128kvxp" n128kvx's launched so: all of the above, should each win alone.
// Same contract, tiles, shared layout (Q, three stages of K | V, 1024-aligned), slot gather,
// causal rule and products as n128ws; only the hand-over and the softmax's instruction mix differ.
//
// The cycle budget (an H200 SM: 4 tensor cores of 512 bf16 MACs a clock, 16 MUFU ex2 and 128
// FP32 lanes a clock, one warp instruction a clock per scheduler). A 128-key tile of the block is
// 2 consumers x (S 64x128x128 + P V 64x128x128) = 4.19 M MACs = 2048 tensor clocks. Per consumer
// warp and tile: 64 ex2 = 64 MUFU instructions at 8 clocks = 512 clocks; ~300 FP32 instructions
// (scale, max, subtract, sum, 64 rescale FMULs) and 32 bf16 packs. Both consumer warps of a
// scheduler: 1024 MUFU clocks and ~900 issue slots of the 2048. So on paper the block is
// tensor-bound as long as each consumer's softmax (~650 clocks) fits under the other one's
// products (1024), which n128ws's S-before-P V order allows; it measures 522-531 TFLOP/s, 65 % of
// cuBLAS's 804, so something stalls the products. What the arithmetic points at:
//
// 1. The producer's lead (n128kv). In n128ws a stage is one barrier for K and V together and is
//    released when P V of its tile is done; since S of tile t + 1 is issued with P V of tile t,
//    the stage that takes tile t + 3 frees at the end of consumer iteration t and is waited for
//    at the start of iteration t + 2: one iteration, 2048 clocks (~1.3 us), for the whole chain
//    wake-up -> 16 dependent slot loads (an L2 round trip, ~600 clocks) -> 32 cp.async a thread ->
//    64 KB from L2 under every SM's load (~800-1500 clocks). That fits on average and misses
//    under contention, and a miss idles both consumers. Here K and V have their own full and
//    empty barriers: K of tile t is released as soon as S of tile t is done (in iteration t - 1),
//    V when P V is done (iteration t). The producer issues K, V, K, V, ..., so K of tile t + 3
//    goes out behind V of tile t + 2, at the end of iteration t - 1, and is needed at the start
//    of iteration t + 2; V of tile t + 3 goes out at the end of iteration t and is needed in
//    iteration t + 3: two iterations of lead for both, twice n128ws's. The slot indices of tile t + 1 are loaded right after tile t's
//    copies go out, so their latency passes while the producer waits for the next stage, and the
//    block's first S waits for Q and K only, not V. Costs: 2 more barrier waits a tile for the
//    consumers (one try_wait each when the data is there) and the producer's registers: with the
//    next slots live across its waits it spills below 96 (n128ws's producer fits in 40), so
//    setmaxnreg gives the consumers 200, not 224 (n128kvx spills at 192):
//    128 x 96 + 256 x 200 = 63488 of the launch's 168 x 384 = 64512.
// 2. The consumer's serial tail (n128kvx). Between P V of tile t completing and the next products
//    going out, n128ws runs the rescale of O (64 FMULs) and the pack of P (32 F2FP), ~130 clocks
//    in which this consumer has nothing on the tensor cores. Here the rescale by the previous
//    tile's alpha runs after S of tile t + 1 is issued and before P V of tile t is (as FA3 does):
//    under the 512 clocks of S. Only the pack stays in the tail.
// 3. The exponentials (n128kvx). Both consumers start a block on the same full barrier and so tend
//    to run their softmaxes in phase; then a scheduler's MUFU owes 1024 clocks a tile, half the
//    tensor time, on the consumers' critical path. Moving a fraction f of the 64 ex2 a thread to
//    an FMA-pipe polynomial (Cody-Waite: floor by an add rounding down, 3 FFMA Horner, the
//    exponent by shift + add: 9 instructions) costs 9 * 64 f FP32 issue slots and saves 512 f
//    MUFU clocks a warp: MUFU 512 (1 - f) against FP32 ~300 + 576 f balance near f = 0.2; f = 1/4
//    (key groups n % 4 == 3) gives MUFU 384 and FP32 ~444 clocks a warp. The cubic's relative
//    error is 8.6e-5 (minimax on [0, 1), coefficients fitted for this file; 8.8e-5 after
//    float rounding, checked in a bit-exact emulation), 45 times below P's bf16 rounding;
//    masked scores (-inf) give exactly 0.
// 4. The per-block cost (n128kvp). Session 8's n128ws times, 0.299 ms at 4096 tokens (1024 blocks,
//    528 x 32 tile-blocks: 7.76 blocks and 128 tiles a multiprocessor) and 1.054 ms at 8192
//    (2048 blocks; 15.5 and 504), fit time = 1.84 us a tile + 8.2 us a block: the tiles alone
//    would run at ~600 TFLOP/s, and the blocks' starts and ends cost 12 % at 8k, 21 % at 4k. A
//    block starts with Q, the first slots and K from memory (~2000 clocks) and a first S and
//    softmax with nothing under them, and ends with a last P V and the stores with nothing
//    after; the next block on that multiprocessor starts only then. Here the CTA stays: its
//    producer runs into the next item as soon as both consumers' last S of the item is done (a
//    q_empty barrier guards the one Q buffer) while the consumers finish (softmax, two P V, the
//    stores: ~1500 clocks), and the stages carry on in one sequence across items. Items go to the
//    CTAs in a snake over rounds of the grid (round r forwards when even, backwards when odd), so
//    that in the longest-first order each CTA's sum of tiles is within about one item of the
//    others' (a plain stride would give CTA 0 the longest item of every round, ~6 % more at 8k).
// Not tried here: a ping-pong of the consumers on named barriers (n128pp in session 8 lost 9 %:
// it forces the alternation the tensor-core queue already gives, and adds two bar.sync a tile
// to each consumer's critical path), 4 stages (32 + 4 x 64 KB is over the 227 KB of shared
// memory), 3 consumers of 64 rows (O, S and P in registers are 160 a thread before addresses;
// 3 x 128 x 160 + 128 x 24 = 64512 leaves no room to overlap S of the next tile with P V).
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/wgmma.cuh"

#include <algorithm>

namespace ms::cuda {
namespace {

using namespace wg;

constexpr int kD = 128, kKeys = 128, kStages = 3, kThreads = 384;
constexpr int kProducerRegs = 96, kConsumerRegs = 200;
constexpr int kHalfBytes = kKeys * kRowBytes;  // 128 keys x 64 dims: one swizzled column block
constexpr int kTileBytes = 2 * kHalfBytes;     // 128 keys x 128 dims of K (or V)
constexpr int kStageBytes = 2 * kTileBytes;    // K, then V
constexpr int kQHalf = 128 * kRowBytes, kQBytes = 2 * kQHalf;
// full_k[kStages], full_v[kStages], empty_k[kStages], empty_v[kStages], q_empty
constexpr int kBarrierOffset = kQBytes + kStages * kStageBytes;
constexpr size_t kSmemBytes = kBarrierOffset + (4 * kStages + 1) * 8 + kAtomBytes;  // + alignment slack
// Producer copies: thread i moves 16-byte chunk i % 16 of rows i / 16 + 8 n.
constexpr int kRowsPass = 128 / 16, kPieces = kKeys / kRowsPass;
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 168 * kThreads, "what the launch holds");

// 2^x for x <= 0 on the FMA pipe: x = j + f with j = floor(x) (adding 1.5 * 2^23 rounding down
// leaves j in the low mantissa bits) and f in [0, 1); 2^f by a cubic (minimax in relative error,
// 8.6e-5), then j added to its exponent. x clamps to -127, where the sum of the exponent bits
// is exactly 0: masked scores (-inf) give 0 as ex2 does; (-127, -126) gives denormals < 2^-126.
__device__ __forceinline__ float exp2_poly3(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23
  x = fmaxf(x, -127.f);
  const float jr = __fadd_rd(x, kRound);
  const float f = x - (jr - kRound);
  const float p = fmaf(fmaf(fmaf(0.0770670548f, f, 0.22764498f), f, 0.695116818f), f, 1.f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(jr) << 23));
}

// flash_softmax_probs (flash_softmax.cuh) with the exponentials of key groups n % 4 == 3 (a
// quarter) on exp2_poly3; the same results to the cubic's error.
template <int KEYS>
__device__ __forceinline__ void softmax_probs_mixed(float (&s)[KEYS / 8][4], bool diagonal, int k0,
                                                    const int (&seen)[2], float scale_log2, int lane, float (&m)[2],
                                                    float (&l)[2], float (&alpha)[2]) {
  const int qd = lane % 4;
  if (diagonal) {
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + n * 8 + 2 * qd + (i & 1);
        s[n][i] = key < seen[i >> 1] ? s[n][i] * scale_log2 : -INFINITY;
      }
  } else {
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] *= scale_log2;
  }
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[n][i]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = fmaxf(m[r], tile_max[r]);  // finite: key 0 is in the first tile of every row
    alpha[r] = exp2_ftz(m[r] - m_new);
    m[r] = m_new;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x = s[n][i] - m[i >> 1];
      s[n][i] = n % 4 == 3 ? exp2_poly3(x) : exp2_ftz(x);
      l[i >> 1] += s[n][i];
    }
}

// A CTA takes the items (tile w / heads, head w % heads of the plan's longest-first order) of
// its column in a snake over rounds of gridDim.x: with one CTA an item (n128kv, n128kvx) that is
// item blockIdx.x alone; persistent (n128kvp) each CTA's items sum to about the same length.
__device__ __forceinline__ int item_of(int round, int items) {
  const int base = round * int(gridDim.x);
  const int w = base + (round % 2 == 0 ? int(blockIdx.x) : int(gridDim.x) - 1 - int(blockIdx.x));
  return base < items && w < items ? w : -1;
}

template <bool TUNED>
__global__ void __launch_bounds__(kThreads, 1) flash_prefill_wgmma_kv_kernel(const FlashParams p, int items) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes;
  uint8_t* const smem = smem_raw + (kAtomBytes - misalign) % kAtomBytes;
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t full_k = smem_addr + kBarrierOffset, full_v = full_k + 8 * kStages;
  const uint32_t empty_k = full_v + 8 * kStages, empty_v = empty_k + 8 * kStages;
  const uint32_t q_empty = empty_v + 8 * kStages;  // completes when both consumers' last S of an item is done
  const int tid = threadIdx.x, wg = tid / 128;

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k + 8 * s, 128);
      mbar_init(full_v + 8 * s, 128);
      mbar_init(empty_k + 8 * s, 256);
      mbar_init(empty_v + 8 * s, 256);
    }
    mbar_init(q_empty, 256);
  }
  __syncthreads();

  // Tiles run through the stages in one sequence over the CTA's items: tile t of an item is the
  // CTA's tile it0 + t, in stage (it0 + t) % kStages.
  if (wg == 0) {
    set_max_regs_dec<kProducerRegs>();
    const int cc = tid % 16, cr = tid / 16;
    const uint32_t swz = swizzled_offset(cr, cc % 8);
    int it0 = 0;
    for (int round = 0, w; (w = item_of(round, items)) >= 0; ++round) {
      const int4 tile = p.tiles[w / p.heads];
      const int h = w % p.heads, kvh = h / p.group;
      const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
      const int keys = vis0 + rows - 1, ntiles = (keys + kKeys - 1) / kKeys;
      int slot[kPieces];  // of the rows this thread copies next; -1 past the keys (copied as zeros)
      auto fetch_slots = [&](int k0) {
#pragma unroll
        for (int n = 0; n < kPieces; ++n) {
          const int j = k0 + cr + n * kRowsPass;
          slot[n] = j < keys ? p.slots[kv0 + j] : -1;
        }
      };
      fetch_slots(0);  // in flight with Q's copies
      if (round > 0) mbar_wait(q_empty, (round - 1) & 1);  // the previous item's S products are done
      {
        const bf16* src = p.q + h * p.q_s1 + cc * 8;
        uint8_t* dst = smem + (cc / 8) * kQHalf + swz;
#pragma unroll 4
        for (int n = 0; n < 128 / kRowsPass; ++n) {
          const int r = cr + n * kRowsPass;
          cp_async16(dst + n * kRowsPass * kRowBytes, src + (r < rows ? int64_t(q0 + r) * p.q_s0 : 0), r < rows);
        }
      }
      // One operand (K or V: base, strides) of the CTA's tile `it` into its stage; the arrival
      // also covers every earlier copy of this thread (Q before an item's first K).
      auto issue = [&](const bf16* base, int64_t s0, int64_t s1, uint32_t empty, uint32_t full, int it, int offset) {
        const int stage = it % kStages;
        if (it >= kStages) mbar_wait(empty + 8 * stage, (it / kStages + 1) & 1);  // tile it - kStages released
        uint8_t* dst = smem + kQBytes + stage * kStageBytes + offset + (cc / 8) * kHalfBytes + swz;
        const bf16* src = base + kvh * s1 + cc * 8;
#pragma unroll
        for (int n = 0; n < kPieces; ++n) {
          const int64_t s = slot[n] >= 0 ? slot[n] : 0;
          cp_async16(dst + n * kRowsPass * kRowBytes, src + s * s0, slot[n] >= 0);
        }
        mbar_arrive_copies(full + 8 * stage);
      };
      for (int t = 0; t < ntiles; ++t) {
        issue(p.k, p.k_s0, p.k_s1, empty_k, full_k, it0 + t, 0);
        issue(p.v, p.v_s0, p.v_s1, empty_v, full_v, it0 + t, kTileBytes);
        if (t + 1 < ntiles) fetch_slots((t + 1) * kKeys);  // their latency passes in the next empty waits
      }
      it0 += ntiles;
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy in flight behind the producer
    return;
  }

  set_max_regs_inc<kConsumerRegs>();
  const int cw = wg - 1;  // this consumer's 64 rows: cw * 64..
  // warp: of the block's 128 rows (consumer 0 has warps 0-3), as in the single-role kernel.
  const int warp = tid / 32 - 4, lane = tid % 32, g = lane / 4, qd = lane % 4;
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};  // this lane's two rows of the tile
  const uint64_t q_desc = smem_desc(smem_addr + cw * 64 * kRowBytes);
  const uint32_t kv_addr = smem_addr + kQBytes;
  float o[kD / 8][4];
  float(&o_acc)[kD / 2] = reinterpret_cast<float(&)[kD / 2]>(o);
  uint32_t pa[kKeys / 16][4];
  float s[kKeys / 8][4];  // each tile's first wgmma overwrites it
  float(&s_acc)[kKeys / 2] = reinterpret_cast<float(&)[kKeys / 2]>(s);

  // cp.async writes are generic-proxy, wgmma reads async-proxy: fence after each full wait.
  auto wait_full = [&](uint32_t full, int it) {
    mbar_wait(full + 8 * (it % kStages), (it / kStages) & 1);
    fence_proxy_async();
  };
  auto scores = [&](int it) {
    const uint32_t k_addr = kv_addr + (it % kStages) * kStageBytes;
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t q_off = (kk / 4) * kQHalf + (kk % 4) * 32, k_off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
      wgmma_bf16_n128(s_acc, q_desc + (q_off >> 4), smem_desc(k_addr + k_off), kk > 0);
    }
    wgmma_commit();
  };
  auto pv = [&](int it) {
    const uint32_t v_addr = kv_addr + (it % kStages) * kStageBytes + kTileBytes;
    // Keys [16 kk, +16) of V start 16 rows (2048 bytes) on; dims 64.. are the next column block.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_bf16_rs_nmajor128(o_acc, pa[kk], smem_desc_nmajor(v_addr + kk * 16 * kRowBytes, kHalfBytes));
    wgmma_commit();
  };
  // Normal code wrote o and P: order them before the wgmmas that read them.
  auto fence_o_p = [&] {
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
  };
  int it0 = 0;
  for (int round = 0, w; (w = item_of(round, items)) >= 0; ++round) {
    const int4 tile = p.tiles[w / p.heads];
    const int h = w % p.heads;
    const int q0 = tile.x, rows = tile.y, vis0 = tile.w;
    const int ntiles = (vis0 + rows - 1 + kKeys - 1) / kKeys;
    // Rows past the tile mask like its last; keys below warp_full are seen by every row of the
    // warp: tiles that end there need no mask.
    const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};
    const int warp_full = vis0 + min(warp * 16, rows - 1);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o_acc[i] = 0.f;
    auto softmax = [&](int t) {
      const int k0 = t * kKeys;
      if constexpr (TUNED) softmax_probs_mixed<kKeys>(s, k0 + kKeys > warp_full, k0, seen, p.scale_log2, lane, m, l, alpha);
      else flash_softmax_probs<kKeys>(s, k0 + kKeys > warp_full, k0, seen, p.scale_log2, lane, m, l, alpha);
    };
    // S of the item's last tile is done: the producer may load the next item's Q.
    auto last_scores_done = [&](int t) {
      if (t == ntiles - 1) mbar_arrive(q_empty);
    };
    wait_full(full_k, it0);
    fence_operands(o_acc);
    wgmma_fence();
    scores(it0);
    wgmma_wait<0>();
    fence_operands(s_acc);
    mbar_arrive(empty_k + 8 * (it0 % kStages));  // S of tile 0 has read its K
    last_scores_done(0);
    softmax(0);  // o is zero: its rescale by alpha (0) is moot
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
    // Iteration t enters with P of tile t in pa; n128kv has o rescaled for it, n128kvx rescales o
    // by alpha (of tile t) while S of tile t + 1 runs.
    for (int t = 0; t < ntiles - 1; ++t) {
      const int it = it0 + t;
      wait_full(full_k, it + 1);
      fence_o_p();
      wgmma_fence();
      scores(it + 1);
      if constexpr (TUNED) flash_rescale<kD>(o, alpha);  // P V of tile t - 1 is done, of tile t not issued
      wait_full(full_v, it);
      fence_operands(o_acc);
      wgmma_fence();  // after the wait's loop, which ptxas would otherwise fence itself (C7519)
      pv(it);
      wgmma_wait<1>();  // S of tile t + 1 (committed first)
      fence_operands(s_acc);
      mbar_arrive(empty_k + 8 * ((it + 1) % kStages));
      last_scores_done(t + 1);
      softmax(t + 1);
      wgmma_wait<0>();  // P V of tile t
      fence_o_p();
      mbar_arrive(empty_v + 8 * (it % kStages));
      if constexpr (!TUNED) flash_rescale<kD>(o, alpha);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
    }
    const int last = it0 + ntiles - 1;
    if constexpr (TUNED) flash_rescale<kD>(o, alpha);
    wait_full(full_v, last);
    fence_o_p();
    wgmma_fence();
    pv(last);
    wgmma_wait<0>();
    fence_operands(o_acc);
    mbar_arrive(empty_v + 8 * (last % kStages));  // a persistent CTA's next item refills it
    flash_store_rows<kD>(o, l, row, rows,
                          [&](int r) { return p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd; });
    it0 += ntiles;
  }
}

template <bool TUNED>
void launch(const FlashParams& p, unsigned blocks, bool persistent) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(flash_prefill_wgmma_kv_kernel<TUNED>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
  });
  // One CTA a multiprocessor fits (shared memory, registers).
  const unsigned grid = persistent ? std::min(blocks, unsigned(sm_count())) : blocks;
  flash_prefill_wgmma_kv_kernel<TUNED><<<grid, kThreads, kSmemBytes, stream()>>>(p, int(blocks));
  MS_CUDA_LAUNCHED("flash_prefill_wgmma_kv_kernel");
}

}  // namespace

void flash_prefill_wgmma_kv(const FlashParams& p, unsigned blocks) { launch<false>(p, blocks, false); }
void flash_prefill_wgmma_kvx(const FlashParams& p, unsigned blocks) { launch<true>(p, blocks, false); }
void flash_prefill_wgmma_kvp(const FlashParams& p, unsigned blocks) { launch<false>(p, blocks, true); }
void flash_prefill_wgmma_kvxp(const FlashParams& p, unsigned blocks) { launch<true>(p, blocks, true); }

}  // namespace ms::cuda
