// Absorbed MLA on the tensor cores (flash_prefill.h). The 16 heads of one query share its keys
// (the latent cache row: 512 latent + 64 rope values, the first 512 also the value), so a block
// takes 16 heads of one query as the 16 rows of the mma and reads each key once for all of them.
// Per tile of 32 keys: each of the 4 warps scores a quarter of the 576 dims (S partial sums meet
// in shared memory), 128 threads run the online softmax (8 per row), and each warp accumulates
// its quarter of the 512 output dims from P (bf16, shared memory) and the tile.
//
// Tiles arrive by cp.async into a ring of STAGES tiles; warp w copies rows 8w .. 8w + 7, a row's
// 1152 bytes by all 32 lanes, with the slot indices loaded a tile ahead. Decode (split-KV, each
// block's keys read once) keeps two tiles (72 KB) in flight while it computes one; prefill,
// whose blocks reread the same keys from L2 and are compute-bound, keeps one stage and four
// blocks a multiprocessor.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/mma.h"

#include <algorithm>
#include <cmath>

namespace ms::cuda {
namespace {

constexpr int kL = 512, kR = 64, kDk = kL + kR, kHeads = 16, kKeys = 32, kWarps = 4;
constexpr int kStride = kDk + 8, kPStride = kKeys + 8;  // padded rows: ldmatrix without bank conflicts
constexpr int kDkWarp = kDk / kWarps, kDvWarp = kL / kWarps;  // 144 scored, 128 accumulated dims a warp
constexpr int kDecodeStages = 3;
constexpr size_t kTileBytes = size_t(kKeys) * kStride * 2;
constexpr size_t kScratchBytes = size_t(kWarps) * kHeads * kKeys * 4 + size_t(kHeads) * kPStride * 2 + 2 * kHeads * 4;
constexpr size_t smem_bytes(int stages) { return stages * kTileBytes + kScratchBytes; }

// Issues the copies of one tile's rows 8w .. 8w + 7 (w: this warp) into `buf`; lane i < 8 holds
// the slot of row 8w + i (-1: past the block's keys, copied as zeros).
__device__ __forceinline__ void issue_tile(bf16* buf, const bf16* kv, int64_t kv_s0, int slot, int warp, int lane) {
#pragma unroll
  for (int r = 0; r < 8; ++r) {
    const int s = __shfl_sync(0xffffffffu, slot, r);
    const bf16* src = kv + (s >= 0 ? int64_t(s) * kv_s0 : 0);
    bf16* dst = buf + (warp * 8 + r) * kStride;
#pragma unroll
    for (int c = lane; c < kDk / 8; c += 32) cp_async16(dst + 8 * c, src + 8 * c, s >= 0);
  }
}

template <int STAGES>
__global__ void __launch_bounds__(kWarps * 32) flash_mla_kernel(MlaLaunch p) {
  extern __shared__ float4 smem4[];
  pdl_trigger();  // the merge after this may launch: it waits for these partials
  bf16* ring = reinterpret_cast<bf16*>(smem4);                        // [STAGES][kKeys][kStride]
  float* sp = reinterpret_cast<float*>(ring + STAGES * kKeys * kStride);  // [kWarps][kHeads][kKeys]
  bf16* pb = reinterpret_cast<bf16*>(sp + kWarps * kHeads * kKeys);  // [kHeads][kPStride]
  float* alpha_s = reinterpret_cast<float*>(pb + kHeads * kPStride);  // [kHeads], then l [kHeads]
  const int t = blockIdx.x, h0 = blockIdx.y * kHeads;
  const int kv0 = p.kv_begin[t], visible = p.visible[t];
  const int len = p.split_len > 0 ? p.split_len : ((visible + p.splits - 1) / p.splits + kKeys - 1) / kKeys * kKeys;
  const int kb = min(visible, int(blockIdx.z) * len), keys = min(visible, kb + len);  // this block's keys [kb, keys)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
  const float scale_log2 = p.scale * float(M_LOG2E);
  // The slot of row 8 * warp + lane of tile i (lanes 0..7 only; -1 past the block's keys).
  auto slot_of = [&](int i) {
    const int key = kb + i * kKeys + warp * 8 + lane;
    return lane < 8 && key < keys ? p.slots[kv0 + key] : -1;
  };
  // The first tiles' slots are the step's metadata, on the device before any kernel of the step
  // ran: read before the wait for the kernel before this one (launched early: launch_pdl), which
  // wrote the query and the step's new keys. Keys older than those (MlaLaunch::fresh) were written
  // by earlier steps: when the first tiles hold none of the new ones, their copies leave before
  // the wait too.
  int sl[STAGES];
#pragma unroll
  for (int s = 0; s < STAGES; ++s) sl[s] = slot_of(s);
  auto issue_first = [&] {
#pragma unroll
    for (int s = 0; s + 1 < STAGES; ++s) {
      if (kb + s * kKeys < keys) issue_tile(ring + s * kKeys * kStride, p.kv, p.kv_s0, sl[s], warp, lane);
      cp_async_commit();
    }
  };
  const bool old_keys = min(keys, kb + (STAGES - 1) * kKeys) <= visible - p.fresh;
  if (old_keys) issue_first();
  pdl_wait();
  if (!old_keys) issue_first();

  uint32_t qf[kDkWarp / 16][4];
#pragma unroll
  for (int s = 0; s < kDkWarp / 16; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int h = h0 + g + (i & 1) * 8, d = warp * kDkWarp + s * 16 + 2 * qd + (i >> 1) * 8;
      const bf16* src = d < kL ? p.ql + int64_t(t) * p.ql_s0 + h * p.ql_s1 + d
                               : p.qr + int64_t(t) * p.qr_s0 + h * p.qr_s1 + (d - kL);
      qf[s][i] = *reinterpret_cast<const uint32_t*>(src);
    }
  float o[kDvWarp / 8][4] = {};
  // Softmax: thread i owns row i / 8 (a head) and keys (i % 8) * 4 .. + 4 of each tile.
  const int srow = threadIdx.x / 8, scol = (threadIdx.x % 8) * 4;
  float m = -INFINITY, l = 0.f;
  int pending = sl[STAGES - 1];
  for (int k0 = kb, i = 0, stage = 0; k0 < keys; k0 += kKeys, ++i, stage = stage + 1 == STAGES ? 0 : stage + 1) {
    if constexpr (STAGES == 1) {
      __syncthreads();  // the previous tile is consumed
      issue_tile(ring, p.kv, p.kv_s0, pending, warp, lane);
      cp_async_commit();
      pending = slot_of(i + 1);
      cp_async_wait<0>();
      __syncthreads();  // every warp's rows have landed
    } else {
      cp_async_wait<STAGES - 2>();
      __syncthreads();  // tile i has landed for every warp, and every warp is done with tile i - 1
      // Tile i + STAGES - 1 goes into the stage tile i - 1 used.
      if (k0 + (STAGES - 1) * kKeys < keys)
        issue_tile(ring + (stage == 0 ? STAGES - 1 : stage - 1) * kKeys * kStride, p.kv, p.kv_s0, pending, warp, lane);
      cp_async_commit();
      pending = slot_of(i + STAGES);
    }
    const bf16* ks = ring + stage * kKeys * kStride;
    float s[kKeys / 8][4] = {};
#pragma unroll
    for (int st = 0; st < kDkWarp / 16; ++st)
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4<false>(ks + (np * 16 + (lane / 16) * 8 + lane % 8) * kStride + warp * kDkWarp + st * 16 +
                               ((lane / 8) % 2) * 8,
                           b);
        mma_bf16(s[2 * np], qf[st], b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf[st], b[2], b[3]);
      }
    float* mine = sp + warp * kHeads * kKeys;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) mine[(g + (i >> 1) * 8) * kKeys + n * 8 + 2 * qd + (i & 1)] = s[n][i];
    __syncthreads();
    float x[4], tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) v += sp[(w * kHeads + srow) * kKeys + scol + j];
      x[j] = k0 + scol + j < keys ? v * scale_log2 : -INFINITY;
      tile_max = fmaxf(tile_max, x[j]);
    }
