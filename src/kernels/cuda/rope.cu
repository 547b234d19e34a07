// Rotary embedding fused with the KV-cache write, one launch per attention layer (the decode
// step's q rope, k rope and cache copies were four or five small launches before).
//   GQA: a warp per (token, head) over the Hq query heads and the Hkv key heads of every token:
//        a query warp ropes its head in place; a key warp ropes the key head into its cache slot
//        with the unrotated dims, and copies the value head into the value cache. Qwen3's
//        per-head q/k RMSNorm runs in the same warp before the rope (a warp reduction). Prefill
//        batches of 128-dim NeoX heads take rope_store_kv_x8_kernel instead: 16 lanes a head,
//        16-byte accesses, several heads a half-warp (see there).
//   MLA: a grid of [tokens, 1 + query-head blocks]: block (t, 0) writes token t's cache row
//        (RMSNorm of the latent, a block reduction; warp 0 ropes the key part of the kv_a row),
//        blocks (t, 1..) rope q's rope dims, a warp a head. Prefill batches of BF16 rows take
//        mla_rope_store_x8_kernel instead: 16-byte accesses, a warp a cache row (see there).
// At decode these kernels are a handful of warps, so their time is the chain of memory round
// trips, not bandwidth: every thread loads all it will need (its elements, the norm weights,
// the value head, the cos/sin row once the position is in) into registers first, and then only
// computes and stores. Loads placed after a store to memory that may alias them (in place, or
// through a second pointer) would each wait a round trip of their own.
// A head's registers, its norm and its roped stores: rope_head.cuh.
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/rope_head.cuh"

