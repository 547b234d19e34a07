// MLA prefill in the expanded (MHA) form, ops::mla_prefill_expanded. The absorbed form
// (flash_mla.cu) costs 2H(2L + R) flops a (query, key) pair over the 512 + 64 latent; expanding
// the keys first costs 2H(nope + R + v) a pair, 3.4x less at DeepSeek's 128 / 64 / 128, for one
// GEMM of the keys' latents with kv_b (2 L H (nope + v) a key, what the absorption and the value
// expansion cost a query anyway). So a prefill whose keys are mostly its own new tokens gathers
// the latent rows of every key it sees, multiplies them by kv_b into per-head K_nope | V rows
// [K, H, nope + v] (cuda::linear: BF16 or FP8 blocks), and runs flash attention over them:
//
// The kernel is flash_prefill.cu's (flash-attention 2 on mma.m16n8k16, online softmax in f32,
// P kept in registers; the tile step is the shared one of flash_softmax.cuh) with 192-dim keys
// and 128-dim values: a block of WARPS warps takes 16 * WARPS queries of one sequence and one
// head; each 64-key tile brings the head's K_nope and V from the GEMM's rows and the shared
// k_rope from the gathered latents, by cp.async into two stages (84 KB), no slot indirection (the
// keys are contiguous now). On a Hopper the same tiles run on warpgroup MMAs instead
// (flash_mla_expanded_wgmma.cu; its 128-row blocks on the warp-specialized
// flash_mla_expanded_wgmma_ws.cu unless MOESERVE_MLA_EXPANDED_VARIANT says otherwise) unless
// MOESERVE_MLA_WGMMA=0. Shapes other than 128 / 64 /
// 128 (the tiny test models) build the 192-dim-style keys explicitly and take cuda::attention's
// general kernel, so the layer's choice is the same on every model.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string_view>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/gemm.h"

