// The warp-specialized kernels for flash_mla_expanded_wgmma.cu's 128-row blocks ("ws", the
// default on a Hopper, and "ws64"): the contract of MlaExpandedParams (tiles, longest-first
// order, causal rule, outputs) on flash_prefill_wgmma_ws.cu's design, whose header gives the
// why: warpgroup 0 only copies, warpgroups 1 and 2 own 64 query rows each and only compute,
// setmaxnreg gives the producer 56 registers and the consumers 224, S of tile t + 1 is issued
// before P V of tile t. What differs is the operands: a key's row is 192 dims (K_nope from the
// head's kv row, then the key's shared k_rope row) and its value 128 (the head's kv row after
// K_nope), keys contiguous (no slots), so every copy is a tensor copy (cp.async.bulk.tensor)
// issued by producer thread 0 alone — Q as three boxes of a 3-d map over [T, H, 192], a K stage
// as two boxes of the kv map and one of the rope map, a V stage as two of the kv map — each
// stage's full barrier completed by its bytes (one arrival with expect_tx), Q on a barrier of
// its own; the other 127 producer threads exit. The copy engine writes whole boxes: rows past a
// tile's keys are the next keys' (or zeros past K), which the softmax masks to zero probability
// and are finite, so no row needs zero-filling.
// Measured on the H200 (BENCHMARKS, session 38): at V2-Lite's 16 heads and 8192 tokens 709
// TFLOP/s, where the same kernel with all 128 producer threads issuing cp.async (40 a tile a
// thread, and their address math) made 614: Nsight (session 37) had that producer issuing a third
// of the block's instructions on the schedulers the consumers need. FA3's ping-pong of the
// consumers on named barriers gained nothing (session 37) and lost 4-10 % at V3's 128 heads.
//
// Shared memory, all 128-byte swizzled 64-dim column blocks (wgmma.cuh), 1024-aligned:
//   Q   128 rows x 192 dims, three column blocks: 48 KB, copied once by the producer.
//   K   KEYS keys x 192 dims (column blocks K_nope 0..63, 64..127, k_rope): 48 KB at 128 keys.
//   V   KEYS keys x 128 dims (two column blocks): 32 KB at 128 keys.
// A joint K + V stage is 80 KB at 128 keys: Q + two stages is 208 KB, three do not fit 227 KB.
// Two joint stages give the producer nothing to do ahead: the consumers hold tile t (P V) and
// tile t + 1 (S) at once, so a stage comes free only just before it is needed. K and V are
// therefore separate buffers with their own barriers, STAGES of each: K of tile t + 1 is
// released as soon as its S has completed (mid-iteration t), V of tile t when its P V has, and
// the producer copies in the order the consumers need them (K t + 1, then V t). With two of
// each at 128 keys, while iteration t runs S of tile t + 1 and P V of tile t the producer copies
// K of tile t + 2 and V of tile t + 1, which iteration t + 1 needs: a full iteration of slack.
// 64-key tiles ("ws64") fit four of each in the same 160 KB.
//
// Why 128 keys by default: each m64n128k16 of S reads Q's 2 KB once for 128 keys (n64 reads it
// twice, and shared-memory reads, not the tensor cores, then bound S), and the per-tile waits,
// fences and max / sum shuffles come half as often; flash_prefill_wgmma_ws.cu's 128-key tiles
// took the GQA kernel from 379 to 522 TFLOP/s. Consumer registers are those of that kernel: S
// 64 + O 64 (f32 accumulators) + P 32 (bf16 pairs) = 160 of 224; the 192-dim reduction adds
// wgmmas (12 of S for 8 of P V), not registers. At 64 keys S is 32 and P 16.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda {
namespace {

using namespace wg;

constexpr int kNope = 128, kRope = 64, kDv = 128, kRows = 128, kThreads = 384;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;
constexpr int kKBlocks = 3, kVBlocks = kDv / 64;  // K_nope, K_nope, k_rope; V, V
constexpr int kRopeBlock = kNope / 64;            // the K column block that comes from rope
constexpr int kQBlock = kRows * kRowBytes, kQBytes = kKBlocks * kQBlock;
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "the register file");