namespace ms::cuda {
namespace {

constexpr int kMaxValuePerLane = 8;   // value dims loaded with the key (the rest, if any, after)
constexpr int kHeadWarps = 4;         // warps a block of the GQA kernel: 36 heads are 9 blocks
constexpr int kWarps = 8;             // warps a block of the MLA kernel
constexpr int kMaxLatentPerThread = 4;  // latent width up to 1024

// Copies n elements by the lanes of a warp (rounded as above when asked): a load a lane and
// iteration, each after the previous store; for the rare widths past the register batches.
template <class T>
__device__ void copy_lanes(const T* src, T* dst, int n, bool round, int lane) {
  for (int i = lane; i < n; i += 32) store_f(dst + i, rounded(load_f(src + i), round));
}

struct Strided3 {  // a [T, H, D] view with contiguous head dims
  int64_t s0, s1;
};

template <class TW>
struct QkNormArgs {  // null weights: no per-head norm
  const TW* q;
  const TW* k;
  float eps;
};

// Register capacities of the GQA kernel: pairs, unrotated dims and value dims a lane.
template <int P, int TL, int VL>
struct GqaRegs {
  using Head = HeadRegs<P, TL>;
  using Rope = RopeRegs<P>;
  static constexpr int kValues = VL;
};
using GqaRegsWide = GqaRegs<kMaxPairsPerLane, kMaxTailPerLane, kMaxValuePerLane>;
// Heads of up to 128 dims with at least half of them rotary (Qwen, Llama): 40-odd registers
// instead of ~110, so an SM holds 4x the warps; a prefill of 8k tokens is ~300k head rows.
using GqaRegs128 = GqaRegs<2, 2, 4>;

template <class T, class TW, class RG>
__global__ void __launch_bounds__(kHeadWarps * 32)
    rope_store_kv_kernel(T* q, Strided3 qs, const T* k, Strided3 ks, const T* v, Strided3 vs, T* kc, Strided3 kcs,
                         T* vc, Strided3 vcs, int64_t tokens, int hq, int hkv, int D, int Dv, int half,
                         const int32_t* positions, const int32_t* slots, const float* cos, const float* sin,
                         bool interleaved, bool round, QkNormArgs<TW> norm) {
  const int64_t row = int64_t(blockIdx.x) * kHeadWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= tokens * (hq + hkv)) return;
  const int64_t t = row / (hq + hkv);
  const int h = int(row % (hq + hkv));
  const bool is_q = h < hq;
  const int kh = h - hq;
  pdl_trigger();  // the attention after this may launch; it waits for these writes
  // Every load first: what no kernel before this one writes (position, slot, norm weights) while
  // launched early, then the head and the value head; the cos/sin row (after the position)
  // overlaps the norm's reduction.
  const int pos = positions[t];
  const int64_t slot = is_q ? 0 : slots[t];
  typename RG::Head x, w;
  const TW* nw = is_q ? norm.q : norm.k;
  if (nw) load_head(nw, D, half, interleaved, lane, w);
  pdl_wait();  // q, k and v are the projection's, just computed
  const T* src = is_q ? q + t * qs.s0 + h * qs.s1 : k + t * ks.s0 + kh * ks.s1;
  load_head(src, D, half, interleaved, lane, x);
  const T* vsrc = v + t * vs.s0 + kh * vs.s1;
  float vr[RG::kValues];
  if (!is_q) {
#pragma unroll
    for (int j = 0; j < RG::kValues; ++j) vr[j] = lane + 32 * j < Dv ? load_f(vsrc + lane + 32 * j) : 0.f;
  }
  typename RG::Rope cs;
  load_cos_sin(cos + int64_t(pos) * half, sin + int64_t(pos) * half, half, lane, cs);
  if (nw) norm_head<T>(x, w, norm.eps, D, round);
  __syncwarp();  // in place: every lane has read its pairs before any lane writes (interleaved pairs cross lanes)
  if (is_q) {
    // q's unrotated dims change only when normalised or rounded.
    store_head(q + t * qs.s0 + h * qs.s1, x, cs, D, half, nw != nullptr || round, round, lane);
    return;
  }
  store_head(kc + slot * kcs.s0 + kh * kcs.s1, x, cs, D, half, true, round, lane);
  T* vdst = vc + slot * vcs.s0 + kh * vcs.s1;
#pragma unroll
  for (int j = 0; j < RG::kValues; ++j)
    if (lane + 32 * j < Dv) store_f(vdst + lane + 32 * j, vr[j]);
  const int done = 32 * RG::kValues;
  if (Dv > done) copy_lanes(vsrc + done, vdst + done, Dv - done, false, lane);
}

// The common GQA case at prefill sizes (BF16, heads of 128 dims, NeoX rope over all of them,
// values of 128): 16 lanes a head row, 16 bytes (dims 8l .. 8l + 7) a lane, and each half-warp
// takes kX8Heads heads of one token, copying all of them (and the value heads of its key rows)
// into shared memory with cp.async before computing. The kernel is a stream (~166 MB for an 8k
// Qwen3 layer), so what bounds it is the bytes in flight an SM: rope_store_kv_kernel, a warp a
// head row with 2-byte loads, kept ~512 bytes a warp and took 145 us a layer (~1.1 TB/s); 16-byte
// loads into registers, 4 heads a half-warp, took 81 us, with registers (98 a thread, 16 warps
// an SM) bounding them to ~32 KB an SM. Copies into shared memory cost no registers: each thread
// reads back only its own pieces (so no barrier), laid out [head][x or v][thread] so that a
// warp's 16-byte reads are conflict-free. A rotate-half partner (dim i +- 64) is lane l ^ 8 of
// the same half-warp, as the norm's sum is a reduction over the half-warp's 16 lanes.
constexpr int kX8Heads = 8, kX8Warps = 4;
constexpr int64_t kX8MinTokens = 16;

template <class TW>
__device__ __forceinline__ void load8_weights(const TW* w, int lane16, float f[8]) {
  load8(w + 8 * lane16, f);
}

template <class TW>
__global__ void __launch_bounds__(kX8Warps * 32)
    rope_store_kv_x8_kernel(bf16* q, Strided3 qs, const bf16* k, Strided3 ks, const bf16* v, Strided3 vs, bf16* kc,
                            Strided3 kcs, bf16* vc, Strided3 vcs, int64_t tokens, int hq, int hkv,
                            const int32_t* positions, const int32_t* slots, const float* cos, const float* sin,
                            QkNormArgs<TW> norm) {
  constexpr int kHalf = 64;
  const int heads = hq + hkv, chunks = (heads + kX8Heads - 1) / kX8Heads;
  const int64_t unit = (int64_t(blockIdx.x) * kX8Warps * 32 + threadIdx.x) / 16;  // (token, chunk of heads)
  const int lane16 = threadIdx.x % 16;
  // The shuffles name this half-warp's lanes only: the other half has its own unit, which may
  // have fewer heads or none.
  const unsigned half = 0xffffu << (threadIdx.x & 16);
  pdl_trigger();  // as in rope_store_kv_kernel
  if (unit >= tokens * chunks) return;
  const int64_t t = unit / chunks;
  const int h0 = int(unit % chunks) * kX8Heads;
  const int pos = positions[t];
  const int64_t slot = slots[t];
  float wq[8], wk[8], c[8], sn[8];
  if (norm.q) load8_weights(norm.q, lane16, wq), load8_weights(norm.k, lane16, wk);
  load8(cos + int64_t(pos) * kHalf + 8 * (lane16 % 8), c);
  load8(sin + int64_t(pos) * kHalf + 8 * (lane16 % 8), sn);
  __shared__ uint4 stage[kX8Heads][2][kX8Warps * 32];  // [head][x, v][thread]: 32 KB
  pdl_wait();  // q, k and v are the projection's, just computed
#pragma unroll
  for (int u = 0; u < kX8Heads; ++u) {
    const int h = h0 + u;
    if (h >= heads) break;
    const bf16* src = h < hq ? q + t * qs.s0 + h * qs.s1 : k + t * ks.s0 + (h - hq) * ks.s1;
    cp_async16(&stage[u][0][threadIdx.x], src + 8 * lane16, true);
    if (h >= hq) cp_async16(&stage[u][1][threadIdx.x], v + t * vs.s0 + (h - hq) * vs.s1 + 8 * lane16, true);
  }
  cp_async_commit();
  cp_async_wait<0>();
  const bool low = lane16 < 8;  // dims below 64: out = a c - b s; else out = b c + a s
#pragma unroll
  for (int u = 0; u < kX8Heads; ++u) {
    const int h = h0 + u;
    if (h >= heads) break;  // uniform over the half-warp
    const bool is_q = h < hq;
    float f[8];
    unpack8(stage[u][0][threadIdx.x], f);
    if (norm.q) {
      float ss = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
      for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(half, ss, o, 16);
      const float inv = 1.0f / sqrtf(ss / 128.f + norm.eps);
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = as_stored<bf16>(f[j] * inv * (is_q ? wq[j] : wk[j]), false);
    }
    float other[8], out[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) other[j] = __shfl_xor_sync(half, f[j], 8, 16);
#pragma unroll
    for (int j = 0; j < 8; ++j) out[j] = low ? f[j] * c[j] - other[j] * sn[j] : f[j] * c[j] + other[j] * sn[j];
    if (is_q) {
      store8(q + t * qs.s0 + h * qs.s1 + 8 * lane16, out);
    } else {
      store8(kc + slot * kcs.s0 + (h - hq) * kcs.s1 + 8 * lane16, out);
      *reinterpret_cast<uint4*>(vc + slot * vcs.s0 + (h - hq) * vcs.s1 + 8 * lane16) = stage[u][1][threadIdx.x];
    }
  }
}

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += shared[w];
  return total;
}

