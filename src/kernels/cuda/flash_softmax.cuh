// The per-key-tile step of flash-attention 2 on mma.m16n8k16, shared by both prefill kernels
// (flash_prefill.cu with 128-dim keys and values, flash_mla_expanded.cu with 192-dim keys and
// 128-dim values): one copy of the score product, the online softmax and P V. A warp owns 16
// query rows; a lane holds rows g = lane / 4 (fragment values 0, 1) and g + 8 (values 2, 3), and
// the quad of lanes that shares a row reduces over shuffles. Everything is forceinline over
// compile-time shapes: both kernels keep the register counts and the instruction stream they had
// with the step written out in each.
#pragma once
#include <cmath>

#include "kernels/cuda/mma.h"

namespace ms::cuda {

// 2^x in one MUFU instruction; results below 2^-126 flush to zero, which a probability can lose.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The warp's Q fragments over DK dims, mma's A operand layout: this lane's rows row[0], row[1]
// (zero past `rows`) of the block's queries from q0, head h (strides q_s0, q_s1).
template <int DK>
__device__ __forceinline__ void flash_load_q(const bf16* q, int64_t q_s0, int64_t q_s1, int q0, int h,
                                             const int (&row)[2], int rows, int qd, uint32_t (&qf)[DK / 16][4]) {
#pragma unroll
  for (int s = 0; s < DK / 16; ++s)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = row[i & 1], d = s * 16 + 2 * qd + (i >> 1) * 8;
      qf[s][i] = r < rows ? *reinterpret_cast<const uint32_t*>(q + int64_t(q0 + r) * q_s0 + h * q_s1 + d) : 0u;
    }
}

// s = Q K^T for a tile of KEYS keys, [key][KSTRIDE] bf16 rows in shared memory, from the warp's
// Q fragments over DK dims.
template <int KEYS, int DK, int KSTRIDE>
__device__ __forceinline__ void flash_scores(const uint32_t (&qf)[DK / 16][4], const bf16* ks, int lane,
                                             float (&s)[KEYS / 8][4]) {
#pragma unroll
  for (int d = 0; d < DK / 16; ++d)
#pragma unroll
    for (int np = 0; np < KEYS / 16; ++np) {
      uint32_t b[4];
      ldmatrix_x4<false>(ks + (np * 16 + (lane / 16) * 8 + lane % 8) * KSTRIDE + d * 16 + ((lane / 8) % 2) * 8, b);
      mma_bf16(s[2 * np], qf[d], b[0], b[1]);
      mma_bf16(s[2 * np + 1], qf[d], b[2], b[3]);
    }
}

// Each of the lane's two rows of s reduced by op (fmaxf, or a sum) in four independent chains
// (row r's values i = 2 r + (c & 1) of the column groups n = c / 2 mod 2), joined pairwise.
template <int KEYS, class Op>
__device__ __forceinline__ void flash_reduce_rows(const float (&s)[KEYS / 8][4], Op op, float (&out)[2]) {
  static_assert(KEYS % 16 == 0, "two column groups a chain");
  float part[2][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c) part[r][c] = s[c >> 1][2 * r + (c & 1)];
#pragma unroll
  for (int n = 2; n < KEYS / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float& chain = part[i >> 1][(n & 1) * 2 + (i & 1)];
      chain = op(chain, s[n][i]);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) out[r] = op(op(part[r][0], part[r][1]), op(part[r][2], part[r][3]));
}

