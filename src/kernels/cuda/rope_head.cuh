// A rotary head in a warp's registers: the rope kernels' loads, per-head RMSNorm and roped
// stores (rope.cu), shared with the decode attention that ropes its own queries and new keys
// (flash_decode.cu), so that both compute the same bits.
// A rope lane owns pairs i = lane + 32p: (2i, 2i + 1) interleaved, else (i, i + half); the
// interleaved form writes its result de-interleaved (i, i + half). With F32 tensors and `round`,
// what a bf16 store would round is rounded (the CPU's bf16 emulation); BF16 stores round by
// themselves.
#pragma once
#include <span>
#include <type_traits>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// The table, positions and slots every fused rope checks on the host (the kernels trust them).
void check_rope(const char* op, const ops::RopeArgs& r, int64_t tokens, int64_t width,
                std::span<const int32_t> slots, int64_t num_slots);

constexpr int kMaxPairsPerLane = 8;  // rot_dim up to 512
constexpr int kMaxTailPerLane = 8;   // unrotated dims of a GQA head up to 256

__device__ __forceinline__ float rounded(float v, bool round) {
  return round ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// The value a store into T keeps: what the rope after a norm reads, as when the norm was its
// own op.
template <class T>
__device__ __forceinline__ float as_stored(float v, bool round) {
  if constexpr (std::is_same_v<T, bf16>) return __bfloat162float(__float2bfloat16_rn(v));
  else return rounded(v, round);
}

// A head in a lane's registers: its rope pairs and its unrotated dims 2 * half + lane + 32j
// (zeros past the head).
// P pairs and TL unrotated dims a lane at most: the kernels are instantiated per capacity, since
// unused slots still cost registers (the loops' bounds are run-time) and registers bound how many
// warps, i.e. how many memory round trips, an SM keeps in flight.
template <int P = kMaxPairsPerLane, int TL = kMaxTailPerLane>
struct HeadRegs {
  static constexpr int kPairs = P, kTail = TL;
  float a[P], b[P], tail[TL];
};

template <class T, class H>
__device__ __forceinline__ void load_head(const T* src, int D, int half, bool interleaved, int lane, H& r) {
#pragma unroll
  for (int p = 0; p < H::kPairs; ++p) {
    const int i = lane + 32 * p;
    r.a[p] = i < half ? load_f(src + (interleaved ? 2 * i : i)) : 0.f;
    r.b[p] = i < half ? load_f(src + (interleaved ? 2 * i + 1 : i + half)) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < H::kTail; ++j) {
    const int e = 2 * half + lane + 32 * j;
    r.tail[j] = e < D ? load_f(src + e) : 0.f;
  }
}

// The cos/sin of a lane's pairs at one position.
template <int P = kMaxPairsPerLane>
struct RopeRegs {
  static constexpr int kPairs = P;
  float c[P], s[P];
};

template <class R>
__device__ __forceinline__ void load_cos_sin(const float* c, const float* s, int half, int lane, R& r) {
#pragma unroll
  for (int p = 0; p < R::kPairs; ++p) {
    const int i = lane + 32 * p;
    r.c[p] = i < half ? c[i] : 0.f;
    r.s[p] = i < half ? s[i] : 0.f;
  }
}

// RMSNorm of a head held by a warp (weights w in the same layout), each value as stored.
template <class T, class H>
__device__ __forceinline__ void norm_head(H& x, const H& w, float eps, int D, bool round) {
  float ss = 0.f;
#pragma unroll
  for (int p = 0; p < H::kPairs; ++p) ss += x.a[p] * x.a[p] + x.b[p] * x.b[p];
#pragma unroll
  for (int j = 0; j < H::kTail; ++j) ss += x.tail[j] * x.tail[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
#pragma unroll
  for (int p = 0; p < H::kPairs; ++p)
    x.a[p] = as_stored<T>(x.a[p] * inv * w.a[p], round), x.b[p] = as_stored<T>(x.b[p] * inv * w.b[p], round);
#pragma unroll
  for (int j = 0; j < H::kTail; ++j) x.tail[j] = as_stored<T>(x.tail[j] * inv * w.tail[j], round);
}

// Stores the roped pairs at dst[i], dst[i + half], and the unrotated dims when asked.
template <class T, class H, class R>
__device__ __forceinline__ void store_head(T* dst, const H& x, const R& cs, int D, int half, bool tail, bool round,
                                           int lane) {
  static_assert(H::kPairs == R::kPairs);
#pragma unroll
  for (int p = 0; p < H::kPairs; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      store_f(dst + i, rounded(x.a[p] * cs.c[p] - x.b[p] * cs.s[p], round));
      store_f(dst + i + half, rounded(x.b[p] * cs.c[p] + x.a[p] * cs.s[p], round));
    }
  }
  if (!tail) return;
#pragma unroll
  for (int j = 0; j < H::kTail; ++j) {
    const int e = 2 * half + lane + 32 * j;
    if (e < D) store_f(dst + e, rounded(x.tail[j], round));
  }
}

}  // namespace ms::cuda
