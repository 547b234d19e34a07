// The Hopper kernel of MLA prefill in the expanded form (mla_expanded_wgmma, flash_prefill.h):
// flash_mla_expanded.cu's contract (MlaExpandedParams: the same tiles, longest-first order,
// causal rule and outputs) on flash_prefill_wgmma.cu's pipeline, whose header gives the
// reasoning (wgmma fragment layouts, fences, why every warpgroup runs every tile); only the
// operands' shapes differ. mma.sync tops out near 210 TFLOP/s on these 192/128-dim heads.
//
// A block has one or two warpgroups, each owning 64 query rows of one tile and one head. Shared
// memory, 128-byte swizzled 64-dim column blocks throughout (wgmma.cuh), 1024-aligned:
//   Q      [rows][192] as three column blocks, copied once.
//   stage  K: 64 keys x 192 dims, three column blocks (24 KB): K_nope dims 0..63 and 64..127
//          from the head's kv row, k_rope from the key's shared rope row; V: 64 keys x 128 dims,
//          two column blocks (16 KB), from the head's kv row after K_nope. STAGES stages.
// Per 64-key tile and warpgroup: S = Q K^T in twelve m64n64k16 (the 192-dim reduction, K
// K-major), the shared online softmax (flash_softmax.cuh), O += P V in four m64n128k16 with P
// from registers and V N-major; S of tile t + 1 is issued before P V of tile t.
//
// The 128-row blocks take flash_mla_expanded_wgmma_ws.cu's warp-specialized kernel by default
// ("ws": a producer warpgroup, 128-key tiles; "ws64" on 64-key tiles);
// MOESERVE_MLA_EXPANDED_VARIANT=wg keeps this one for them too. 64-row blocks always run here.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/kernel_variants.h"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda {
namespace {

using namespace wg;

constexpr int kNope = 128, kDv = 128, kKeys = 64;
constexpr int kBlockBytes = kKeys * kRowBytes;      // 64 keys x 64 dims: one column block, 8 KB
constexpr int kKBlocks = 3, kVBlocks = kDv / 64;    // K_nope, K_nope, k_rope; V, V
constexpr int kRopeBlock = kNope / 64;              // the K column block that comes from rope
constexpr int kStageBytes = (kKBlocks + kVBlocks) * kBlockBytes;  // 40 KB

template <int WG, int STAGES>
struct WgMla {
  static constexpr int kStages = STAGES, kThreads = 128 * WG, kRows = 64 * WG;
  static constexpr int kQBlock = kRows * kRowBytes, kQBytes = kKBlocks * kQBlock;
  static constexpr size_t kSmemBytes = kQBytes + size_t(STAGES) * kStageBytes + kAtomBytes;  // + alignment slack
  static constexpr int kAhead = STAGES - 2;  // tiles of copies in flight
  // Copies: the column blocks of Q (or of a stage) are 128-byte rows end to end; thread i moves
  // 16-byte chunk i % 8 of rows i / 8 + kUnitsPass n. A pass stays inside one column block.
  static constexpr int kUnitsPass = kThreads / 8;
  static constexpr int kPieces = (kKBlocks + kVBlocks) * kKeys / kUnitsPass, kQPieces = kKBlocks * kRows / kUnitsPass;
  static_assert(kAhead >= 1, "at least one tile of copies ahead");
  static_assert(kUnitsPass % 8 == 0, "a thread's rows share one swizzle phase");
  static_assert(kKeys % kUnitsPass == 0 && kRows % kUnitsPass == 0, "a pass inside one column block");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of a block");
};
// 209 KB, one block an SM (8 warps); two tiles of copies ahead.
using Mla128 = WgMla<2, 4>;
// 145 KB, one block an SM (two would need two stages, no copies ahead); one tile ahead. Taken
// only where sequences are short, so the work is small.
using Mla64 = WgMla<1, 3>;

template <class T>
__global__ void __launch_bounds__(T::kThreads, 1) mla_expanded_wgmma_kernel(const MlaExpandedParams p) {
  constexpr int kStages = T::kStages, kAhead = T::kAhead, kUnitsPass = T::kUnitsPass;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // [Q: 3 column blocks of kRows rows][stage: K column blocks 0..2, V column blocks 0, 1], 1024-aligned.
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes;
  uint8_t* const smem = smem_raw + (kAtomBytes - misalign) % kAtomBytes;
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const int4 tile = p.tiles[blockIdx.x / p.heads];
  const int h = blockIdx.x % p.heads;
  const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
  const int keys = vis0 + rows - 1, ntiles = (keys + kKeys - 1) / kKeys;
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32, lane = tid % 32, g = lane / 4, qd = lane % 4;
  const bf16* const kv_head = p.kv + int64_t(h) * (kNope + kDv);

  // This thread's copies: dims 8 cc.. of a column block's row cu + kUnitsPass n (one swizzle phase).
  const int cc = tid % 8, cu = tid / 8;
  const uint32_t swz = swizzled_offset(cu, cc);
  {
    uint8_t* dst = smem + swz;
#pragma unroll
    for (int n = 0; n < T::kQPieces; ++n) {
      const int b = n * kUnitsPass / T::kRows, r = n * kUnitsPass % T::kRows + cu;
      const bf16* src = p.q + (r < rows ? int64_t(q0 + r) * p.q_s0 : 0) + h * p.q_s1 + b * 64 + cc * 8;
      cp_async16(dst + n * kUnitsPass * kRowBytes, src, r < rows);
    }
  }
  // Keys past the tile's last are zeros: a zero probability times a stale NaN is NaN.
  auto issue = [&](int stage, int k0) {
    uint8_t* dst = smem + T::kQBytes + stage * kStageBytes + swz;
#pragma unroll
    for (int n = 0; n < T::kPieces; ++n) {
      const int b = n * kUnitsPass / kKeys, r = n * kUnitsPass % kKeys + cu;
      const bool ok = k0 + r < keys;
      const int64_t key = kv0 + (ok ? k0 + r : 0);
      // Column blocks 0, 1 and 3, 4 are the kv row's dims 0..127 (K_nope) and 128..255 (V).
      const bf16* src = b == kRopeBlock ? p.rope + key * p.rope_s0
                                        : kv_head + key * p.kv_s0 + (b < kRopeBlock ? b : b - 1) * 64;
      cp_async16(dst + n * kUnitsPass * kRowBytes, src + cc * 8, ok);
    }
  };
#pragma unroll
  for (int t = 0; t < kAhead; ++t) {  // group 0 also holds Q
    if (t < ntiles) issue(t, t * kKeys);
    cp_async_commit();
  }

  // This lane's two rows (g and g + 8 of the warp's 16); rows past the tile mask like its last.
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};
  // Keys below warp_full are seen by every row of the warp: tiles that end there need no mask.
  const int warp_full = vis0 + min(warp * 16, rows - 1);
  float o[kDv / 8][4] = {};
  float(&o_acc)[kDv / 2] = reinterpret_cast<float(&)[kDv / 2]>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[kKeys / 16][4] = {};
  // Q of this warpgroup's 64 rows (8 atoms in); a 16 of dims is 32 bytes on, the next 64 a column block on.
  const uint64_t q_desc = smem_desc(smem_addr + wg * 64 * kRowBytes);
  const uint32_t kv_addr = smem_addr + T::kQBytes;

