// Prefill attention on the tensor cores (flash_prefill.h), flash-attention 2 style. A block of
// WARPS warps takes 16 * WARPS queries of one sequence and one query head, 16 rows a warp; keys
// and values come 64 at a time into shared memory, gathered by slot. S = Q K^T and O += P V are
// mma.m16n8k16 in bf16 with f32 sums; the softmax is online per row in f32 (base 2, the scale
// folded in), and P goes from the S accumulators to the A operand of P V without leaving
// registers. Causality is per row: row i of a tile sees the first vis0 + i keys of its sequence.
//
// Where the time goes: a 64-key tile is 32 KB of K and V from L2 for 16 * WARPS rows of mma
// work. The tiles come by cp.async into two stages, the next one copied while the warps work on
// this one (the slot indices are read a tile further ahead, so no warp waits on them), and
// 128-row blocks read half the L2 bytes per flop of 64-row ones. At ~210 registers a thread both
// keep 8 warps on a multiprocessor (one 128-row block or two 64-row ones, 68 KB of shared memory
// each); the 64-row blocks serve short sequences. Only tiles on the diagonal pay for the causal
// mask, and a warp skips the tiles past its last row. The host orders the blocks longest first,
// heads fastest, so that the long tiles at the bottom of the causal triangle do not trail the
// launch. On a Hopper flash_prefill runs flash_prefill_wgmma.cu's kernel instead (same tiles).
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace ms::cuda {
namespace {

constexpr int kD = 128, kKeys = 64, kStride = kD + 8;  // +8: ldmatrix rows on distinct banks
constexpr int kTileElems = kKeys * kStride;            // one stage of K (or of V)
constexpr size_t kSmemBytes = 2 * 2 * kTileElems * sizeof(bf16);  // two stages of K and V: 68 KB

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) flash_prefill_kernel(FlashParams p) {
  // The copy of a tile: thread i moves the 16-byte column i % 16 of key rows i / 16 + kPass * n.
  constexpr int kPass = WARPS * 32 / (kD / 8), kPieces = kKeys / kPass;
  extern __shared__ float4 smem4[];
  bf16* const smem = reinterpret_cast<bf16*>(smem4);  // [stage][K, V][kKeys][kStride]
  const int4 tile = p.tiles[blockIdx.x / p.heads];
  const int h = blockIdx.x % p.heads, kvh = h / p.group;
  const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
  const int keys = vis0 + rows - 1, ntiles = (keys + kKeys - 1) / kKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
  const int cc = (threadIdx.x % (kD / 8)) * 8, cr = threadIdx.x / (kD / 8);

  int slot[kPieces];  // of the rows this thread copies next; -1 past the keys (copied as zeros)
  auto fetch_slots = [&](int k0) {
#pragma unroll
    for (int n = 0; n < kPieces; ++n) {
      const int j = k0 + cr + n * kPass;
      slot[n] = j < keys ? p.slots[kv0 + j] : -1;
    }
  };
  auto issue = [&](int stage) {
    bf16* ks = smem + stage * 2 * kTileElems;
    bf16* vs = ks + kTileElems;
#pragma unroll
    for (int n = 0; n < kPieces; ++n) {
      const int r = cr + n * kPass;
      const int64_t s = slot[n] >= 0 ? slot[n] : 0;
      cp_async16(ks + r * kStride + cc, p.k + s * p.k_s0 + kvh * p.k_s1 + cc, slot[n] >= 0);
      cp_async16(vs + r * kStride + cc, p.v + s * p.v_s0 + kvh * p.v_s1 + cc, slot[n] >= 0);
    }
    cp_async_commit();
  };
  fetch_slots(0);
  issue(0);
  if (ntiles > 1) fetch_slots(kKeys);

  // This lane's two rows (g and g + 8 of the warp's 16); rows past the tile mask like its last.
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};
  uint32_t qf[kD / 16][4];
  flash_load_q<kD>(p.q, p.q_s0, p.q_s1, q0, h, row, rows, qd, qf);
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // Keys this warp's rows see: none when they are all past the tile; keys below warp_full are
  // seen by every row of the warp, so tiles that end there need no mask.
  const int warp_keys = warp * 16 < rows ? vis0 + min(warp * 16 + 15, rows - 1) : 0;
  const int warp_full = vis0 + min(warp * 16, rows - 1);

  for (int t = 0; t < ntiles; ++t) {
    const int k0 = t * kKeys;
    cp_async_wait<0>();
    // Tile t has landed for every thread, and every warp is done with tile t - 1, whose stage
    // the copy of tile t + 1 takes.
    __syncthreads();
    if (t + 1 < ntiles) {
      issue((t + 1) & 1);
      if (t + 2 < ntiles) fetch_slots(k0 + 2 * kKeys);
    }
    if (k0 >= warp_keys) continue;  // none of this warp's rows sees these keys
    const bf16* ks = smem + (t & 1) * 2 * kTileElems;
    const bf16* vs = ks + kTileElems;

    float s[kKeys / 8][4] = {};
    flash_scores<kKeys, kD, kStride>(qf, ks, lane, s);
    // The diagonal: keys past a row's causal limit (or the keys) drop out.
    flash_softmax_pv<kKeys, kD, kStride>(s, k0 + kKeys > warp_full, k0, seen, p.scale_log2, vs, lane, m, l, o);
  }
  flash_store_rows<kD>(o, l, row, rows,
                        [&](int r) { return p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd; });
}

