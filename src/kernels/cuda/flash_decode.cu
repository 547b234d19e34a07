// GQA decode on the tensor cores (flash_prefill.h): one warp per (query, KV head, split of the
// keys), no shared memory and no block barriers. The query heads sharing the KV head are the rows
// of mma.m16n8k16 (up to 16), keys its columns for S = Q K^T and its k for O += P V. Every lane
// loads whole 16-byte pieces straight into operand registers; since a dot product does not care
// in which order it sums, the dims of Q and K (and the dims of V and O) are numbered so that each
// lane's pieces are contiguous: lane (g, q) holds dims 32q .. 32q + 31 of its Q and K rows, and
// dims 16g .. 16g + 15 of the V rows of keys 2q, 2q + 1, 2q + 8, 2q + 9 of each 16-key step.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/mma.h"

#include <algorithm>
#include <cmath>

namespace ms::cuda {
namespace {

constexpr int kD = 128, kStep = 16, kWarps = 4;

__device__ __forceinline__ void load_words(const bf16* src, bool valid, int n16, uint32_t* w) {
  for (int i = 0; i < n16; ++i) {
    const uint4 v = valid ? reinterpret_cast<const uint4*>(src)[i] : make_uint4(0, 0, 0, 0);
    w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
  }
}

__global__ void __launch_bounds__(kWarps * 32) flash_decode_kernel(GqaDecodeLaunch p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int z = blockIdx.z * kWarps + warp;
  if (z >= p.splits) return;
  const int t = blockIdx.x, kvh = blockIdx.y, group = p.Hq / p.Hkv;
  const int kv0 = p.kv_begin[t], visible = p.visible[t];
  const int len = p.split_len > 0 ? p.split_len : ((visible + p.splits - 1) / p.splits + 31) / 32 * 32;
  const int kb = min(visible, z * len), ke = min(visible, kb + len);

  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    uint32_t w[16];
    load_words(p.q + int64_t(t) * p.q_s0 + int64_t(kvh * group + row) * p.q_s1 + 32 * q, row < group, 4, w);
#pragma unroll
    for (int s = 0; s < kD / 16; ++s) qa[s][r] = w[2 * s], qa[s][2 + r] = w[2 * s + 1];
  }
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * float(M_LOG2E);
  const int32_t* slots = p.slots + kv0;

  for (int k0 = kb; k0 < ke; k0 += kStep) {
    uint32_t kw[2][16], vw[4][8];
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int key = k0 + 8 * n + g;
      const bool ok = key < ke;
      load_words(p.k + (ok ? int64_t(slots[key]) * p.k_s0 : 0) + kvh * p.k_s1 + 32 * q, ok, 4, kw[n]);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int key = k0 + (i >> 1) * 8 + 2 * q + (i & 1);
      const bool ok = key < ke;
      load_words(p.v + (ok ? int64_t(slots[key]) * p.v_s0 : 0) + kvh * p.v_s1 + 16 * g, ok, 2, vw[i]);
    }
    float s[2][4] = {};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int st = 0; st < kD / 16; ++st) mma_bf16(s[n], qa[st], kw[n][2 * st], kw[n][2 * st + 1]);
    // Online softmax of rows g (values 0, 1) and g + 8 (values 2, 3); a quad shares a row.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[n][i] = k0 + 8 * n + 2 * q + (i & 1) < ke ? s[n][i] * scale_log2 : -INFINITY;
        tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[n][i]);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);  // finite: key kb is in the first step
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new, l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] = exp2f(s[n][i] - m[i >> 1]), l[i >> 1] += s[n][i];
    const uint32_t a[4] = {pack_bf16(s[0][0], s[0][1]), pack_bf16(s[0][2], s[0][3]), pack_bf16(s[1][0], s[1][1]),
                           pack_bf16(s[1][2], s[1][3])};
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn) {
      o[dn][0] *= alpha[0], o[dn][1] *= alpha[0], o[dn][2] *= alpha[1], o[dn][3] *= alpha[1];
      const uint32_t sel = dn % 2 ? 0x7632 : 0x5410;  // high or low bf16 of the two keys' words
      mma_bf16(o[dn], a, __byte_perm(vw[0][dn / 2], vw[1][dn / 2], sel), __byte_perm(vw[2][dn / 2], vw[3][dn / 2], sel));
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  // Lane (g, q) holds, for row g + 8r, dims 16 (2q + e) + dn in o[dn][2r + e].
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (g + 8 * r >= group) continue;
    const int h = kvh * group + g + 8 * r;
    if (p.splits == 1) {
      bf16* dst = p.out + int64_t(t) * p.o_s0 + int64_t(h) * p.o_s1;
      const float inv = 1.0f / l[r];
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int dn = 0; dn < kD / 8; ++dn) dst[16 * (2 * q + e) + dn] = __float2bfloat16_rn(o[dn][2 * r + e] * inv);
      continue;
    }
    const int64_t row = (int64_t(z) * p.T + t) * p.Hq + h;
    float* dst = p.part_acc + row * kD;
#pragma unroll
    for (int e = 0; e < 2; ++e)
#pragma unroll
      for (int dn = 0; dn < kD / 8; ++dn) dst[16 * (2 * q + e) + dn] = o[dn][2 * r + e];
    if (q == 0) p.part_ml[2 * row] = m[r] * float(M_LN2), p.part_ml[2 * row + 1] = l[r];
  }
}

}  // namespace

bool flash_decode_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache) {
  auto wide = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0 && t.strides()[0] % 8 == 0 && t.strides()[1] % 8 == 0 &&
           t.strides()[2] == 1;
  };
  return q.size(2) == kD && v_cache.size(2) == kD && q.size(1) / k_cache.size(1) <= 16 && wide(q) &&
         wide(k_cache) && wide(v_cache);
}

int flash_decode_splits(int64_t T, int64_t Hkv, int max_visible) {
  const int64_t items = T * Hkv, want = 4 * int64_t(sm_count());  // warps
  if (items >= want) return 1;
  return int(std::max<int64_t>(1, std::min<int64_t>((want + items - 1) / items, (max_visible + 31) / 32)));
}

void flash_decode(const GqaDecodeLaunch& l) {
  dim3 grid(unsigned(l.T), unsigned(l.Hkv), unsigned((l.splits + kWarps - 1) / kWarps));
  flash_decode_kernel<<<grid, kWarps * 32, 0, stream()>>>(l);
  MS_CUDA_LAUNCHED("flash_decode_kernel");
}

}  // namespace ms::cuda