template <int KEYS, int STAGES>
struct MlaWs {
  static constexpr int kKeys = KEYS, kStages = STAGES;
  static constexpr int kBlock = KEYS * kRowBytes;  // KEYS keys x 64 dims: one column block
  static constexpr int kKBytes = kKBlocks * kBlock, kVBytes = kVBlocks * kBlock;
  static constexpr int kVOffset = kQBytes + STAGES * kKBytes;
  // full K[STAGES], full V[STAGES], empty K[STAGES], empty V[STAGES], Q's
  static constexpr int kBarrierOffset = kVOffset + STAGES * kVBytes;
  static constexpr size_t kSmemBytes = kBarrierOffset + (4 * STAGES + 1) * 8 + kAtomBytes;  // + alignment slack
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");
  static_assert(STAGES >= 2, "K of tile t + 1 and V of tile t are held at once");
};
using Ws128 = MlaWs<128, 2>;  // 48 + 2 x 80 KB = 208 KB (+ barriers, alignment slack)
using Ws64 = MlaWs<64, 4>;    // 48 + 4 x 40 KB = 208 KB

// The tensor copies' maps: q as [T][H][192], kv as [K][H * 256], rope as [K][64].
struct MlaMaps {
  CUtensorMap q, kv, rope;
};

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    mla_expanded_ws_kernel(const MlaExpandedParams p, const __grid_constant__ MlaMaps maps) {
  constexpr int kKeys = T::kKeys, kStages = T::kStages, kBlock = T::kBlock;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes;
  uint8_t* const smem = smem_raw + (kAtomBytes - misalign) % kAtomBytes;
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t full_k = smem_addr + T::kBarrierOffset, full_v = full_k + 8 * kStages;
  const uint32_t empty_k = full_v + 8 * kStages, empty_v = empty_k + 8 * kStages, full_q = empty_v + 8 * kStages;
  const int4 tile = p.tiles[blockIdx.x / p.heads];
  const int h = blockIdx.x % p.heads;
  const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
  const int keys = vis0 + rows - 1, ntiles = (keys + kKeys - 1) / kKeys;
  const int tid = threadIdx.x, wg = tid / 128;

  if (tid == 0) {
    // A full barrier completes on thread 0's expect_tx and the bytes of its tensor copies.
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full_k + 8 * s, 1);
      mbar_init(full_v + 8 * s, 1);
      mbar_init(empty_k + 8 * s, 256);
      mbar_init(empty_v + 8 * s, 256);
    }
    mbar_init(full_q, 1);
  }
  __syncthreads();

  if (wg == 0) {
    set_max_regs_dec<kProducerRegs>();
    if (tid != 0) return;
    expect_bytes(full_q, kQBytes);
#pragma unroll
    for (int b = 0; b < kKBlocks; ++b) tma_load_3d(smem_addr + b * kQBlock, &maps.q, b * 64, h, q0, full_q);
    const int head_x = h * (kNope + kDv);  // the head's first column of a kv row
    auto load_k = [&](int t) {
      const int stage = t % kStages, y = kv0 + t * kKeys;
      if (t >= kStages) mbar_wait(empty_k + 8 * stage, (t / kStages + 1) & 1);  // K of t - kStages released
      const uint32_t dst = smem_addr + kQBytes + stage * T::kKBytes, bar = full_k + 8 * stage;
      expect_bytes(bar, T::kKBytes);
      tma_load_2d(dst, &maps.kv, head_x, y, bar);
      tma_load_2d(dst + kBlock, &maps.kv, head_x + 64, y, bar);
      tma_load_2d(dst + kRopeBlock * kBlock, &maps.rope, 0, y, bar);
    };
    auto load_v = [&](int t) {
      const int stage = t % kStages, y = kv0 + t * kKeys;
      if (t >= kStages) mbar_wait(empty_v + 8 * stage, (t / kStages + 1) & 1);  // V of t - kStages released
      const uint32_t dst = smem_addr + T::kVOffset + stage * T::kVBytes, bar = full_v + 8 * stage;
      expect_bytes(bar, T::kVBytes);
      tma_load_2d(dst, &maps.kv, head_x + kNope, y, bar);
      tma_load_2d(dst + kBlock, &maps.kv, head_x + kNope + 64, y, bar);
    };
    load_k(0);  // the consumers' order, as below
    for (int t = 0; t < ntiles; ++t) {
      if (t + 1 < ntiles) load_k(t + 1);
      load_v(t);
    }
    return;
  }
  set_max_regs_inc<kConsumerRegs>();
  const int cw = wg - 1;  // this consumer's 64 rows: cw * 64..
  // warp: of the block's 128 rows (consumer 0 has warps 0-3).
  const int warp = tid / 32 - 4, lane = tid % 32, g = lane / 4, qd = lane % 4;

  // This lane's two rows (g and g + 8 of the warp's 16); rows past the tile mask like its last.
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};
  // Keys below warp_full are seen by every row of the warp: tiles that end there need no mask.
  const int warp_full = vis0 + min(warp * 16, rows - 1);
  float o[kDv / 8][4] = {};
  float(&o_acc)[kDv / 2] = reinterpret_cast<float(&)[kDv / 2]>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[kKeys / 16][4];
  // Q of this consumer's 64 rows (8 atoms in); a 16 of dims is 32 bytes on, the next 64 a column block on.
  const uint64_t q_desc = smem_desc(smem_addr + cw * 64 * kRowBytes);

  auto wait_full = [&](uint32_t bar, int t) { mbar_wait(bar + 8 * (t % kStages), (t / kStages) & 1); };
  float s[kKeys / 8][4];  // each tile's first wgmma overwrites it
  float(&s_acc)[kKeys / 2] = reinterpret_cast<float(&)[kKeys / 2]>(s);
  auto scores = [&](int t) {
    // Offsets are added to the stage's descriptor (its 14-bit address field cannot carry: shared
    // addresses stay below 2^18 bytes), not made into descriptors one by one: ~5 uniform
    // instructions a wgmma fewer in the consumers' issue slots.
    const uint64_t k_desc = smem_desc(smem_addr + kQBytes + (t % kStages) * T::kKBytes);
#pragma unroll
    for (int kk = 0; kk < kKBlocks * 4; ++kk) {
      const uint32_t q_off = (kk / 4) * kQBlock + (kk % 4) * 32, k_off = (kk / 4) * kBlock + (kk % 4) * 32;
      if constexpr (kKeys == 128) wgmma_bf16_n128(s_acc, q_desc + (q_off >> 4), k_desc + (k_off >> 4), kk > 0);
      else wgmma_bf16_n64(s_acc, q_desc + (q_off >> 4), k_desc + (k_off >> 4), kk > 0);
    }
    wgmma_commit();
  };
  auto pv = [&](int t) {
    const uint64_t v_desc = smem_desc_nmajor(smem_addr + T::kVOffset + (t % kStages) * T::kVBytes, kBlock);
    // Keys [16 kk, +16) of V start 16 rows (2048 bytes) on; dims 64.. are the next column block.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_bf16_rs_nmajor128(o_acc, pa[kk], v_desc + ((kk * 16 * kRowBytes) >> 4));
    wgmma_commit();
  };
  float alpha[2];
  mbar_wait(full_q, 0);
  wait_full(full_k, 0);
  wgmma_fence();
  scores(0);
  wgmma_wait<0>();
  fence_operands(s_acc);
  mbar_arrive(empty_k);
  flash_softmax_probs<kKeys>(s, kKeys > warp_full, 0, seen, p.scale_log2, lane, m, l, alpha);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
  // Iteration t enters with P of tile t in pa and o rescaled for it once finish(t - 1) has run;
  // the last P V follows the loop (a stale product past the last tile would wait for a stage
  // nobody fills). finish(t) waits for P V of tile t, releases its V, rescales o and packs P of
  // tile t + 1. It runs at the top of the next iteration, not after the softmax it follows: in one
  // basic block with the softmax, ptxas hoisted the wait above it (Nsight's SASS, session 37), so
  // the exponentials ran after P V had finished, not beside it. The back edge keeps them apart.
  auto finish = [&](int t) {
    wgmma_wait<0>();
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    mbar_arrive(empty_v + 8 * (t % kStages));
    // Once a row's max has settled its factor is exactly 1: a warp whose rows all kept theirs skips the 64 products.
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) flash_rescale<kDv>(o, alpha);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
  };
  for (int t = 0; t < ntiles - 1; ++t) {
    if (t > 0) finish(t - 1);
    wait_full(full_k, t + 1);
    wait_full(full_v, t);
    // P and o are written before the wgmma.fence, which orders them before P V reads them.
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    wgmma_fence();
    scores(t + 1);
    pv(t);
    wgmma_wait<1>();  // S of tile t + 1 (committed first): its K is free
    fence_operands(s_acc);
    mbar_arrive(empty_k + 8 * ((t + 1) % kStages));
    const int k1 = (t + 1) * kKeys;
    flash_softmax_probs<kKeys>(s, k1 + kKeys > warp_full, k1, seen, p.scale_log2, lane, m, l, alpha);
  }
  if (ntiles > 1) finish(ntiles - 2);
  wait_full(full_v, ntiles - 1);
  fence_operands(o_acc);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
  wgmma_fence();
  pv(ntiles - 1);
  wgmma_wait<0>();
  fence_operands(o_acc);
  flash_store_rows<kDv>(o, l, row, rows,
                        [&](int r) { return p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd; });
}