#pragma unroll
    for (int o8 = 1; o8 < 8; o8 <<= 1) tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, o8));
    const float m_new = fmaxf(m, tile_max);  // finite: key kb is in the first tile
    const float alpha = exp2f(m - m_new);
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      x[j] = exp2f(x[j] - m_new);
      sum += x[j];
    }
#pragma unroll
    for (int o8 = 1; o8 < 8; o8 <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o8);
    m = m_new, l = l * alpha + sum;
    *reinterpret_cast<uint2*>(pb + srow * kPStride + scol) = make_uint2(pack_bf16(x[0], x[1]), pack_bf16(x[2], x[3]));
    if (threadIdx.x % 8 == 0) alpha_s[srow] = alpha;
    __syncthreads();
    const float a_lo = alpha_s[g], a_hi = alpha_s[g + 8];
#pragma unroll
    for (int n = 0; n < kDvWarp / 8; ++n) o[n][0] *= a_lo, o[n][1] *= a_lo, o[n][2] *= a_hi, o[n][3] *= a_hi;
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4<false>(pb + (((lane / 8) % 2) * 8 + lane % 8) * kPStride + kk * 16 + (lane / 16) * 8, a);
#pragma unroll
      for (int dn = 0; dn < kDvWarp / 16; ++dn) {
        uint32_t b[4];
        ldmatrix_x4<true>(ks + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStride + warp * kDvWarp + dn * 16 +
                              (lane / 16) * 8,
                          b);
        mma_bf16(o[2 * dn], a, b[0], b[1]);
        mma_bf16(o[2 * dn + 1], a, b[2], b[3]);
      }
    }
  }
  float* l_s = alpha_s + kHeads;
  __syncthreads();  // every warp has read the last tile's alpha_s
  if (threadIdx.x % 8 == 0) l_s[srow] = l, alpha_s[srow] = m;
  __syncthreads();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int h = h0 + g + 8 * r;
    if (p.splits == 1) {
      const float inv = 1.0f / l_s[g + 8 * r];
      bf16* dst = p.out + int64_t(t) * p.o_s0 + h * p.o_s1 + warp * kDvWarp + 2 * qd;
#pragma unroll
      for (int n = 0; n < kDvWarp / 8; ++n)
        *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) =
            __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
      continue;
    }
    const int64_t row = (int64_t(blockIdx.z) * p.T + t) * p.H + h;
    float* dst = p.part_acc + row * kL + warp * kDvWarp + 2 * qd;
