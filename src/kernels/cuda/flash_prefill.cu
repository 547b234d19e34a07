// Prefill attention on the tensor cores (flash_prefill.h), flash-attention 2 style. A block of
// 4 warps takes 64 queries of one sequence and one query head, 16 rows a warp; keys and values
// come 64 at a time into shared memory, gathered by slot. S = Q K^T and O += P V are
// mma.m16n8k16 in bf16 with f32 sums; the softmax is online per row in f32 (base 2, the scale
// folded in), and P goes from the S accumulators to the A operand of P V without leaving
// registers. Causality is per row: row i of a tile sees the first vis0 + i keys of its sequence.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/mma.h"

#include <cmath>

namespace ms::cuda {
namespace {

constexpr int kD = 128, kRows = 64, kKeys = 64, kStride = kD + 8;  // +8: ldmatrix rows on distinct banks

struct FlashParams {
  const bf16* q; int64_t q_s0, q_s1;
  const bf16* k; int64_t k_s0, k_s1;
  const bf16* v; int64_t v_s0, v_s1;
  bf16* out; int64_t o_s0, o_s1;
  const int32_t* slots;
  const int4* tiles;  // {first query, rows, first kv index, keys seen by the first row}
  int group;
  float scale_log2;
};

__global__ void __launch_bounds__(128) flash_prefill_kernel(FlashParams p) {
  __shared__ __align__(16) bf16 ks[kKeys * kStride];
  __shared__ __align__(16) bf16 vs[kKeys * kStride];
  const int4 tile = p.tiles[blockIdx.x];
  const int q0 = tile.x, rows = tile.y, kv0 = tile.z, vis0 = tile.w;
  const int h = blockIdx.y, kvh = h / p.group;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, qd = lane % 4;
  // This lane's two rows (g and g + 8 of the warp's 16); rows past the tile mask like its last.
  const int row[2] = {warp * 16 + g, warp * 16 + g + 8};
  const int seen[2] = {vis0 + min(row[0], rows - 1), vis0 + min(row[1], rows - 1)};

  uint32_t qf[kD / 16][4];
#pragma unroll
  for (int s = 0; s < kD / 16; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row[i & 1], d = s * 16 + 2 * qd + (i >> 1) * 8;
      qf[s][i] = r < rows ? *reinterpret_cast<const uint32_t*>(p.q + int64_t(q0 + r) * p.q_s0 + h * p.q_s1 + d) : 0u;
    }
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const int keys = vis0 + rows - 1, warp_keys = vis0 + min(warp * 16 + 15, rows - 1);

  for (int k0 = 0; k0 < keys; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous tile
    for (int i = threadIdx.x; i < kKeys * (kD / 8); i += blockDim.x) {
      const int j = i / (kD / 8), c = (i % (kD / 8)) * 8;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (k0 + j < keys) {
        const int64_t slot = p.slots[kv0 + k0 + j];
        kv = *reinterpret_cast<const uint4*>(p.k + slot * p.k_s0 + kvh * p.k_s1 + c);
        vv = *reinterpret_cast<const uint4*>(p.v + slot * p.v_s0 + kvh * p.v_s1 + c);
      }
      *reinterpret_cast<uint4*>(ks + j * kStride + c) = kv;
      *reinterpret_cast<uint4*>(vs + j * kStride + c) = vv;
    }
    __syncthreads();
    if (k0 >= warp_keys) continue;  // none of this warp's rows sees these keys

    float s[kKeys / 8][4] = {};
#pragma unroll
    for (int d = 0; d < kD / 16; ++d)
#pragma unroll
      for (int np = 0; np < kKeys / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4<false>(ks + (np * 16 + (lane / 16) * 8 + lane % 8) * kStride + d * 16 + ((lane / 8) % 2) * 8, b);
        mma_bf16(s[2 * np], qf[d], b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf[d], b[2], b[3]);
      }
    // Online softmax of rows g (values 0, 1) and g + 8 (values 2, 3); a quad shares a row.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + n * 8 + 2 * qd + (i & 1);
        s[n][i] = key < seen[i >> 1] ? s[n][i] * p.scale_log2 : -INFINITY;
        tile_max[i >> 1] = fmaxf(tile_max[i >> 1], s[n][i]);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m[r], tile_max[r]);  // finite: key 0 is in the first tile of every row
      alpha[r] = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[n][i] = exp2f(s[n][i] - m[i >> 1]);
        l[i >> 1] += s[n][i];
      }
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[n][i] *= alpha[i >> 1];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dn = 0; dn < kD / 16; ++dn) {
        uint32_t b[4];
        ldmatrix_x4<true>(vs + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStride + dn * 16 + (lane / 16) * 8, b);
        mma_bf16(o[2 * dn], a, b[0], b[1]);
        mma_bf16(o[2 * dn + 1], a, b[2], b[3]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= rows) continue;
    const float inv = 1.0f / l[r];
    bf16* dst = p.out + int64_t(q0 + row[r]) * p.o_s0 + h * p.o_s1 + 2 * qd;
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
      *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) = __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
  }
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

void flash_prefill(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionLayout& layout,
                   float scale, Tensor& out) {
  std::vector<int32_t> tiles;
  for (int s = 0; s < layout.num_seqs(); ++s) {
    const int nq = layout.q_start[s + 1] - layout.q_start[s], nk = layout.kv_start[s + 1] - layout.kv_start[s];
    MS_CHECK(nq <= nk, "attention: sequence ", s, " has ", nq, " queries but only ", nk, " keys");
    for (int f = 0; f < nq; f += kRows)
      tiles.insert(tiles.end(), {layout.q_start[s] + f, std::min(kRows, nq - f), layout.kv_start[s], nk - nq + f + 1});
  }
  const int64_t slots = k_cache.size(0);
  for (int32_t slot : layout.kv_slots)
    MS_CHECK(slot >= 0 && slot < slots, "attention: KV slot ", slot, " outside the pool of ", slots);
  if (tiles.empty()) return;
  Tensor d_tiles = upload_i32(tiles), d_slots = upload_i32(layout.kv_slots);
  FlashParams p{q.data<bf16>(), q.strides()[0], q.strides()[1],
                k_cache.data<bf16>(), k_cache.strides()[0], k_cache.strides()[1],
                v_cache.data<bf16>(), v_cache.strides()[0], v_cache.strides()[1],
                out.data<bf16>(), out.strides()[0], out.strides()[1],
                d_slots.data<int32_t>(), reinterpret_cast<const int4*>(d_tiles.raw()),
                int(q.size(1) / k_cache.size(1)), scale * float(M_LOG2E)};
  dim3 grid(unsigned(tiles.size() / 4), unsigned(q.size(1)));
  flash_prefill_kernel<<<grid, 128, 0, stream()>>>(p);
  MS_CUDA_LAUNCHED("flash_prefill_kernel");
}

}  // namespace ms::cuda