namespace ms::cuda {
namespace {

constexpr int kNope = 128, kRope = 64, kDk = kNope + kRope, kDv = 128, kKeys = 64;
constexpr int kKStride = kDk + 8, kVStride = kDv + 8;  // +8: ldmatrix rows on distinct banks
constexpr int kKElems = kKeys * kKStride, kStageElems = kKElems + kKeys * kVStride;
constexpr size_t kSmemBytes = 2 * kStageElems * sizeof(bf16);  // two stages of K and V: 84 KB
constexpr int kChunks = (kNope + kRope + kDv) / 8;           // 16-byte pieces of one key's row

template <int WARPS>
__global__ void __launch_bounds__(WARPS * 32) mla_mha_prefill_kernel(MlaExpandedParams p) {
  constexpr int kThreads = WARPS * 32, kPieces = kKeys * kChunks / kThreads;
  static_assert(kKeys * kChunks % kThreads == 0);
  extern __shared__ float4 smem4[];
  bf16* const smem = reinterpret_cast<bf16*>(smem4);  // [stage][K [kKeys][kKStride], V [kKeys][kVStride]]
  const int4 tile = p.tiles[blockIdx.x / p.heads];
  const int h = blockIdx.x % p.heads;
  const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
  const int keys = vis0 + rows - 1, ntiles = (keys + kKeys - 1) / kKeys;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
  const bf16* const kv_head = p.kv + int64_t(h) * (kNope + kDv);

  // Piece i of a tile: key i / kChunks, and of its row the K_nope (16 pieces), k_rope (8) or V
  // (16) piece i % kChunks; consecutive threads read consecutive 16 bytes. Keys past the
  // sequence's are zeros.
  auto issue = [&](int stage, int k0) {
    bf16* ks = smem + stage * kStageElems;
    bf16* vs = ks + kKElems;
#pragma unroll
    for (int n = 0; n < kPieces; ++n) {
      const int i = int(threadIdx.x) + n * kThreads, r = i / kChunks, c = i % kChunks;
      const bool ok = k0 + r < keys;
      const int64_t key = kv0 + (ok ? k0 + r : 0);
      if (c < kNope / 8) cp_async16(ks + r * kKStride + c * 8, kv_head + key * p.kv_s0 + c * 8, ok);
      else if (c < kDk / 8) cp_async16(ks + r * kKStride + c * 8, p.rope + key * p.rope_s0 + (c * 8 - kNope), ok);
      else cp_async16(vs + r * kVStride + (c * 8 - kDk), kv_head + key * p.kv_s0 + kNope + (c * 8 - kDk), ok);
    }
    cp_async_commit();
  };
  issue(0, 0);

  // This lane's two rows (g and g + 8 of the warp's 16); rows past the tile mask like its last.
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};
  uint32_t qf[kDk / 16][4];
  flash_load_q<kDk>(p.q, p.q_s0, p.q_s1, q0, h, row, rows, qd, qf);
  float o[kDv / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int warp_keys = warp * 16 < rows ? vis0 + min(warp * 16 + 15, rows - 1) : 0;
  const int warp_full = vis0 + min(warp * 16, rows - 1);

  for (int t = 0; t < ntiles; ++t) {
    const int k0 = t * kKeys;
    cp_async_wait<0>();
    // Tile t has landed for every thread, and every warp is done with tile t - 1, whose stage
    // the copy of tile t + 1 takes.
    __syncthreads();
    if (t + 1 < ntiles) issue((t + 1) & 1, k0 + kKeys);
    if (k0 >= warp_keys) continue;  // none of this warp's rows sees these keys
    const bf16* ks = smem + (t & 1) * kStageElems;
    const bf16* vs = ks + kKElems;

    float s[kKeys / 8][4] = {};
    flash_scores<kKeys, kDk, kKStride>(qf, ks, lane, s);
    // The diagonal: keys past a row's causal limit drop out.
    flash_softmax_pv<kKeys, kDv, kVStride>(s, k0 + kKeys > warp_full, k0, seen, p.scale_log2, vs, lane, m, l, o);
  }
  flash_store_rows<kDv>(o, l, row, rows,
                        [&](int r) { return p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd; });
}

template <int WARPS>
void launch(const MlaExpandedParams& p, unsigned blocks) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(mla_mha_prefill_kernel<WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
  });
  mla_mha_prefill_kernel<WARPS><<<blocks, WARPS * 32, kSmemBytes, stream()>>>(p);
  MS_CUDA_LAUNCHED("mla_mha_prefill_kernel");
}

// keys [K, H, nope + R] = K_nope of each head (kv's first nope columns of its nope + v) beside
// the key's shared k_rope: the general kernel's input where the tensor-core one does not fit.
__global__ void build_keys(const bf16* kv, int64_t kv_s0, const bf16* rope, int64_t rope_s0, int64_t K, int H,
                           int nope, int v, int R, bf16* keys) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, dk = nope + R;
  if (idx >= K * H * dk) return;
  const int64_t j = idx / (H * dk), h = (idx / dk) % H, d = idx % dk;
  keys[idx] = d < nope ? kv[j * kv_s0 + h * (nope + v) + d] : rope[j * rope_s0 + d - nope];
}

bool tensor_core_shapes(const Tensor& q, int nope, int v, int64_t R, const Tensor& out) {
  auto pairs = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.raw()) % 4 == 0 && t.strides()[0] % 2 == 0 && t.strides()[1] % 2 == 0 &&
           t.strides()[2] == 1;
  };
  return nope == kNope && v == kDv && R == kRope && pairs(q) && pairs(out);
}

// The wgmma kernel copies q by 16-byte cp.async too, where mma.sync reads it a word at a time.
bool wgmma_q(const Tensor& q) {
  return reinterpret_cast<uintptr_t>(q.raw()) % 16 == 0 && q.strides()[0] % 8 == 0 && q.strides()[1] % 8 == 0;
}

// The absorbed form, as MlaAttention ran it before (captured steps have no host layout to tile).
void absorbed(const Tensor& q, const Tensor& kv_cache, const AttentionLayout& layout, const Weight& kv_b, int nope,
              int v, float scale, Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), R = q.size(2) - nope, L = kv_cache.size(1) - R;
  Tensor q_latent = scratch(DType::BF16, {T, H, L}), o_latent = scratch(DType::BF16, {T, H, L});
  cuda::mla_absorb_q(q.slice(2, 0, nope), kv_b, nope, v, q_latent);
  cuda::mla_attention(q_latent, q.slice(2, nope, nope + R), kv_cache, layout, scale, o_latent);
  cuda::mla_expand_v(o_latent, kv_b, nope, v, out);
}

}  // namespace