// q [T, H, nope + R] roped at dims [qoff, qoff + R); kv rows [L + R] -> cache rows.
template <class T, class TW>
__global__ void __launch_bounds__(kWarps * 32)
    mla_rope_store_kernel(T* q, Strided3 qs, int heads, int qoff, const T* kv, int64_t kvs, const TW* norm_w,
                          float eps, int L, T* cache, int64_t cs, int half, const int32_t* positions,
                          const int32_t* slots, const float* cos, const float* sin, bool interleaved, bool round) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x % 32;
  pdl_trigger();  // as in rope_store_kv_kernel
  const int pos = positions[t];
  RopeRegs<> r;
  HeadRegs<> x;
  if (blockIdx.y > 0) {
    const int h = (int(blockIdx.y) - 1) * kWarps + int(threadIdx.x) / 32;
    if (h >= heads) return;
    pdl_wait();  // q and kv are the projections', just computed
    T* head = q + t * qs.s0 + h * qs.s1;
    load_head(head + qoff, 2 * half, half, interleaved, lane, x);
    load_cos_sin(cos + int64_t(pos) * half, sin + int64_t(pos) * half, half, lane, r);
    __syncwarp();  // in place, as above
    store_head(head + qoff, x, r, 2 * half, half, false, round, lane);
    if (round) copy_lanes(head, head, qoff, true, lane);
    return;
  }
  // The cache row: each thread's latent elements and weights, warp 0's rope pairs, all loaded
  // before the block's reduction; then only stores.
  __shared__ float partial[kWarps];
  const T* src = kv + t * kvs;
  const int64_t slot = slots[t];
  float lat[kMaxLatentPerThread], wl[kMaxLatentPerThread];
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kMaxLatentPerThread; ++j) {
    const int i = int(threadIdx.x) + j * kWarps * 32;
    wl[j] = i < L ? load_f(norm_w + i) : 0.f;
  }
  pdl_wait();
