// The Hopper prefill attention (flash_prefill.h), flash-attention 3 style without TMA: the same
// contract, tiles, slot gather, causal rule and longest-first order as flash_prefill.cu, but both
// products on warpgroup MMAs (wgmma.mma_async, wgmma.cuh) instead of mma.sync. A block has one
// or two warpgroups of 128 threads, each owning 64 query rows of one sequence tile and one query
// head; keys and values come 64 at a time, gathered by slot with cp.async, into 128-byte-swizzled
// shared tiles, STAGES buffers deep.
//
// Why: mma.sync feeds the tensor cores through registers (ldmatrix, one instruction a 16x8x16
// product) and tops out near 260 TFLOP/s here; wgmma reads its shared operands itself, 64 rows
// at a time, which is the only way towards the H200's matrix rate.
//
// Per 64-key tile and warpgroup:
//   S = Q K^T   eight m64n64k16, A = Q (shared, copied once per block), B = K [key][dim]: dim is
//               the reduction axis, so K is K-major like the GEMM's weights (two 64-dim column
//               blocks of 128-byte rows, 8 KB each).
//   softmax     flash_softmax_probs on the S accumulators, which have mma.sync's C layout (row
//               g and g + 8 of the warp's 16, columns 8 i + 2 qd, + 1), so the quad reduction,
//               the diagonal-only causal mask and the exp2 with the scale folded in are shared.
//   O += P V    four m64n128k16 with A = P from registers and B = V. Register A of wgmma is, per
//               warp, the m16n8k16 A fragment of its 16 rows ({row g, cols 2qd..+1}, {row g + 8,
//               same}, {row g, cols 8 + 2qd..+1}, {row g + 8, same}); the accumulator of key
//               groups 2 kk and 2 kk + 1 holds exactly those values, so P of keys [16 kk, +16) is
//               pack_bf16 of those pairs (flash_p_fragment). V stays [key][dim] as gathered: the
//               reduction runs over keys, i.e. B is N-major, read with wgmma's transpose bit and
//               an N-major descriptor (smem_desc_nmajor) over the same swizzled rows, no
//               transpose in shared memory.
// Overlap: S of tile t + 1 is issued before P V of tile t, so the softmax of tile t + 1 runs on
// the CUDA cores while P V runs on the tensor cores; the two warpgroups of a block (and the two
// blocks of 64 rows on a multiprocessor) fill each other's gaps.
// Ordering: wait for a tile's copies, fence.proxy.async (cp.async writes are generic-proxy,
// wgmma reads async-proxy), __syncthreads; wgmma.fence before the wgmmas that read registers
// normal code wrote (the rescaled O, P); commit, and wait before reading S or touching O. The
// buffer refilled at tile t is the one of tile t - 2, whose P V every warpgroup has waited for
// (STAGES - 2 tiles of copies ahead).
//
// Every warpgroup runs every tile, also the last diagonal one that may lie wholly past its rows
// (all masked: p = 0): a warpgroup-uniform branch around wgmmas makes ptxas serialize them.
//
// The 128-row blocks take flash_prefill_wgmma_ws.cu's warp-specialized kernel by default ("n128ws":
// a producer warpgroup, 128-key tiles, 1.38x this kernel at 8k tokens on the H200);
// MOESERVE_FLASH_WGMMA_VARIANT=n64 keeps this one for them too. 64-row blocks always run here.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/kernel_variants.h"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda {
namespace {

using namespace wg;

constexpr int kD = 128, kKeys = 64;
constexpr int kHalfBytes = kKeys * kRowBytes;  // 64 keys x 64 dims: one swizzled column block
constexpr int kTileBytes = 2 * kHalfBytes;     // 64 keys x 128 dims of K (or V)

template <int WG, int STAGES, int MIN_BLOCKS>
struct WgFlash {
  static constexpr int kStages = STAGES, kMinBlocks = MIN_BLOCKS;
  static constexpr int kThreads = 128 * WG, kRows = 64 * WG;
  static constexpr int kQHalf = kRows * kRowBytes, kQBytes = 2 * kQHalf;  // Q: two column blocks
  static constexpr int kStageBytes = 2 * kTileBytes;                      // K, then V
  static constexpr size_t kSmemBytes = kQBytes + size_t(STAGES) * kStageBytes + kAtomBytes;  // + alignment slack
  static constexpr int kAhead = STAGES - 2;  // tiles of copies in flight
  // Copies: thread i moves 16-byte chunk i % 16 of rows i / 16 + kRowsPass n.
  static constexpr int kRowsPass = kThreads / 16, kPieces = kKeys / kRowsPass, kQPieces = kRows / kRowsPass;
  static_assert(kAhead >= 1, "at least one tile of copies ahead");
  static_assert(kRowsPass % 8 == 0, "a thread's rows share one swizzle phase");
  static_assert(kSmemBytes * MIN_BLOCKS <= 227 * 1024, "shared memory of the blocks an SM");
};
// 161 KB, one block an SM (8 warps); two tiles of copies ahead.
using Wg128 = WgFlash<2, 4, 1>;
// 113 KB, two blocks an SM; one tile ahead.
using Wg64 = WgFlash<1, 3, 2>;

template <class T>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) flash_prefill_wgmma_kernel(const FlashParams p) {
  constexpr int kStages = T::kStages, kAhead = T::kAhead, kRowsPass = T::kRowsPass;
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // [Q: 2 column blocks of kRows rows][stage: K column blocks 0, 1; V column blocks 0, 1], 1024-aligned.
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes;
  uint8_t* const smem = smem_raw + (kAtomBytes - misalign) % kAtomBytes;
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const int4 tile = p.tiles[blockIdx.x / p.heads];
  const int h = blockIdx.x % p.heads, kvh = h / p.group;
  const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
  const int keys = vis0 + rows - 1, ntiles = (keys + kKeys - 1) / kKeys;
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32, lane = tid % 32, g = lane / 4, qd = lane % 4;

  // This thread's copies: dims 8 cc.. of rows cr + kRowsPass n (one swizzle phase), in column block cc / 8.
  const int cc = tid % 16, cr = tid / 16;
  const uint32_t swz = swizzled_offset(cr, cc % 8);
  {
    const bf16* src = p.q + h * p.q_s1 + cc * 8;
    uint8_t* dst = smem + (cc / 8) * T::kQHalf + swz;
#pragma unroll
    for (int n = 0; n < T::kQPieces; ++n) {
      const int r = cr + n * kRowsPass;
      cp_async16(dst + n * kRowsPass * kRowBytes, src + (r < rows ? int64_t(q0 + r) * p.q_s0 : 0), r < rows);
    }
  }
  int slot[T::kPieces];  // of the rows this thread copies next; -1 past the keys (copied as zeros)
  auto fetch_slots = [&](int k0) {
#pragma unroll
    for (int n = 0; n < T::kPieces; ++n) {
      const int j = k0 + cr + n * kRowsPass;
      slot[n] = j < keys ? p.slots[kv0 + j] : -1;
    }
  };
  auto issue = [&](int stage) {
    uint8_t* ks = smem + T::kQBytes + stage * T::kStageBytes + (cc / 8) * kHalfBytes + swz;
    uint8_t* vs = ks + kTileBytes;
#pragma unroll
    for (int n = 0; n < T::kPieces; ++n) {
      const int64_t s = slot[n] >= 0 ? slot[n] : 0;
      const int off = n * kRowsPass * kRowBytes;
      cp_async16(ks + off, p.k + s * p.k_s0 + kvh * p.k_s1 + cc * 8, slot[n] >= 0);
      cp_async16(vs + off, p.v + s * p.v_s0 + kvh * p.v_s1 + cc * 8, slot[n] >= 0);
    }
  };
  fetch_slots(0);
#pragma unroll
  for (int t = 0; t < kAhead; ++t) {  // group 0 also holds Q
    if (t < ntiles) {
      issue(t);
      if (t + 1 < ntiles) fetch_slots((t + 1) * kKeys);
    }
    cp_async_commit();
  }

  // This lane's two rows (g and g + 8 of the warp's 16); rows past the tile mask like its last.
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};
  // Keys below warp_full are seen by every row of the warp: tiles that end there need no mask.
  const int warp_full = vis0 + min(warp * 16, rows - 1);
  float o[kD / 8][4] = {};
  float(&o_acc)[kD / 2] = reinterpret_cast<float(&)[kD / 2]>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[kKeys / 16][4] = {};
  // Q of this warpgroup's 64 rows (8 atoms in); a 16 of dims is 32 bytes on, the second 64 a column block on.
  const uint64_t q_desc = smem_desc(smem_addr + wg * 64 * kRowBytes);
  const uint32_t kv_addr = smem_addr + T::kQBytes;

  // Tile t's copies have landed and are visible to wgmma, and every warpgroup has waited for
  // P V of tile t - 2, whose stage takes the copies of tile t + kAhead (issued here).
  auto tile_ready = [&](int t) {
    cp_async_wait<kAhead - 1>();
    fence_proxy_async();
    __syncthreads();
    const int next = t + kAhead;
    if (next < ntiles) {
      issue(next % kStages);
      if (next + 1 < ntiles) fetch_slots((next + 1) * kKeys);
    }
    cp_async_commit();
  };
  float s[kKeys / 8][4];  // each tile's first wgmma overwrites it
  float(&s_acc)[kKeys / 2] = reinterpret_cast<float(&)[kKeys / 2]>(s);
  auto scores = [&](int t) {
    const uint32_t k_addr = kv_addr + (t % kStages) * T::kStageBytes;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t q_off = (kk / 4) * T::kQHalf + (kk % 4) * 32, k_off = (kk / 4) * kHalfBytes + (kk % 4) * 32;
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
  // Iteration t enters with P of tile t in pa and o rescaled for it. S of tile t + 1 goes first,
  // then P V of tile t; the softmax of tile t + 1 runs while P V does, and only the rescale of
  // o and the new P wait for it. Nothing stays in flight from one iteration to the next (ptxas
  // serializes the wgmmas of a loop whose carried accumulators are moved while one is).
  for (int t = 0; t < ntiles; ++t) {
    // Past the last tile the S product runs over a stale stage and is discarded: a branch around
    // it would serialize the wgmmas too.
    tile_ready(t + 1);
    // P and o are written before scores' wgmma.fence, which orders them before P V reads them.
    fence_operands(o_acc);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    scores(t + 1);
    const uint32_t v_addr = kv_addr + (t % kStages) * T::kStageBytes + kTileBytes;
    // Keys [16 kk, +16) of V start 16 rows (2048 bytes) on; dims 64.. are the next column block.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma_bf16_rs_nmajor128(o_acc, pa[kk], smem_desc_nmajor(v_addr + kk * 16 * kRowBytes, kHalfBytes));
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
      flash_rescale<kD>(o, alpha);
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind
  flash_store_rows<kD>(o, l, row, rows,
                        [&](int r) { return p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd; });
}

template <class T>
void launch(const FlashParams& p, unsigned blocks) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(flash_prefill_wgmma_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  flash_prefill_wgmma_kernel<T><<<blocks, T::kThreads, T::kSmemBytes, stream()>>>(p);
  MS_CUDA_LAUNCHED("flash_prefill_wgmma_kernel");
}

// The kernels of 128-row blocks a run can pick (flash_prefill.h); the first is the default.
using Variant = KernelVariant<void (*)(const FlashParams&, unsigned)>;
constexpr Variant kVariants[] = {
    {"n128ws", flash_prefill_wgmma_ws}, {"n128wscp", flash_prefill_wgmma_ws_gather}, {"n64", launch<Wg128>}};

}  // namespace