  // Tile t's copies have landed and are visible to wgmma, and every warpgroup has waited for
  // P V of tile t - 2, whose stage takes the copies of tile t + kAhead (issued here).
  auto tile_ready = [&](int t) {
    cp_async_wait<kAhead - 1>();
    fence_proxy_async();
    __syncthreads();
    const int next = t + kAhead;
    if (next < ntiles) issue(next % kStages, next * kKeys);
    cp_async_commit();
  };
  float s[kKeys / 8][4];  // each tile's first wgmma overwrites it
  float(&s_acc)[kKeys / 2] = reinterpret_cast<float(&)[kKeys / 2]>(s);
  auto scores = [&](int t) {
    const uint32_t k_addr = kv_addr + (t % kStages) * kStageBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKBlocks * 4; ++kk) {
      const uint32_t q_off = (kk / 4) * T::kQBlock + (kk % 4) * 32, k_off = (kk / 4) * kBlockBytes + (kk % 4) * 32;
      wgmma_bf16_n64(s_acc, q_desc + (q_off >> 4), smem_desc(k_addr + k_off), kk > 0);
    }
    wgmma_commit();
  };
  float alpha[2];
  tile_ready(0);
  scores(0);
  wgmma_wait<0>();
  fence_operands(s_acc);
  flash_softmax_probs<kKeys>(s, kKeys > warp_full, 0, seen, p.scale_log2, lane, m, l, alpha);