#pragma unroll
  for (int j = 0; j < kMaxLatentPerThread; ++j) {
    const int i = int(threadIdx.x) + j * kWarps * 32;
    lat[j] = i < L ? load_f(src + i) : 0.f;
  }
  const bool roper = threadIdx.x < 32;
  if (roper) {
    load_head(src + L, 2 * half, half, interleaved, lane, x);
    load_cos_sin(cos + int64_t(pos) * half, sin + int64_t(pos) * half, half, lane, r);
  }
#pragma unroll
  for (int j = 0; j < kMaxLatentPerThread; ++j) ss += lat[j] * lat[j];
  const float inv = 1.0f / sqrtf(block_sum(ss, partial) / float(L) + eps);
  T* dst = cache + slot * cs;
#pragma unroll
  for (int j = 0; j < kMaxLatentPerThread; ++j) {
    const int i = int(threadIdx.x) + j * kWarps * 32;
    if (i < L) store_f(dst + i, rounded(lat[j] * inv * wl[j], round));
  }
  if (roper) store_head(dst + L, x, r, 2 * half, half, false, round, lane);
}

// MLA at prefill sizes (BF16 rows with 16-byte aligned pieces): the stream of a layer is small
// (V2-Lite, 8k tokens: q's rope dims 17 MB each way, kv rows 9.4 MB each way) but
// mla_rope_store_kernel moved it in 2-byte accesses, a block per token and cache row, and took
// ~100 us a layer (session 36's op trace: 0.925 ms over 9 layers), where the bytes take ~13 us.
// Here every access is 16 bytes:
//   blocks [0, kv_blocks): a warp a token's cache row; lane l holds latent pieces l + 32j (8 dims
//        each; their norm weights, the same for every row, are read from L1 after the sum of
//        squares, which is a warp reduction, to keep registers for occupancy), and lanes below
//        half / 8 rope 8 pairs each of the kv_a row's rope part.
//   the other blocks: a thread 8 pairs of one q head (half / 8 threads a head, a power of two, so
//        a head's threads share a warp and __syncwarp orders their in-place reads before writes:
//        interleaved pairs are written de-interleaved, across the threads' pieces).
// Pairs as in rope_head.cuh: (2i, 2i + 1) interleaved, else (i, i + half); results at i, i + half.
constexpr int kMlaX8Threads = 256, kMlaX8MaxLatentPieces = 2;  // latent up to 32 x 8 x 2 = 512 (DeepSeek's)
constexpr int64_t kMlaX8MinTokens = 16;

// Pairs 8u .. 8u + 7 of a rotary part at src: a[j] is the pair's first, b[j] its second.
__device__ __forceinline__ void load_pairs8(const bf16* src, int u, int half, bool interleaved, float a[8],
                                            float b[8]) {
  if (interleaved) {
    float lo[8], hi[8];
    load8(src + 16 * u, lo);
    load8(src + 16 * u + 8, hi);
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = lo[2 * j], b[j] = lo[2 * j + 1], a[4 + j] = hi[2 * j], b[4 + j] = hi[2 * j + 1];
  } else {
    load8(src + 8 * u, a);
    load8(src + half + 8 * u, b);
  }
}
__device__ __forceinline__ void store_pairs8(bf16* dst, int u, int half, const float a[8], const float b[8],
                                             const float c[8], const float s[8]) {
  float lo[8], hi[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) lo[j] = a[j] * c[j] - b[j] * s[j], hi[j] = b[j] * c[j] + a[j] * s[j];
  store8(dst + 8 * u, lo);
  store8(dst + half + 8 * u, hi);
}