void mla_prefill_expanded_on(const Tensor& q, const Tensor& kv_cache, const AttentionLayout& layout, const Weight& kv_b,
                             int nope, int v, float scale, Tensor& out, bool wgmma, std::string_view variant) {
  const int64_t T = q.size(0), H = q.size(1), R = q.size(2) - nope, L = kv_cache.size(1) - R;
  MS_CHECK(q.dim() == 3 && kv_cache.dim() == 2 && R > 0 && L > 0 && out.dim() == 3 && out.size(0) == T &&
               out.size(1) == H && out.size(2) == v && kv_b.in_features() == L &&
               kv_b.out_features() == H * (nope + v),
           "mla_prefill_expanded: shapes ", q.describe(), " ", kv_cache.describe(), " ", kv_b.w.describe(), " ",
           out.describe());
  check_device_tensor(q, {DType::BF16}, "mla_prefill_expanded", "q");
  check_device_tensor(kv_cache, {DType::BF16}, "mla_prefill_expanded", "latent cache");
  check_device_tensor(out, {DType::BF16}, "mla_prefill_expanded", "output");
  MS_CHECK(layout.num_seqs() >= 0 && layout.q_start.back() == T && layout.kv_start.size() == layout.q_start.size(),
           "mla_prefill_expanded: the layout's queries do not match a batch of ", T);
  if (T == 0) return;
  if (capturing()) return absorbed(q, kv_cache, layout, kv_b, nope, v, scale, out);
  // The absorbed form reads FP8 kv_b's kept BF16 copy, which a capture cannot make: this eager
  // call (a captured verify step's warm-up) makes it. The GEMM below reads it too, at many keys.
  if (kv_b.is_fp8() && keep_bf16()) (void)weight_bf16_kept(kv_b);

  // 1. The latent rows of every key, in the layout's order: key j of sequence s is row
  // kv_start[s] + j. 2. Their K_nope | V per head.
  const int64_t K = layout.kv_start.back();
  Tensor lat = scratch(DType::BF16, {K, L + R});
  cuda::gather_rows(kv_cache, layout.kv_slots, lat);
  Tensor kv = scratch(DType::BF16, {K, H * (nope + v)});
  cuda::linear(lat.slice(1, 0, L), kv_b, nullptr, kv);
  const bf16* rope = lat.data<bf16>() + L;

  if (!tensor_core_shapes(q, nope, v, R, out)) {
    Tensor keys = scratch(DType::BF16, {K, H, nope + R});
    const int threads = 256;
    build_keys<<<blocks_for(keys.numel(), threads), threads, 0, stream()>>>(
        kv.data<bf16>(), kv.strides()[0], rope, lat.strides()[0], K, int(H), nope, v, int(R), keys.data<bf16>());
    MS_CUDA_LAUNCHED("build_keys");
    AttentionLayout own = layout;  // the keys are rows now, not slots
    std::iota(own.kv_slots.begin(), own.kv_slots.end(), 0);
    const Tensor values = kv.view({K, H, nope + v}).slice(2, nope, nope + v);
    return cuda::attention(q, keys, values, own, scale, out);
  }

  // 3. Flash attention over them.
  mla_expanded_attention(q, kv, lat.slice(1, L, L + R), layout, scale, out, wgmma, variant);
}

void mla_prefill_expanded(const Tensor& q, const Tensor& kv_cache, const AttentionLayout& layout, const Weight& kv_b,
                          int nope, int v, float scale, Tensor& out) {
  // The Hopper kernel unless MOESERVE_MLA_WGMMA=0 (read per call, so a bench can compare).
  const char* env = std::getenv("MOESERVE_MLA_WGMMA");
  const bool wgmma = hopper() && !(env && std::string_view(env) == "0") && wgmma_q(q);
  mla_prefill_expanded_on(q, kv_cache, layout, kv_b, nope, v, scale, out, wgmma);
}