// The maps of p's q, kv and rope for boxes of `keys` key rows (and 128 query rows).
MlaMaps maps_of(const MlaExpandedParams& p, int keys) {
  MlaMaps m;
  const uint64_t q_dims[3] = {uint64_t(kNope + kRope), uint64_t(p.heads), uint64_t(p.q_rows)};
  const uint64_t q_strides[2] = {uint64_t(p.q_s1) * 2, uint64_t(p.q_s0) * 2};
  const uint32_t q_box[3] = {64, 1, uint32_t(kRows)};
  m.q = tiled_bf16_map(p.q, 3, q_dims, q_strides, q_box, "mla_prefill_expanded (q)");
  const uint64_t kv_dims[2] = {uint64_t(p.heads) * (kNope + kDv), uint64_t(p.kv_rows)};
  const uint64_t kv_strides[1] = {uint64_t(p.kv_s0) * 2};
  const uint32_t box[2] = {64, uint32_t(keys)};
  m.kv = tiled_bf16_map(p.kv, 2, kv_dims, kv_strides, box, "mla_prefill_expanded (kv)");
  const uint64_t rope_dims[2] = {uint64_t(kRope), uint64_t(p.kv_rows)}, rope_strides[1] = {uint64_t(p.rope_s0) * 2};
  m.rope = tiled_bf16_map(p.rope, 2, rope_dims, rope_strides, box, "mla_prefill_expanded (rope)");
  return m;
}

template <class T>
void launch(const MlaExpandedParams& p, unsigned blocks) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(mla_expanded_ws_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  const MlaMaps maps = maps_of(p, T::kKeys);
  mla_expanded_ws_kernel<T><<<blocks, kThreads, T::kSmemBytes, stream()>>>(p, maps);
  MS_CUDA_LAUNCHED("mla_expanded_ws_kernel");
}

}  // namespace

void mla_expanded_wgmma_ws128(const MlaExpandedParams& p, unsigned blocks) { launch<Ws128>(p, blocks); }
void mla_expanded_wgmma_ws64(const MlaExpandedParams& p, unsigned blocks) { launch<Ws64>(p, blocks); }

}  // namespace ms::cuda