template <int WARPS>
void launch(const FlashParams& p, unsigned blocks) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(flash_prefill_kernel<WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
  });
  flash_prefill_kernel<WARPS><<<blocks, WARPS * 32, kSmemBytes, stream()>>>(p);
  MS_CUDA_LAUNCHED("flash_prefill_kernel");
}

}  // namespace

bool flash_prefill_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out) {
  auto aligned = [](const Tensor& t, int64_t words) {
    return reinterpret_cast<uintptr_t>(t.raw()) % (2 * words) == 0 && t.strides()[0] % words == 0 &&
           t.strides()[1] % words == 0 && t.strides()[2] == 1;
  };
  return q.size(2) == kD && v_cache.size(2) == kD && aligned(q, 2) && aligned(out, 2) && aligned(k_cache, 8) &&
         aligned(v_cache, 8);
}

namespace {

// The Hopper kernel unless MOESERVE_FLASH_WGMMA=0 (read per call, so a bench can compare).
bool use_wgmma(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out) {
  const char* env = std::getenv("MOESERVE_FLASH_WGMMA");
  return hopper() && !(env && std::string_view(env) == "0") && flash_prefill_wgmma_supported(q, k_cache, v_cache, out);
}

}  // namespace

void flash_prefill(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionLayout& layout,
                   float scale, Tensor& out) {
  // 64-row blocks where sequences are short: 128-row ones would leave warps without rows.
  const bool tall = int64_t(q.size(0)) >= 128 * int64_t(std::max(1, layout.num_seqs()));
  if (use_wgmma(q, k_cache, v_cache, out))
    flash_prefill_wgmma_rows(q, k_cache, v_cache, layout, scale, out, tall ? 128 : 64);
  else
    flash_prefill_rows(q, k_cache, v_cache, layout, scale, out, tall ? 128 : 64);
}

FlashPlan flash_prefill_plan(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows) {
  MS_CHECK(block_rows == 64 || block_rows == 128, "attention: prefill blocks of ", block_rows, " rows");
  std::vector<std::array<int32_t, 4>> tiles;  // {first query, rows, first kv index, keys seen by the first row}
  for (int s = 0; s < layout.num_seqs(); ++s) {
    const int nq = layout.q_start[s + 1] - layout.q_start[s], nk = layout.kv_start[s + 1] - layout.kv_start[s];
    MS_CHECK(nq <= nk, "attention: sequence ", s, " has ", nq, " queries but only ", nk, " keys");
    for (int f = 0; f < nq; f += block_rows)
      tiles.push_back({layout.q_start[s] + f, std::min(block_rows, nq - f), layout.kv_start[s], nk - nq + f + 1});
  }
  const int64_t slots = k_cache.size(0);
  for (int32_t slot : layout.kv_slots)
    MS_CHECK(slot >= 0 && slot < slots, "attention: KV slot ", slot, " outside the pool of ", slots);
  FlashPlan plan;
  if (tiles.empty()) return plan;
  // Longest first: a block's work grows with the keys its last row sees.
  std::stable_sort(tiles.begin(), tiles.end(), [](const auto& a, const auto& b) { return a[3] + a[1] > b[3] + b[1]; });
  std::vector<int32_t> flat;
  for (const auto& t : tiles) flat.insert(flat.end(), t.begin(), t.end());
  const int64_t heads = q.size(1), blocks = int64_t(tiles.size()) * heads;
  MS_CHECK(blocks < (int64_t(1) << 31), "attention: ", blocks, " prefill blocks");
  plan.tiles = upload_i32(flat);
  // The slots, then each kv index's run of consecutive slots: a tile of keys whose slots run on
  // is one box of the cache, which the warp-specialized kernel brings by tensor copies.
  const size_t K = layout.kv_slots.size();
  std::vector<int32_t> slots_runs(layout.kv_slots);
  slots_runs.resize(2 * K);
  for (size_t j = K; j-- > 0;)
    slots_runs[K + j] = j + 1 < K && layout.kv_slots[j + 1] == layout.kv_slots[j] + 1 ? slots_runs[K + j + 1] + 1 : 1;
  plan.slots = upload_i32(slots_runs);
  plan.p = FlashParams{q.data<bf16>(), q.strides()[0], q.strides()[1],
                       k_cache.data<bf16>(), k_cache.strides()[0], k_cache.strides()[1],
                       v_cache.data<bf16>(), v_cache.strides()[0], v_cache.strides()[1],
                       out.data<bf16>(), out.strides()[0], out.strides()[1],
                       plan.slots.data<int32_t>(), plan.slots.data<int32_t>() + K,
                       reinterpret_cast<const int4*>(plan.tiles.raw()), int(heads), int(heads / k_cache.size(1)),
                       scale * float(M_LOG2E), slots};
  plan.blocks = unsigned(blocks);
  return plan;
}

void flash_prefill_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows) {
  const FlashPlan plan = flash_prefill_plan(q, k_cache, v_cache, layout, scale, out, block_rows);
  if (plan.blocks == 0) return;
  if (block_rows == 128) launch<8>(plan.p, plan.blocks);
  else launch<4>(plan.p, plan.blocks);
}

}  // namespace ms::cuda
