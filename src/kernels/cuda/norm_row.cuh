// RMSNorm of bf16 rows by groups of threads, a 16-byte piece a thread, with what may be added to
// a row first (a bf16 row; a MoE block's output, from its experts' rows or already summed). Two
// kernels run it: norm.cu's rms_norm_rows_kernel, and moe_one_token.cu's batch-1 experts kernel,
// whose last block norms the layer's output itself; one body keeps the two bit for bit alike.
#pragma once
#include <type_traits>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

constexpr int kNormPieces = 2;       // 16-byte pieces a thread, at most
constexpr int kNormMaxGroup = 1024;  // threads a row, at most: widths up to 16384

// Threads that norm a row of `width`: the smallest power of two with a piece each, at most max_group.
inline int norm_group(int64_t width, int max_group) {
  int group = 1;
  while (group < max_group && group < width / 8) group *= 2;
  return group;
}

// What norm_row adds to x: piece c (8 columns) of row t, as f32. kMaxGroup: the most threads a
// row (the launch bound, so the registers a thread may use).
struct NoAddend {
  static constexpr int kMaxGroup = kNormMaxGroup;
};
struct RowAddend {  // rows of a bf16 tensor
  static constexpr int kMaxGroup = kNormMaxGroup;
  const bf16* y;
  int64_t ys;
  __device__ void operator()(int64_t t, int c, float a[8]) const {
    unpack8(reinterpret_cast<const uint4*>(y + t * ys)[c], a);
  }
};
// Eight values of a bf16 or f32 row as raw bytes, and back to f32 (a piece in flight in registers).
struct Raw8 {
  uint4 lo, hi;  // hi: f32 only
};
__device__ __forceinline__ Raw8 load16(const bf16* p) { return {*reinterpret_cast<const uint4*>(p), {}}; }
__device__ __forceinline__ Raw8 load16(const float* p) {
  return {reinterpret_cast<const uint4*>(p)[0], reinterpret_cast<const uint4*>(p)[1]};
}
template <class TY>
__device__ __forceinline__ void unpack16(const Raw8& r, float v[8]) {
  if constexpr (std::is_same_v<TY, bf16>) {
    unpack8(r.lo, v);
  } else {
    const uint32_t u[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(u[i]);
  }
}

// The last steps of a MoE block's output as the unfused ops leave it in bf16: the routed sum
// (f32) rounded to bf16; then, with a shared expert, add_inplace (f + s) or add_sigmoid_gated
// (fmaf(g, s, f), g = 1 / (1 + expf(-gate)) written as that kernel writes it), rounded again.
struct SharedExpertTail {
  const bf16* shared;  // null: no shared expert
  int64_t ss;
  const bf16* gate;  // null: added ungated
  int64_t gs;
  __device__ void operator()(int64_t t, int c, const float routed[8], float a[8]) const {
    unpack8(pack8(routed), a);
    if (!shared) return;
    float s[8];
    unpack8(reinterpret_cast<const uint4*>(shared + t * ss)[c], s);
    if (gate) {
      const float g = 1.0f / (1.0f + expf(-load_f(gate + t * gs)));
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = fmaf(g, s[i], a[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] += s[i];
    }
    unpack8(pack8(a), a);
  }
};

// A MoE block's output from its experts' rows: combine_expert_rows's f32 sum over slots j in
// order of weights[t, j] * rows[row_of[t, j]] (rows -1 skipped; fmaf is the contraction nvcc
// makes of its acc += w * v), then the tail.
// BATCH slots' row numbers, then all their pieces, are loaded before the first is summed: in a
// prefill the pieces are ~90 % of the bytes a norm moves, and one slot's row number, piece and
// sum in series each was a round trip a slot (8k Qwen3 tokens: ~2.9 TB/s). Rows up to 4096 wide
// take groups of up to 512 threads, whose bound leaves 128 registers for 8 pieces in flight;
// wider ones (DeepSeek-V3's 7168) keep add_rms_norm's 1024-thread groups, so that the sum of
// squares adds up in the same order and the norm's bits match, a slot at a time (64 registers).
template <class TY, int BATCH, int MAX_GROUP>
struct MoeAddend {
  static constexpr int kMaxGroup = MAX_GROUP, kBatch = BATCH;
  const TY* rows;
  const int32_t* row_of;
  const float* weights;
  int K;
  int64_t H;
  SharedExpertTail tail;
  __device__ void operator()(int64_t t, int c, float a[8]) const {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j0 = 0; j0 < K; j0 += kBatch) {
      int32_t r[kBatch];
      float w[kBatch];
      Raw8 raw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        r[j] = j0 + j < K ? row_of[t * K + j0 + j] : -1;
        w[j] = j0 + j < K ? weights[t * K + j0 + j] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (r[j] >= 0) raw[j] = load16(rows + int64_t(r[j]) * H + c * 8);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {  // slots in order: the combine's sum, bit for bit
        if (r[j] < 0) continue;
        float v[8];
        unpack16<TY>(raw[j], v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(w[j], v[i], acc[i]);
      }
    }
    tail(t, c, acc, a);
  }
};

// A MoE block's output whose routed sum is already made (f32 rows [T, H], MoeAddend's sum bit for
// bit), then the tail. Read through L2: another block of the same kernel wrote it.
struct SummedAddend {
  static constexpr int kMaxGroup = 512;
  const float* sum;
  int64_t H;
  SharedExpertTail tail;
  __device__ void operator()(int64_t t, int c, float a[8]) const {
    const float4* p = reinterpret_cast<const float4*>(sum + t * H + c * 8);
    const float4 lo = __ldcg(p), hi = __ldcg(p + 1);
    const float acc[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    tail(t, c, acc, a);
  }
};

// Row `row` of x (bf16, width D a multiple of 8, 16-byte aligned rows and weight) normed into out
// by `group` threads (a power of two: a part of a warp for narrow rows such as per-head q/k
// norms, up to a whole block for wide ones); g is this thread's place in the group. Each thread
// keeps its 16-byte pieces (and their weights, loaded at once so both reads are in flight
// together) in registers from the sum of squares to the write, so a row is read once and in
// place is safe. With an addend y, a piece is x + y rounded to bf16, written back to x, and that
// rounded value is normalised, as rms_norm_kernel does. Every thread of the block calls it (the
// row's warps meet in warp_ss, 32 floats of shared memory); a thread past the last row with
// live false. PIECES: the 16-byte pieces a thread takes at most.
template <int PIECES, class TW, class Addend>
__device__ __forceinline__ void norm_row(bf16* x, int64_t xs, const Addend& y, const TW* w, float eps, int D,
                                         int64_t row, bool live, int g, int group, bf16* out, int64_t os,
                                         float* warp_ss) {
  const int n = D / 8;
  float v[PIECES][8], wt[PIECES][8], ss = 0.f;
#pragma unroll
  for (int i = 0; i < PIECES; ++i) {
    const int c = g + group * i;
    if (!live || c >= n) break;
    uint4* xp = reinterpret_cast<uint4*>(x + row * xs) + c;
    unpack8(*xp, v[i]);
    if constexpr (!std::is_same_v<Addend, NoAddend>) {
      float add[8];
      y(row, c, add);
#pragma unroll
      for (int j = 0; j < 8; ++j) add[j] += v[i][j];
      const uint4 sum = pack8(add);
      *xp = sum;
      unpack8(sum, v[i]);
    }
    load8(w + c * 8, wt[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
  }
  for (int o = min(group, 32) / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (group > 32) {  // the row's warps meet in shared memory
    if (threadIdx.x % 32 == 0) warp_ss[threadIdx.x / 32] = ss;
    __syncthreads();
    const int first = int(threadIdx.x) / group * (group / 32);
    ss = 0.f;
    for (int k = 0; k < group / 32; ++k) ss += warp_ss[first + k];
  }
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
#pragma unroll
  for (int i = 0; i < PIECES; ++i) {
    const int c = g + group * i;
    if (!live || c >= n) break;
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = v[i][j] * inv * wt[i][j];
    reinterpret_cast<uint4*>(out + row * os)[c] = pack8(o);
  }
}

}  // namespace ms::cuda