template <class TW>
__global__ void __launch_bounds__(kMlaX8Threads, 4)  // q's threads need few registers: 8 warps more an SM
    mla_rope_store_x8_kernel(bf16* q, Strided3 qs, int heads, int qoff, const bf16* kv, int64_t kvs,
                             const TW* norm_w, float eps, int L, bf16* cache, int64_t cs, int half, int64_t tokens,
                             unsigned kv_blocks, const int32_t* positions, const int32_t* slots, const float* cos,
                             const float* sin, bool interleaved) {
  pdl_trigger();  // as in rope_store_kv_kernel
  const int per_head = half / 8, lane = threadIdx.x % 32;
  float a[8], b[8], c[8], s[8];
  if (blockIdx.x < kv_blocks) {
    const int64_t t = int64_t(blockIdx.x) * (kMlaX8Threads / 32) + threadIdx.x / 32;
    if (t >= tokens) return;  // a whole warp
    const bool roper = lane < per_head;
    const int64_t row_pos = int64_t(positions[t]) * half;
    const int64_t slot = slots[t];
    float x[kMlaX8MaxLatentPieces][8];
    if (roper) load8(cos + row_pos + 8 * lane, c), load8(sin + row_pos + 8 * lane, s);
    pdl_wait();  // the kv_a row is the projection's, just computed
    const bf16* src = kv + t * kvs;
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kMlaX8MaxLatentPieces; ++j) {
      if (8 * (lane + 32 * j) >= L) break;
      load8(src + 8 * (lane + 32 * j), x[j]);
    }
    if (roper) load_pairs8(src + L, lane, half, interleaved, a, b);
#pragma unroll
    for (int j = 0; j < kMlaX8MaxLatentPieces; ++j) {
      if (8 * (lane + 32 * j) >= L) break;
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += x[j][i] * x[j][i];
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / float(L) + eps);
    bf16* dst = cache + slot * cs;
#pragma unroll
    for (int j = 0; j < kMlaX8MaxLatentPieces; ++j) {
      if (8 * (lane + 32 * j) >= L) break;
      float w[8];  // the same for every token: an L1 hit after the first
      load8(norm_w + 8 * (lane + 32 * j), w);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[j][i] = x[j][i] * inv * w[i];
      store8(dst + 8 * (lane + 32 * j), x[j]);
    }
    if (roper) store_pairs8(dst + L, lane, half, a, b, c, s);
    return;
  }
  const int64_t per_token = int64_t(heads) * per_head;
  const int64_t unit = int64_t(blockIdx.x - kv_blocks) * kMlaX8Threads + threadIdx.x;
  const bool live = unit < tokens * per_token;  // every lane reaches the __syncwarp
  const int64_t t = live ? unit / per_token : 0;
  const int h = int(unit % per_token) / per_head, u = int(unit % per_head);
  bf16* head = q + t * qs.s0 + int64_t(h) * qs.s1 + qoff;
  if (live) {
    const int64_t row_pos = int64_t(positions[t]) * half;
    load8(cos + row_pos + 8 * u, c), load8(sin + row_pos + 8 * u, s);
  }
  pdl_wait();  // q is the projection's, just computed
  if (live) load_pairs8(head, u, half, interleaved, a, b);
  __syncwarp();  // in place: the head's threads have read their pairs before any writes
  if (live) store_pairs8(head, u, half, a, b, c, s);
}

Strided3 strided3(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.device() == Device::CUDA && t.dim() == 3 && t.strides()[2] == 1, op, ": ", what, " ", t.describe(),
           " must be a CUDA [T, H, D] tensor with contiguous head dims");
  return {t.strides()[0], t.strides()[1]};
}

}  // namespace

