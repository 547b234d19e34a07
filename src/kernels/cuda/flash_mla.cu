// Absorbed MLA prefill on the tensor cores (flash_prefill.h). The 16 heads of one query share
// its keys (the latent cache row: 512 latent + 64 rope values, the first 512 also the value), so
// a block takes 16 heads of one query as the 16 rows of the mma and reads each key once for all
// of them. Per tile of 32 keys: each of the 4 warps scores a quarter of the 576 dims (S partial
// sums meet in shared memory), 128 threads run the online softmax (8 per row), and each warp
// accumulates its quarter of the 512 output dims from P (bf16, shared memory) and the tile.
// Decode splits the keys across blocks (blockIdx.z) and leaves partial softmaxes to merge.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/mma.h"

#include <cmath>

namespace ms::cuda {
namespace {

constexpr int kL = 512, kR = 64, kDk = kL + kR, kHeads = 16, kKeys = 32, kWarps = 4;
constexpr int kStride = kDk + 8, kPStride = kKeys + 8;  // padded rows: ldmatrix without bank conflicts
constexpr int kDkWarp = kDk / kWarps, kDvWarp = kL / kWarps;  // 144 scored, 128 accumulated dims a warp
constexpr size_t kSmem = size_t(kKeys) * kStride * 2 + size_t(kWarps) * kHeads * kKeys * 4 +
                         size_t(kHeads) * kPStride * 2 + 2 * kHeads * 4;

__global__ void __launch_bounds__(kWarps * 32) flash_mla_kernel(MlaLaunch p) {
  extern __shared__ float4 smem4[];
  bf16* ks = reinterpret_cast<bf16*>(smem4);                      // [kKeys][kStride]
  float* sp = reinterpret_cast<float*>(ks + kKeys * kStride);     // [kWarps][kHeads][kKeys]
  bf16* pb = reinterpret_cast<bf16*>(sp + kWarps * kHeads * kKeys);  // [kHeads][kPStride]
  float* alpha_s = reinterpret_cast<float*>(pb + kHeads * kPStride);  // [kHeads], then l [kHeads]
  const int t = blockIdx.x, h0 = blockIdx.y * kHeads;
  const int kv0 = p.kv_begin[t], visible = p.visible[t];
  const int len = p.split_len > 0 ? p.split_len : ((visible + p.splits - 1) / p.splits + kKeys - 1) / kKeys * kKeys;
  const int kb = min(visible, int(blockIdx.z) * len), keys = min(visible, kb + len);  // this block's keys [kb, keys)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;

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

  const float scale_log2 = p.scale * float(M_LOG2E);
  for (int k0 = kb; k0 < keys; k0 += kKeys) {
    __syncthreads();  // the previous tile is consumed
    for (int i = threadIdx.x; i < kKeys * (kDk / 8); i += blockDim.x) {
      const int j = i / (kDk / 8), c = (i % (kDk / 8)) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (k0 + j < keys) v = *reinterpret_cast<const uint4*>(p.kv + int64_t(p.slots[kv0 + k0 + j]) * p.kv_s0 + c);
      *reinterpret_cast<uint4*>(ks + j * kStride + c) = v;
    }
    __syncthreads();
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
              nullptr, nullptr, T, int(q_latent.size(1)), 1, 1 << 30, scale};
  flash_mla(l);
}

void flash_mla(const MlaLaunch& l) {
  dim3 grid(unsigned(l.T), unsigned(l.H / kHeads), unsigned(l.splits));
  flash_mla_kernel<<<grid, kWarps * 32, kSmem, stream()>>>(l);
  MS_CUDA_LAUNCHED("flash_mla_kernel");
}

}  // namespace ms::cuda