std::vector<std::string> flash_prefill_wgmma_variants() { return variant_names(kVariants); }

bool flash_prefill_wgmma_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out) {
  // Q comes by 16-byte cp.async too, where the mma.sync kernel reads it a word at a time.
  return flash_prefill_supported(q, k_cache, v_cache, out) && k_cache.size(2) == kD &&
         reinterpret_cast<uintptr_t>(q.raw()) % 16 == 0 && q.strides()[0] % 8 == 0 && q.strides()[1] % 8 == 0;
}

void flash_prefill_wgmma_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows,
                              std::string_view variant) {
  MS_CHECK(hopper(), "attention: the wgmma prefill kernel needs a Hopper GPU");
  MS_CHECK(flash_prefill_wgmma_supported(q, k_cache, v_cache, out),
           "attention: shapes outside the wgmma prefill kernel");
  // Before the plan: a bad name fails without work.
  const Variant& tall = variant_named(kVariants, variant, "MOESERVE_FLASH_WGMMA_VARIANT", "attention (wgmma prefill)");
  const FlashPlan plan = flash_prefill_plan(q, k_cache, v_cache, layout, scale, out, block_rows);
  if (plan.blocks == 0) return;
  if (block_rows == 128) tall.launch(plan.p, plan.blocks);
  else launch<Wg64>(plan.p, plan.blocks);
}

}  // namespace ms::cuda