void check_rope(const char* op, const ops::RopeArgs& r, int64_t tokens, int64_t width,
                std::span<const int32_t> slots, int64_t num_slots) {
  const int half = r.rot_dim / 2;
  MS_CHECK(r.rot_dim > 0 && r.rot_dim % 2 == 0 && r.rot_dim <= width && r.cos.size(1) == half &&
               half <= 32 * kMaxPairsPerLane,
           op, ": rot_dim ", r.rot_dim, " for heads of ", width, " with a table of ", r.cos.describe());
  check_device_tensor(r.cos, {DType::F32}, op, "cos table");
  check_device_tensor(r.sin, {DType::F32}, op, "sin table");
  MS_CHECK(r.cos.is_contiguous() && r.sin.is_contiguous() && r.sin.shape() == r.cos.shape(), op,
           ": rope tables must be contiguous and alike");
  MS_CHECK(int64_t(r.positions.size()) == tokens && int64_t(slots.size()) == tokens, op, ": ", tokens, " tokens, ",
           r.positions.size(), " positions, ", slots.size(), " slots");
  for (int32_t p : r.positions)
    MS_CHECK(p >= 0 && p < r.cos.size(0), "position ", p, " is beyond the rope table (max_position_embeddings ",
             r.cos.size(0), ")");
  for (int32_t s : slots) MS_CHECK(s >= 0 && s < num_slots, "KV slot ", s, " outside 0..", num_slots - 1);
}

namespace {

// Whether rope_store_kv_x8_kernel takes the call: BF16 heads of 128 dims with a NeoX rope over all
// of them, values of 128, 16-byte aligned rows and heads, a batch of more than a few tokens (at
// decode sizes the one-warp kernel has fewer round trips in series: see the header), and not
// turned off (MOESERVE_ROPE_X8=0, read per call, so a test can compare both kernels).
bool x8_takes(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& kc, const Tensor& vc,
              const ops::RopeArgs& r, const ops::HeadNorm* qk_norm) {
  const char* env = std::getenv("MOESERVE_ROPE_X8");
  if (env && std::string_view(env) == "0") return false;
  auto rows_ok = [](const Tensor& t) {
    return aligned16(t.raw(), t.strides()[0] * 2) && t.strides()[1] % 8 == 0;
  };
  return q.dtype() == DType::BF16 && q.size(0) >= kX8MinTokens && q.size(2) == 128 && v.size(2) == 128 &&
         r.rot_dim == 128 && !r.interleaved && rows_ok(q) && rows_ok(k) && rows_ok(v) && rows_ok(kc) && rows_ok(vc) &&
         (!qk_norm || (qk_norm->q.is_contiguous() && qk_norm->k.is_contiguous()));
}

// Whether mla_rope_store_x8_kernel takes the call: BF16 q, kv and cache with 16-byte aligned
// rows, heads, parts and cos/sin tables (q's rope dims at a multiple of 8, a latent of a multiple
// of 8 up to 512), half / 8 threads a head a power of two up to 32, a batch of more than a few tokens, and
// not turned off (MOESERVE_MLA_ROPE_X8=0, read per call, so a test can compare both kernels).
bool mla_x8_takes(const Tensor& q, const Tensor& kv, const Tensor& norm, const Tensor& cache, const ops::RopeArgs& r,
                  int L) {
  const char* env = std::getenv("MOESERVE_MLA_ROPE_X8");
  if (env && std::string_view(env) == "0") return false;
  const int half = r.rot_dim / 2, per_head = half / 8;
  const int64_t qoff = q.size(2) - 2 * half;
  return q.dtype() == DType::BF16 && kv.dtype() == DType::BF16 && cache.dtype() == DType::BF16 &&
         q.size(0) >= kMlaX8MinTokens && half % 8 == 0 && (per_head & (per_head - 1)) == 0 && per_head <= 32 &&
         L % 8 == 0 && L <= 32 * 8 * kMlaX8MaxLatentPieces && qoff % 8 == 0 && aligned16(q.raw(), q.strides()[0] * 2) &&
         q.strides()[1] % 8 == 0 && aligned16(kv.raw(), kv.strides()[0] * 2) &&
         aligned16(cache.raw(), cache.strides()[0] * 2) && aligned16(norm.raw(), 0) && aligned16(r.cos.raw(), 0) &&
         aligned16(r.sin.raw(), 0);
}

}  // namespace