#pragma unroll
    for (int n = 0; n < kDvWarp / 8; ++n) *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    if (warp == 0 && qd == 0)  // an empty split reports m = -inf, l = 0 and zeros
      p.part_ml[2 * row] = alpha_s[g + 8 * r] * float(M_LN2), p.part_ml[2 * row + 1] = l_s[g + 8 * r];
  }
}

template <int STAGES>
void launch(const MlaLaunch& l) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(flash_mla_kernel<STAGES>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(smem_bytes(STAGES))));
  });
  dim3 grid(unsigned(l.T), unsigned(l.H / kHeads), unsigned(l.splits));
  launch_pdl(flash_mla_kernel<STAGES>, grid, dim3(kWarps * 32), smem_bytes(STAGES), l);
  MS_CUDA_LAUNCHED("flash_mla_kernel");
}

}  // namespace

bool flash_mla_supported(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const Tensor& out) {
  auto pairs = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.raw()) % 4 == 0 && t.strides()[0] % 2 == 0 && t.strides()[1] % 2 == 0;
  };
  return q_latent.size(2) == kL && q_rope.size(2) == kR && q_latent.size(1) % kHeads == 0 && pairs(q_latent) &&
         pairs(q_rope) && pairs(out) && kv_cache.strides()[0] % 8 == 0 && kv_cache.strides()[1] == 1 &&
         reinterpret_cast<uintptr_t>(kv_cache.raw()) % 16 == 0;
}

void flash_mla_prefill(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                       const ops::AttentionLayout& layout, float scale, Tensor& out) {
  std::vector<int32_t> ranges, visible;  // ranges: every query's first kv index, then `visible`
  for (int s = 0; s < layout.num_seqs(); ++s) {
    const int nq = layout.q_start[s + 1] - layout.q_start[s], nk = layout.kv_start[s + 1] - layout.kv_start[s];
    MS_CHECK(nq <= nk, "mla_attention: sequence ", s, " has ", nq, " queries but only ", nk, " keys");
    for (int i = 0; i < nq; ++i) ranges.push_back(layout.kv_start[s]), visible.push_back(nk - nq + i + 1);
  }
  ranges.insert(ranges.end(), visible.begin(), visible.end());
  const int64_t slots = kv_cache.size(0);
  for (int32_t slot : layout.kv_slots)
    MS_CHECK(slot >= 0 && slot < slots, "mla_attention: KV slot ", slot, " outside the pool of ", slots);
  if (ranges.empty()) return;
  Tensor d_ranges = upload_i32(ranges), d_slots = upload_i32(layout.kv_slots);
  const int T = int(ranges.size() / 2);
  MlaLaunch l{q_latent.data<bf16>(), q_latent.strides()[0], q_latent.strides()[1],
              q_rope.data<bf16>(), q_rope.strides()[0], q_rope.strides()[1],
              kv_cache.data<bf16>(), kv_cache.strides()[0],
              out.data<bf16>(), out.strides()[0], out.strides()[1],
              d_slots.data<int32_t>(), d_ranges.data<int32_t>(), d_ranges.data<int32_t>() + T,
              nullptr, nullptr, T, int(q_latent.size(1)), 1, 1 << 30, scale, T};
  launch<1>(l);
}

void flash_mla(const MlaLaunch& l) { launch<kDecodeStages>(l); }

// One resident block a multiprocessor (the decode ring's 119 KB), with two tiles in flight,
// rounded down so that the launch is one wave; at least 64 keys a split, so that a split's
// partial (32 KB of f32 for 16 heads) stays well under the 72 KB of keys it reads.
int flash_mla_decode_splits(int64_t T, int64_t H, int max_visible) {
  const int64_t blocks = T * (H / kHeads), want = sm_count();
  return int(std::max<int64_t>(1, std::min<int64_t>(want / blocks, (max_visible + 63) / 64)));
}

}  // namespace ms::cuda