// The online softmax of a tile: turns the scores s of keys [k0, k0 + KEYS) into probabilities
// (unnormalized, against the new running max m; base 2 with the scale folded in) and adds them
// to the running sum l; the output must then be rescaled by alpha (the old max's factor). On a
// diagonal tile a row's keys from seen[row] on drop out (causality, or past the sequence). Also
// the wgmma kernels': their accumulators have this fragment layout.
// Instruction count and dependency depth matter here (Nsight, session 37: the softmax is most of
// a prefill consumer's issue slots): the max is taken of the raw scores (scale_log2 > 0, so it
// commutes) and the scale folded into each exponential's FFMA, and the row max and sum run as four
// independent chains a row, not one chain of KEYS / 4.
template <int KEYS>
__device__ __forceinline__ void flash_softmax_probs(float (&s)[KEYS / 8][4], bool diagonal, int k0,
                                                    const int (&seen)[2], float scale_log2, int lane, float (&m)[2],
                                                    float (&l)[2], float (&alpha)[2]) {
  const int qd = lane % 4;
  if (diagonal) {
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + n * 8 + 2 * qd + (i & 1);
        if (key >= seen[i >> 1]) s[n][i] = -INFINITY;
      }
  }
  float tile_max[2], row_sum[2];
  flash_reduce_rows<KEYS>(s, [](float a, float b) { return fmaxf(a, b); }, tile_max);
  float neg_m[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
    tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
    const float m_new = fmaxf(m[r], tile_max[r] * scale_log2);  // finite: key 0 is in the first tile of every row
    alpha[r] = exp2_ftz(m[r] - m_new);
    m[r] = m_new;
    neg_m[r] = -m_new;
  }
#pragma unroll
  for (int n = 0; n < KEYS / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = exp2_ftz(fmaf(s[n][i], scale_log2, neg_m[i >> 1]));
  flash_reduce_rows<KEYS>(s, [](float a, float b) { return a + b; }, row_sum);
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + row_sum[r];
}

// The output's rows (DV dims) rescaled by alpha, to the new running max.
template <int DV>
__device__ __forceinline__ void flash_rescale(float (&o)[DV / 8][4], const float (&alpha)[2]) {
#pragma unroll
  for (int n = 0; n < DV / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[n][i] *= alpha[i >> 1];
}

// P's keys [16 kk, 16 kk + 16) as the A operand of an m16n8k16 product: accumulator columns
// 2 qd, + 1 of key groups 2 kk and 2 kk + 1 are A's columns 2 qd, + 1 and 8 + 2 qd, + 1, row for
// row, so P goes from the score accumulators to the A operand without leaving registers.
template <int KEYS>
__device__ __forceinline__ void flash_p_fragment(const float (&s)[KEYS / 8][4], int kk, uint32_t (&a)[4]) {
  a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// The online softmax of the scores s (above), o rescaled, then o += P V with V rows [key][VSTRIDE] in
// shared memory.
template <int KEYS, int DV, int VSTRIDE>
__device__ __forceinline__ void flash_softmax_pv(float (&s)[KEYS / 8][4], bool diagonal, int k0, const int (&seen)[2],
                                                 float scale_log2, const bf16* vs, int lane, float (&m)[2],
                                                 float (&l)[2], float (&o)[DV / 8][4]) {
  float alpha[2];
  flash_softmax_probs<KEYS>(s, diagonal, k0, seen, scale_log2, lane, m, l, alpha);
  flash_rescale<DV>(o, alpha);
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
    uint32_t a[4];
    flash_p_fragment<KEYS>(s, kk, a);
#pragma unroll
    for (int dn = 0; dn < DV / 16; ++dn) {
      uint32_t b[4];
      ldmatrix_x4<true>(vs + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * VSTRIDE + dn * 16 + (lane / 16) * 8, b);
      mma_bf16(o[2 * dn], a, b[0], b[1]);
      mma_bf16(o[2 * dn + 1], a, b[2], b[3]);
    }
  }
}

// o / l in bf16 for the lane's rows below rows; dst_of(r) points at the lane's column pair
// 2 * (lane % 4) of row r's DV outputs. A callable, not a pointer, so that the address math runs
// after the shuffles, where the kernels scheduled it before.
template <int DV, class Dst>
__device__ __forceinline__ void flash_store_rows(const float (&o)[DV / 8][4], float (&l)[2], const int (&row)[2],
                                                 int rows, Dst dst_of) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= rows) continue;
    const float inv = 1.0f / l[r];
    bf16* dst = dst_of(r);
#pragma unroll
    for (int n = 0; n < DV / 8; ++n)
      *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) = __floats2bfloat162_rn(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
  }
}

}  // namespace ms::cuda