void rope_store_kv(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& r,
                   std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                   const ops::HeadNorm* qk_norm) {
  const char* op = "rope_store_kv";
  const Strided3 qs = strided3(q, op, "q"), ks = strided3(k, op, "k"), vs = strided3(v, op, "v");
  const Strided3 kcs = strided3(k_cache, op, "key cache"), vcs = strided3(v_cache, op, "value cache");
  const int64_t T = q.size(0), D = q.size(2), Dv = v.size(2);
  MS_CHECK(k.size(0) == T && v.size(0) == T && k.size(2) == D && v.size(1) == k.size(1) &&
               k_cache.size(1) == k.size(1) && k_cache.size(2) == D && v_cache.size(1) == k.size(1) &&
               v_cache.size(2) == Dv && k_cache.size(0) == v_cache.size(0),
           op, ": q ", q.describe(), ", k ", k.describe(), ", v ", v.describe(), " into ", k_cache.describe(), " / ",
           v_cache.describe());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&k, &v, &k_cache, &v_cache})
    MS_CHECK(t->dtype() == q.dtype(), op, ": ", t->describe(), " is not ", dtype_name(q.dtype()), " as q is");
  check_rope(op, r, T, D, slots, k_cache.size(0));
  MS_CHECK(D - r.rot_dim <= 32 * kMaxTailPerLane, op, ": ", D - r.rot_dim, " unrotated dims of a head exceed ",
           32 * kMaxTailPerLane);
  if (qk_norm) {
    for (const Tensor* w : {&qk_norm->q, &qk_norm->k}) {
      check_device_tensor(*w, {DType::BF16, DType::F32}, op, "q/k norm weight");
      MS_CHECK(w->is_contiguous() && w->numel() == D && w->dtype() == qk_norm->q.dtype(), op, ": q/k norm weights ",
               qk_norm->q.describe(), ", ", qk_norm->k.describe(), " for heads of ", D);
    }
  }
  const int hq = int(q.size(1)), hkv = int(k.size(1));
  if (T == 0) return;
  Tensor pos = upload_i32(r.positions), sl = upload_i32(slots);
  const bool round = round_bf16 && q.dtype() == DType::F32;
  if (x8_takes(q, k, v, k_cache, v_cache, r, qk_norm)) {
    MS_FLOAT_DISPATCH(qk_norm ? qk_norm->q.dtype() : DType::F32, TW, {
      const QkNormArgs<TW> norm{qk_norm ? qk_norm->q.data<TW>() : nullptr, qk_norm ? qk_norm->k.data<TW>() : nullptr,
                                qk_norm ? qk_norm->eps : 0.f};
      const int64_t units = T * ((hq + hkv + kX8Heads - 1) / kX8Heads);
      launch_pdl(rope_store_kv_x8_kernel<TW>, dim3(unsigned((units * 16 + kX8Warps * 32 - 1) / (kX8Warps * 32))),
                 dim3(kX8Warps * 32), 0, q.data<bf16>(), qs, k.data<bf16>(), ks, v.data<bf16>(), vs,
                 k_cache.data<bf16>(), kcs, v_cache.data<bf16>(), vcs, T, hq, hkv, pos.data<int32_t>(),
                 sl.data<int32_t>(), r.cos.data<float>(), r.sin.data<float>(), norm);
    });
    MS_CUDA_LAUNCHED("rope_store_kv_x8_kernel");
    return;
  }
  const bool narrow = r.rot_dim / 2 <= 32 * 2 && D - r.rot_dim <= 32 * 2 && Dv <= 32 * 4;
  MS_FLOAT_DISPATCH(q.dtype(), TX, MS_FLOAT_DISPATCH(qk_norm ? qk_norm->q.dtype() : DType::F32, TW, {
    const QkNormArgs<TW> norm{qk_norm ? qk_norm->q.data<TW>() : nullptr, qk_norm ? qk_norm->k.data<TW>() : nullptr,
                              qk_norm ? qk_norm->eps : 0.f};
    auto kernel = narrow ? rope_store_kv_kernel<TX, TW, GqaRegs128> : rope_store_kv_kernel<TX, TW, GqaRegsWide>;
    launch_pdl(kernel, dim3(blocks_for(T * (hq + hkv), kHeadWarps)), dim3(kHeadWarps * 32), 0,
               q.data<TX>(), qs, k.data<TX>(), ks, v.data<TX>(), vs, k_cache.data<TX>(), kcs, v_cache.data<TX>(),
               vcs, T, hq, hkv, int(D), int(Dv), r.rot_dim / 2, pos.data<int32_t>(), sl.data<int32_t>(),
               r.cos.data<float>(), r.sin.data<float>(), r.interleaved, round, norm);
  }));
  MS_CUDA_LAUNCHED("rope_store_kv_kernel");
}