void mla_expanded_attention(const Tensor& q, const Tensor& kv, const Tensor& rope, const AttentionLayout& layout,
                            float scale, Tensor& out, bool wgmma, std::string_view variant) {
  const int64_t T = q.size(0), H = q.size(1), K = kv.size(0);
  check_device_tensor(q, {DType::BF16}, "mla_prefill_expanded", "q");
  check_device_tensor(out, {DType::BF16}, "mla_prefill_expanded", "output");
  check_device_tensor(kv, {DType::BF16}, "mla_prefill_expanded", "keys' K_nope | V rows");
  check_device_tensor(rope, {DType::BF16}, "mla_prefill_expanded", "keys' rope rows");
  // The keys come by 16-byte cp.async.
  auto rows16 = [](const Tensor& t) {
    return t.dim() == 2 && reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0 && t.strides()[0] % 8 == 0 &&
           t.strides()[1] == 1;
  };
  MS_CHECK(q.dim() == 3 && q.size(2) == kDk && out.dim() == 3 && out.size(0) == T && out.size(1) == H &&
               out.size(2) == kDv && tensor_core_shapes(q, kNope, kDv, kRope, out) && rows16(kv) &&
               kv.size(1) == H * (kNope + kDv) && rows16(rope) && rope.size(0) == K && rope.size(1) == kRope,
           "mla_prefill_expanded: attention shapes ", q.describe(), " ", kv.describe(), " ", rope.describe(), " ",
           out.describe());
  MS_CHECK(!wgmma || wgmma_q(q), "mla_prefill_expanded: the wgmma kernel copies q by 16 bytes: ", q.describe());
  MS_CHECK(layout.q_start.back() == T && layout.kv_start.size() == layout.q_start.size() &&
               layout.kv_start.back() <= K,
           "mla_prefill_expanded: the layout does not match ", T, " queries over ", K, " keys");

  // Blocks of 128 rows where sequences are long enough to fill them.
  const int block_rows = T >= 128 * int64_t(std::max(1, layout.num_seqs())) ? 128 : 64;
  std::vector<std::array<int32_t, 4>> tiles;
  for (int s = 0; s < layout.num_seqs(); ++s) {
    const int nq = layout.q_start[s + 1] - layout.q_start[s], nk = layout.kv_start[s + 1] - layout.kv_start[s];
    MS_CHECK(nq <= nk, "mla_prefill_expanded: sequence ", s, " has ", nq, " queries but only ", nk, " keys");
    for (int f = 0; f < nq; f += block_rows)
      tiles.push_back({layout.q_start[s] + f, std::min(block_rows, nq - f), layout.kv_start[s], nk - nq + f + 1});
  }
  if (tiles.empty()) return;
  // Longest first: a block's work grows with the keys its last row sees.
  std::stable_sort(tiles.begin(), tiles.end(), [](const auto& a, const auto& b) { return a[3] + a[1] > b[3] + b[1]; });
  std::vector<int32_t> flat;
  for (const auto& t : tiles) flat.insert(flat.end(), t.begin(), t.end());
  const int64_t blocks = int64_t(tiles.size()) * H;
  MS_CHECK(blocks < (int64_t(1) << 31), "mla_prefill_expanded: ", blocks, " blocks");
  Tensor d_tiles = upload_i32(flat);
  const MlaExpandedParams p{q.data<bf16>(), q.strides()[0], q.strides()[1],
                            kv.data<bf16>(), kv.strides()[0],
                            rope.data<bf16>(), rope.strides()[0],
                            out.data<bf16>(), out.strides()[0], out.strides()[1],
                            reinterpret_cast<const int4*>(d_tiles.raw()), int(H), scale * float(M_LOG2E),
                            T, K};
  if (wgmma) mla_expanded_wgmma(p, unsigned(blocks), block_rows, variant);
  else if (block_rows == 128) launch<8>(p, unsigned(blocks));
  else launch<4>(p, unsigned(blocks));
}

}  // namespace ms::cuda