#pragma unroll
  for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
  // As flash_prefill_wgmma.cu: iteration t enters with P of tile t in pa and o rescaled for it,
  // issues S of tile t + 1 (over a stale stage past the last tile, discarded), then P V of tile
  // t, and runs the softmax of tile t + 1 while P V does. Nothing stays in flight across
  // iterations.
  for (int t = 0; t < ntiles; ++t) {
    tile_ready(t + 1);
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    scores(t + 1);
    const uint32_t v_addr = kv_addr + (t % kStages) * kStageBytes + kKBlocks * kBlockBytes;
    // Keys [16 kk, +16) of V start 16 rows (2048 bytes) on; dims 64.. are the next column block.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_bf16_rs_nmajor128(o_acc, pa[kk], smem_desc_nmajor(v_addr + kk * 16 * kRowBytes, kBlockBytes));
    wgmma_commit();
    wgmma_wait<1>();  // S of tile t + 1 (committed first)
    fence_operands(s_acc);
    const int k1 = (t + 1) * kKeys;
    if (t + 1 < ntiles)
      flash_softmax_probs<kKeys>(s, k1 + kKeys > warp_full, k1, seen, p.scale_log2, lane, m, l, alpha);
    wgmma_wait<0>();  // P V of tile t
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    if (t + 1 < ntiles) {
      flash_rescale<kDv>(o, alpha);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind
  flash_store_rows<kDv>(o, l, row, rows,
                        [&](int r) { return p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd; });
}

template <class T>
void launch(const MlaExpandedParams& p, unsigned blocks) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(mla_expanded_wgmma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  mla_expanded_wgmma_kernel<T><<<blocks, T::kThreads, T::kSmemBytes, stream()>>>(p);
  MS_CUDA_LAUNCHED("mla_expanded_wgmma_kernel");
}

// The kernels of 128-row blocks a run can pick (flash_prefill.h); the first is the default.
using Variant = KernelVariant<void (*)(const MlaExpandedParams&, unsigned)>;
constexpr Variant kVariants[] = {
    {"ws", mla_expanded_wgmma_ws128}, {"ws64", mla_expanded_wgmma_ws64}, {"wg", launch<Mla128>}};

}  // namespace

std::vector<std::string> mla_expanded_wgmma_variants() { return variant_names(kVariants); }

void mla_expanded_wgmma(const MlaExpandedParams& p, unsigned blocks, int block_rows, std::string_view variant) {
  MS_CHECK(hopper(), "mla_prefill_expanded: the wgmma kernel needs a Hopper GPU");
  MS_CHECK(block_rows == 64 || block_rows == 128, "mla_prefill_expanded: blocks of ", block_rows, " rows");
  // A bad name fails on every shape.
  const Variant& tall = variant_named(kVariants, variant, "MOESERVE_MLA_EXPANDED_VARIANT", "mla_prefill_expanded (wgmma)");
  if (block_rows == 128) tall.launch(p, blocks);
  else launch<Mla64>(p, blocks);
}

}  // namespace ms::cuda