void mla_rope_store(Tensor& q, const Tensor& kv, const Tensor& kv_norm, float eps, const ops::RopeArgs& r,
                    std::span<const int32_t> slots, bool round_bf16, Tensor& cache) {
  const char* op = "mla_rope_store";
  const Strided3 qs = strided3(q, op, "q");
  const int64_t T = q.size(0), R = r.rot_dim, L = kv.size(1) - R;
  MS_CHECK(kv.device() == Device::CUDA && kv.dim() == 2 && kv.strides()[1] == 1 && kv.size(0) == T && L > 0 &&
               cache.device() == Device::CUDA && cache.dim() == 2 && cache.strides()[1] == 1 &&
               cache.size(1) == L + R && kv.dtype() == q.dtype() && cache.dtype() == q.dtype(),
           op, ": q ", q.describe(), ", kv ", kv.describe(), " into ", cache.describe(), " with rot_dim ", R);
  check_device_tensor(kv_norm, {DType::BF16, DType::F32}, op, "latent norm weight");
  MS_CHECK(kv_norm.is_contiguous() && kv_norm.numel() == L, op, ": latent norm ", kv_norm.describe(), " for ", L,
           " columns");
  check_rope(op, r, T, q.size(2), slots, cache.size(0));
  MS_CHECK(L <= kWarps * 32 * kMaxLatentPerThread, op, ": latent of ", L, " exceeds ", kWarps * 32 * kMaxLatentPerThread);
  if (T == 0) return;
  Tensor pos = upload_i32(r.positions), sl = upload_i32(slots);
  const bool round = round_bf16 && q.dtype() == DType::F32;
  const int heads = int(q.size(1));
  if (mla_x8_takes(q, kv, kv_norm, cache, r, int(L))) {
    const unsigned kv_blocks = blocks_for(T, kMlaX8Threads / 32);
    const int64_t q_units = T * heads * (R / 16);
    MS_FLOAT_DISPATCH(kv_norm.dtype(), TW,
      launch_pdl(mla_rope_store_x8_kernel<TW>, dim3(kv_blocks + blocks_for(q_units, kMlaX8Threads)),
                 dim3(kMlaX8Threads), 0, q.data<bf16>(), qs, heads, int(q.size(2) - R), kv.data<bf16>(),
                 kv.strides()[0], kv_norm.data<TW>(), eps, int(L), cache.data<bf16>(), cache.strides()[0],
                 int(R / 2), T, kv_blocks, pos.data<int32_t>(), sl.data<int32_t>(), r.cos.data<float>(),
                 r.sin.data<float>(), r.interleaved));
    MS_CUDA_LAUNCHED("mla_rope_store_x8_kernel");
    return;
  }
  const dim3 grid(unsigned(T), 1u + unsigned((heads + kWarps - 1) / kWarps));
  MS_FLOAT_DISPATCH(q.dtype(), TX, MS_FLOAT_DISPATCH(kv_norm.dtype(), TW,
    launch_pdl(mla_rope_store_kernel<TX, TW>, grid, dim3(kWarps * 32), 0, q.data<TX>(), qs, heads,
               int(q.size(2) - R), kv.data<TX>(), kv.strides()[0], kv_norm.data<TW>(), eps, int(L),
               cache.data<TX>(), cache.strides()[0], int(R / 2), pos.data<int32_t>(), sl.data<int32_t>(),
               r.cos.data<float>(), r.sin.data<float>(), r.interleaved, round)));
  MS_CUDA_LAUNCHED("mla_rope_store_kernel");
}

}  // namespace ms::cuda
