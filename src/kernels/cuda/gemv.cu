// The weight-streaming product (gemv.h) on the tensor cores. The weight is the A operand of
// mma.m16n8k16 (16 output features a slab) and up to 8 input rows the B operand, so each weight
// element is loaded once, straight from global memory into registers, and every row of its group
// costs one more mma, not more loads. A block of S warps serves one slab of one group; warp s
// takes every S-th 64-wide chunk of K, and the S partial sums meet in shared memory.
//
// Fragment layout: a dot product does not care in which order k is summed, so each lane loads
// 16 consecutive k (two 16-byte bf16 loads, or one of fp8) of weight rows g and g + 8 and of input
// row g, and hands them to the mma as if they were the k it expects; A and B are permuted alike.
// FP8 codes are converted right before their mma, unscaled (e4m3x4_bf16: exact, three integer
// instructions a pair), and each row's block scale multiplies the chunk's f32 sums (a chunk of 64
// k lies in one scale block): a weight counts as float(e4m3) * scale, unrounded. A round in
// registers is the raw bytes, half BF16's, so an FP8 warp holds two rounds and asks for the next
// before converting this one. (Converted as they arrived, one round at a time, DeepSeek-V3's FP8
// products at batch 1 streamed at ~1 TB/s: BENCHMARKS, session 39.)
// (A block asking for all of its slab at once into shared memory instead, cp.async, then these
// mmas in this order, was measured and dropped: Qwen3's q|k|v 7.95 -> 8.32 us a layer, V2-Lite's
// q|kv_a 2.45 -> 2.93; the rounds in registers are not what holds these products back.
// BENCHMARKS, session 32. So was the slab brought in by the copy engine, one bulk copy a row issued
// as the block starts, with the MoE combine + norm before it letting it launch only once its parts
// were read: q|k|v 8.99 -> 7.95 us, but three such blocks an SM keep the decode's off until they
// end, and the decode took 5.97 -> 8.06; Qwen3 +2.6 %, session 34.)
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/mma.h"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace ms::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kChunk = 64;   // k per warp step: 16 per lane of a quad
constexpr int kSlab = 16;    // output features per mma tile

// Chunks a warp loads before its first mma (U of gemv_kernel): a SwiGLU pair loads two weights.
constexpr int unroll(bool swiglu) { return swiglu ? 2 : 4; }

// v / d for 0 <= v < 2^24 and 0 < d < 2^16 as one wide multiply and a shift: m = ceil(2^40 / d)
// is d m = 2^40 + e with 0 <= e < d, so v m / 2^40 = v / d + v e / (d 2^40), whose second term
// stays below 1 / d, and the floor is v / d's. (The FP8 scale index divided by runtime values
// twice for each 16-weight load; at batch 1 Nsight counted two-thirds of the product's
// instructions integer, 0.29 a weight in all: BENCHMARKS, session 39.)
struct BlockDiv {
  uint64_t m = 1;
  static BlockDiv of(int d) { return {((uint64_t(1) << 40) + uint64_t(d) - 1) / uint64_t(d)}; }
  __device__ __forceinline__ int operator()(int v) const { return int((uint64_t(uint32_t(v)) * m) >> 40); }
};

struct GemvParams {
  GemvWeights w;
  GemvRows rows;
  GemvInput in;
  void* out;
  int64_t out_ld;
  const float* bias;
  int N, K, chunks, slabs;
  BlockDiv block_n, block_k;  // FP8: the scale blocks' rows and columns
  bool early;        // a dense weight's first round loaded before pdl_wait (early_fetch)
  bool evict_first;  // the weights' L2 policy (weights_evict_first)
};

// Where gemv_kernel waits for the kernel before (pdl_wait): at its start (Wait), after loading its
// first round of weights (Early, early_fetch), or at its end (Beside, GemvInput::beside_last: its
// input was written before that kernel, so all of it may run beside that kernel).
enum class Start { Wait, Early, Beside };

// 16 weights of a row as the mma takes them: BF16 as 8 pairs; FP8 as the 16 codes and their
// block's scale times kE4m3Unscale.
template <bool FP8>
struct WeightRegs {
  uint32_t v[8];
};
template <>
struct WeightRegs<true> {
  uint32_t raw[4];
  float scale;
};

// Step s of a BF16 chunk's mmas (pairs 2s and 2s + 1 of rows r0 = g and r1 = g + 8), into acc.
__device__ __forceinline__ void bf16_step(float (&acc)[4], const WeightRegs<false>& r0, const WeightRegs<false>& r1,
                                          const uint32_t (&x)[8], int s) {
  const uint32_t frag[4] = {r0.v[2 * s], r1.v[2 * s], r0.v[2 * s + 1], r1.v[2 * s + 1]};
  mma_bf16(acc, frag, x[2 * s], x[2 * s + 1]);
}

// The four mmas of a lane's 16 k (one per 4 bf16 pairs) for rows r0 (g) and r1 (g + 8) and
// inputs x, into acc. FP8: into zeroed sums, then each row's sums times its scale.
template <bool FP8>
__device__ __forceinline__ void chunk_mma(float (&acc)[4], const WeightRegs<FP8>& r0, const WeightRegs<FP8>& r1,
                                          const uint32_t (&x)[8]) {
  if constexpr (FP8) {
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t frag[4];  // {row g pair 2s, row g + 8 pair 2s, row g pair 2s + 1, row g + 8 pair 2s + 1}
      e4m3x4_bf16(r0.raw[s], frag[0], frag[2]);
      e4m3x4_bf16(r1.raw[s], frag[1], frag[3]);
      mma_bf16(part, frag, x[2 * s], x[2 * s + 1]);
    }
    acc[0] = fmaf(part[0], r0.scale, acc[0]), acc[1] = fmaf(part[1], r0.scale, acc[1]);
    acc[2] = fmaf(part[2], r1.scale, acc[2]), acc[3] = fmaf(part[3], r1.scale, acc[3]);
  } else {
#pragma unroll
    for (int s = 0; s < 4; ++s) bf16_step(acc, r0, r1, x, s);
  }
}

// 16 weights of row n at k0 (zeros past N or K), read under L2 `policy`.
template <bool FP8>
__device__ __forceinline__ void load_weights(const GemvParams& p, const char* W, const float* S, int n, int k0,
                                             uint64_t policy, WeightRegs<FP8>& w) {
  uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
  if (n < p.N && k0 < p.K) {
    if constexpr (FP8) {
      lo = ldg16(W + int64_t(n) * p.w.ld + k0, policy);
    } else {
      const uint4* src = reinterpret_cast<const uint4*>(W + (int64_t(n) * p.w.ld + k0) * 2);
      lo = ldg16(src, policy);
      if (k0 + 8 < p.K) hi = ldg16(src + 1, policy);
    }
  }
  if constexpr (FP8) {
    w.scale = (n < p.N && k0 < p.K) ? S[int64_t(p.block_n(n)) * p.w.scale_ld + p.block_k(k0)] * kE4m3Unscale : 0.f;
    w.raw[0] = lo.x, w.raw[1] = lo.y, w.raw[2] = lo.z, w.raw[3] = lo.w;
  } else {
    w.v[0] = lo.x, w.v[1] = lo.y, w.v[2] = lo.z, w.v[3] = lo.w, w.v[4] = hi.x, w.v[5] = hi.y, w.v[6] = hi.z, w.v[7] = hi.w;
  }
}

// 16 inputs of source row `src` (< 0: none) at k0 as 8 bf16 pairs. L2_ONLY: read past L1 (a
// product running beside the kernel before reads what an earlier one wrote; no wait of its own
// orders those writes with this SM's L1).
template <bool L2_ONLY = false>
__device__ __forceinline__ void load_inputs(const GemvParams& p, int src, int k0, uint32_t (&x)[8]) {
  uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
  if (src >= 0 && k0 < p.K) {
    const uint4* s = reinterpret_cast<const uint4*>(p.in.x + int64_t(src) * p.in.x_ld + k0);
    lo = L2_ONLY ? __ldcg(s) : __ldg(s);
    if (k0 + 8 < p.K) hi = L2_ONLY ? __ldcg(s + 1) : __ldg(s + 1);
  }
  x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
}

template <class TO>
__device__ __forceinline__ void store_out(const GemvParams& p, int row, int n, float v) {
  store_f(static_cast<TO*>(p.out) + int64_t(row) * p.out_ld + n, v);
}

// Lane (g, q)'s weights of chunks c0, c0 + S, ... (U of them; zeros past K) of rows n0 + g and
// n0 + g + 8 of each matrix, into a[u][m][0 / 1].
template <bool FP8, int U, int MATS>
__device__ __forceinline__ void load_round(const GemvParams& p, const char* const (&W)[2], const float* const (&SC)[2],
                                           int n0, int c0, int S, uint64_t policy, WeightRegs<FP8> (&a)[U][MATS][2]) {
  const int g = threadIdx.x % 32 / 4, q = threadIdx.x % 4;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k0 = c0 + u * S < p.chunks ? (c0 + u * S) * kChunk + q * 16 : p.K;
#pragma unroll
    for (int m = 0; m < MATS; ++m) {
      load_weights<FP8>(p, W[m], SC[m], n0 + g, k0, policy, a[u][m][0]);
      load_weights<FP8>(p, W[m], SC[m], n0 + g + 8, k0, policy, a[u][m][1]);
    }
  }
}

// NT tiles of 8 rows per pass; U chunks loaded before the first mma (loads in flight per lane:
// U x MATS x 2 rows x 32 bytes). START Early (a dense weight, early_fetch): each warp's first
// round of its block's first slab is loaded before pdl_wait, as no kernel of the step writes
// weights. Beside (a dense product): the wait is at the end.
// Blocks an SM asked of ptxas: FP8's single-tile kernels two (BENCHMARKS, session 39); BF16 none
// (0: as if unsaid). Asked for one, ptxas gave the BF16 single-tile kernels 130 registers instead
// of 128, one block an SM instead of two, from session 40 on: V2-Lite's batch-1 step measured
// 0.79 ms where it had 0.75 (session 41 found it by the registers; this restores session 39's PTX).
template <bool FP8, class TO, bool SWIGLU, int NT, int U, Start START>
__global__ void __launch_bounds__(256, FP8 ? (NT == 1 ? 2 : 1) : 0) gemv_kernel(GemvParams p) {
  constexpr int MATS = SWIGLU ? 2 : 1;
  constexpr bool EARLY = START == Start::Early, BESIDE = START == Start::Beside;
  // Inputs of a round loaded with its weights for one tile of rows (batch <= 8): loaded after the
  // weights arrive, each input load was one more L2 round trip per chunk, in series. Measured on
  // the H200: batch 1 gains; with two tiles (the experts at batch 64) the extra registers cost
  // more occupancy than the round trips did. Not FP8's two rounds: an input register holds a byte
  // for each weight byte there, and at ~190 registers a thread two blocks an SM kept too few
  // weights in flight (V3's products at batch 1: BENCHMARKS, session 39); its mmas read the
  // inputs from L1, where the block's first warp brought them.
  constexpr bool kPrefetchX = NT == 1 && !FP8;
  extern __shared__ float red[];  // [S][MATS][NT][16 features][8 rows]
  const int S = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const uint64_t policy = l2_policy(p.evict_first);
  // Launched early (launch_pdl): resident, then waiting for the kernel before's output (the
  // inputs, the routing of grouped rows). The next kernel may launch meanwhile.
  // EARLY: the round's registers live across the loops below (as one array, not copied: a copy
  // doubled the registers); loaded here for the first round, in the loop for the others.
  WeightRegs<FP8> held[EARLY ? U : 1][MATS][2];
  bool have_round = EARLY && blockIdx.y < p.slabs;
  if constexpr (EARLY)
    if (have_round) {
      const char* W1[2] = {static_cast<const char*>(p.w.w_one), static_cast<const char*>(p.w.w2_one)};
      const float* SC1[2] = {p.w.s_one, p.w.s2_one};
      load_round<FP8, U, MATS>(p, W1, SC1, blockIdx.y * kSlab, warp, S, policy, held);
    }
  if constexpr (!BESIDE) pdl_wait();
  pdl_trigger();
  int group = 0;
  if (p.rows.active) {
    if (int(blockIdx.x) >= *p.rows.n_active) return;
    group = p.rows.active[blockIdx.x];
  }
  const int r_begin = p.rows.offsets ? p.rows.offsets[group] : 0;
  const int r_end = p.rows.offsets ? p.rows.offsets[group + 1] : p.rows.rows;
  const char* W[2] = {static_cast<const char*>(p.w.w ? p.w.w[group] : p.w.w_one),
                      static_cast<const char*>(p.w.w2 ? p.w.w2[group] : p.w.w2_one)};
  const float* SC[2] = {FP8 ? (p.w.s ? p.w.s[group] : p.w.s_one) : nullptr,
                        FP8 ? (p.w.s2 ? p.w.s2[group] : p.w.s2_one) : nullptr};
  for (int pass = r_begin; pass < r_end; pass += NT * 8) {
    // This lane's input row of each tile (B operand column g), -1 past the group's rows.
    int src[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int r = pass + t * 8 + g;
      src[t] = r < r_end ? (p.in.x_rows ? p.in.x_rows[r] : r) : -1;
    }
    for (int slab = blockIdx.y; slab < p.slabs; slab += gridDim.y) {
      const int n0 = slab * kSlab;
      float acc[MATS][NT][4] = {};
      // This lane's k0 in chunk c (past the last chunk: K, which loads zeros).
      auto k0_of = [&](int c) { return c < p.chunks ? c * kChunk + q * 16 : p.K; };
      using Round = WeightRegs<FP8>[U][MATS][2];
      using Inputs = uint32_t[kPrefetchX ? U : 1][NT][8];
      auto load_x = [&](int c0, Inputs& xs) {
        if constexpr (kPrefetchX)
#pragma unroll
          for (int u = 0; u < U; ++u)
#pragma unroll
            for (int t = 0; t < NT; ++t) load_inputs<BESIDE>(p, src[t], k0_of(c0 + u * S), xs[u][t]);
      };
      // The mmas of the round of chunks c0, c0 + S, ... (in that order: the sums' order).
      auto compute = [&](int c0, const Round& a, const Inputs& xs) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (c0 + u * S >= p.chunks) break;
#pragma unroll
          for (int t = 0; t < NT; ++t) {
            uint32_t x[8];
            if constexpr (kPrefetchX) {
#pragma unroll
              for (int i = 0; i < 8; ++i) x[i] = xs[u][t][i];
            } else {
              load_inputs<BESIDE>(p, src[t], k0_of(c0 + u * S), x);
            }
            if constexpr (FP8) {
#pragma unroll
              for (int m = 0; m < MATS; ++m) chunk_mma<FP8>(acc[m][t], a[u][m][0], a[u][m][1], x);
            } else {  // a SwiGLU pair's two chains interleaved (the mmas are volatile: kept in this order)
#pragma unroll
              for (int s = 0; s < 4; ++s)
#pragma unroll
                for (int m = 0; m < MATS; ++m) bf16_step(acc[m][t], a[u][m][0], a[u][m][1], x, s);
            }
          }
        }
      };
      if constexpr (FP8) {
        // Two rounds in turn: the next round's loads are asked for before this one's conversions
        // and mmas (one round at a time, the loads sat idle while a warp converted: ~1 TB/s at
        // batch 1, BENCHMARKS, session 39).
        Round fresh0, a1;
        Round& a0 = *[&] {
          if constexpr (EARLY) return &held;
          else return &fresh0;
        }();
        Inputs x0, x1;
        if (!have_round) load_round<FP8, U, MATS>(p, W, SC, n0, warp, S, policy, a0);
        have_round = false;
        load_x(warp, x0);
        for (int c0 = warp; c0 < p.chunks; c0 += 2 * S * U) {
          load_round<FP8, U, MATS>(p, W, SC, n0, c0 + S * U, S, policy, a1);
          load_x(c0 + S * U, x1);
          compute(c0, a0, x0);
          load_round<FP8, U, MATS>(p, W, SC, n0, c0 + 2 * S * U, S, policy, a0);
          load_x(c0 + 2 * S * U, x0);
          compute(c0 + S * U, a1, x1);
        }
      } else {
        for (int c0 = warp; c0 < p.chunks; c0 += S * U) {
          Round fresh;
          Round& a = *[&] {
            if constexpr (EARLY) return &held;
            else return &fresh;
          }();
          Inputs xs;
          if constexpr (EARLY) {  // weights (unless loaded before the wait), then the inputs
            if (!have_round) load_round<FP8, U, MATS>(p, W, SC, n0, c0, S, policy, a);
            have_round = false;
            load_x(c0, xs);
          } else {  // each chunk's weights and inputs together
#pragma unroll
            for (int u = 0; u < U; ++u) {
#pragma unroll
              for (int m = 0; m < MATS; ++m) {
                load_weights<FP8>(p, W[m], SC[m], n0 + g, k0_of(c0 + u * S), policy, a[u][m][0]);
                load_weights<FP8>(p, W[m], SC[m], n0 + g + 8, k0_of(c0 + u * S), policy, a[u][m][1]);
              }
              if constexpr (kPrefetchX)
#pragma unroll
                for (int t = 0; t < NT; ++t) load_inputs<BESIDE>(p, src[t], k0_of(c0 + u * S), xs[u][t]);
            }
          }
          compute(c0, a, xs);
        }
      }
      // Lane (g, q) holds features g and g + 8 for rows 2q and 2q + 1 of each tile.
#pragma unroll
      for (int m = 0; m < MATS; ++m)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          float* r = red + (((warp * MATS + m) * NT + t) * kSlab) * 8;
          r[g * 8 + 2 * q] = acc[m][t][0], r[g * 8 + 2 * q + 1] = acc[m][t][1];
          r[(g + 8) * 8 + 2 * q] = acc[m][t][2], r[(g + 8) * 8 + 2 * q + 1] = acc[m][t][3];
        }
      __syncthreads();
      for (int i = threadIdx.x; i < NT * 8 * kSlab; i += blockDim.x) {
        const int t = i / (8 * kSlab), row8 = (i / kSlab) % 8, f = i % kSlab;
        const int row = pass + t * 8 + row8, n = n0 + f;
        if (row >= r_end || n >= p.N) continue;
        float v[MATS];
#pragma unroll
        for (int m = 0; m < MATS; ++m) {
          v[m] = 0.f;
          for (int w = 0; w < S; ++w) v[m] += red[(((w * MATS + m) * NT + t) * kSlab + f) * 8 + row8];
        }
        float out = v[0];
        if constexpr (SWIGLU) out = v[0] / (1.0f + expf(-v[0])) * v[MATS - 1];
        else if (p.bias) out += p.bias[n];
        store_out<TO>(p, row, n, out);
      }
      __syncthreads();  // red is rewritten by the next slab
    }
  }
  // Beside: this block ends only after the kernel before, so the kernel after, which waits for
  // this one alone, also finds that one's writes.
  if constexpr (BESIDE) pdl_wait();
}

// Blocks of the running router product that have finished; its last block resets it. One
// stream a GPU runs these products one after another, so one counter a GPU serves them all.
__device__ unsigned g_route_blocks_done = 0;

// One warp's share of the router's product (the product with its top-k: gemv with a RouteTail),
// task (slab, first): what warp `first` of the S warps of gemv_kernel's block for that slab
// computes (chunks first, first + S, ... in that order), so its F32 parts are that warp's, bit
// for bit. start() asks for the first round of weights (into registers) and L2 for the rest:
// they do not depend on the kernel before, whose tail hides their latency, so it runs before
// pdl_wait. finish() runs the mmas and writes the parts to `part` [S][T][E].
template <bool FP8>
struct RouteTask {
  static constexpr int U = 4;  // unroll(false), gemv_kernel's U for these rows
  const GemvParams& p;
  const int S, n0, first, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const char* W = static_cast<const char*>(p.w.w_one);
  WeightRegs<FP8> a[U][2];  // a round's weights: chunks c0, c0 + S, ..., rows n0 + g and n0 + g + 8
  const uint64_t policy = l2_policy(p.evict_first);

  __device__ RouteTask(const GemvParams& params, int task, int parts)
      : p(params), S(parts), n0(task / parts * kSlab), first(task % parts) {}
  // This lane's k0 in chunk c (past the last chunk: K, which loads zeros).
  __device__ int k0_of(int c) const { return c < p.chunks ? c * kChunk + q * 16 : p.K; }
  __device__ void load_round(int c0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      load_weights<FP8>(p, W, p.w.s_one, n0 + g, k0_of(c0 + u * S), policy, a[u][0]);
      load_weights<FP8>(p, W, p.w.s_one, n0 + g + 8, k0_of(c0 + u * S), policy, a[u][1]);
    }
  }
  __device__ void start() {
    load_round(first);
    const int rest = (p.chunks - first - S * U + S - 1) / S;  // this warp's chunks after its first round
    for (int i = lane; i < rest * kSlab; i += 32) {
      const int n = n0 + i % kSlab, c = first + S * U + i / kSlab * S;
      if (n < p.N)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(W + (int64_t(n) * p.w.ld + int64_t(c) * kChunk) * (FP8 ? 1 : 2)));
    }
  }
  __device__ void finish(float* part) {
    const int src = g < p.rows.rows ? (p.in.x_rows ? p.in.x_rows[g] : g) : -1;
    float acc[4] = {};
    for (int c0 = first; c0 < p.chunks; c0 += S * U) {
      if (c0 != first) load_round(c0);
      uint32_t xs[U][8];
#pragma unroll
      for (int u = 0; u < U; ++u) load_inputs(p, src, k0_of(c0 + u * S), xs[u]);
      // gemv_kernel's mmas, in its order.
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (c0 + u * S >= p.chunks) break;
        chunk_mma<FP8>(acc, a[u][0], a[u][1], xs[u]);
      }
    }
    // Lane (g, q) holds features g and g + 8 for rows 2q and 2q + 1 (a warp with no chunk: zeros,
    // as gemv_kernel's does).
    float* out = part + int64_t(first) * p.rows.rows * p.N;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int n = n0 + g + 8 * h, row = 2 * q + j;
        if (n < p.N && row < p.rows.rows) out[int64_t(row) * p.N + n] = acc[2 * h + j];
      }
  }
};

// The router's product with its top-k over many blocks (routers of more than 64 tasks, such as
// DeepSeek-V3's 256 experts, or a tuned route_tasks): per_block tasks a block (warps past them
// only join the top-k) spread the weight over as many multiprocessors as there are tasks. Parts
// go to `part` in global memory; the last block to finish sums them and runs the top-k
// (route_in_last_block).
template <bool FP8, int NV>
__global__ void __launch_bounds__(256) route_kernel(GemvParams p, RouteTail route, float* part, int S, int per_block) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, task = blockIdx.x * per_block + warp;
  const bool streams = warp < per_block && task < p.slabs * S;
  RouteTask<FP8> w(p, task, S);
  if (streams) w.start();
  pdl_wait();
  pdl_trigger();
  if (streams) w.finish(part);
  route_in_last_block<NV>(route, part, S, p.bias, static_cast<float*>(p.out), &g_route_blocks_done, smem);
}

// The same as one thread-block cluster (at most 8 blocks, a task a warp): the parts go straight
// into the first block's shared memory (distributed shared memory), the cluster meets at its
// hardware barrier, and that block runs the top-k. Where route_kernel's blocks wrote their parts
// to L2, fenced them, counted themselves at a device counter and the last read them back (round
// trips in series), this is one barrier. smem: [S][T][E] parts, then route_tail's scratch.
// (Run inside the batch-1 post-attention norm's cluster instead, its weights loaded after that
// norm rather than into registers while it ran, the pair took 2.15 us more a Qwen3 layer:
// BENCHMARKS, session 31. Its launch and wait, resident behind the norm, cost less than that.)
template <bool FP8, int NV>
__global__ void __launch_bounds__(256) route_cluster_kernel(GemvParams p, RouteTail route, int S) {
  extern __shared__ float smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int task = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  const bool streams = task < p.slabs * S;
  RouteTask<FP8> w(p, task, S);
  if (streams) w.start();
  pdl_wait();
  pdl_trigger();
  if (streams) w.finish(cluster.map_shared_rank(smem, 0));
  cluster.sync();  // every part in the first block's shared memory (release / acquire)
  if (cluster.block_rank() != 0) return;
  route_tail<NV, true>(route, smem, S, p.bias, static_cast<float*>(p.out), smem + S * route.tp.T * route.tp.E);
}

// Whether a warp takes all its chunks in one round of 8 (gemv_kernel's U = 8): when the grid
// has no more blocks than multiprocessors, a block is alone on its SM and nothing else hides the
// drain between two rounds of loads (each round waits for all its loads before the next is
// asked for). Qwen3's o product (128 slabs x 64 chunks, 8 warps) took two rounds of 4. BF16
// single-matrix products of one row tile only (234 registers; FP8's dequantisation spills).
bool one_round(const GemvParams& p, dim3 grid, int warps) {
  const int64_t per_warp = (p.chunks + warps - 1) / warps;
  return int64_t(grid.x) * grid.y <= sm_count() && per_warp > unroll(false) && per_warp <= 8;
}

// Whether a product launches with the whole L1 / shared-memory array as shared memory
// (launch_pdl_with's shared_carveout): a dense product of one row tile, one slab a block, at most
// 4 blocks an SM and K <= 4096 (the batch-1 layers' products), so that the next kernel's blocks
// (Qwen3's decode after q|k|v, 2 x 106 KB an SM) become resident beside its blocks rather than
// once its SMs have drained: Qwen3's decode started 4-5 us earlier and the step's span was 2 %
// shorter. Not the larger products: with a small L1 they streamed slower (the lm_head, whose
// blocks walk slabs in turn, 140 -> 155 us; V2-Lite's dense MLP, K = 10944 and 684 slabs,
// +10 us), likely as their loads in flight allocate L1 lines (BENCHMARKS, session 33).
// MOESERVE_GEMV_CARVEOUT=0 (read once): never.
bool leaves_room(const GemvParams& p, dim3 grid, int nt) {
  static const bool allowed = [] {
    const char* env = std::getenv("MOESERVE_GEMV_CARVEOUT");
    return !(env && std::string_view(env) == "0");
  }();
  return allowed && nt == 1 && !p.w.w && !p.rows.offsets && int(grid.y) == p.slabs && p.slabs <= 4 * sm_count() &&
         p.K <= 4096;
}

template <bool FP8, class TO, bool SWIGLU, int NT>
void launch(const GemvParams& p, dim3 grid, int warps) {
  constexpr int U = unroll(SWIGLU);
  const size_t smem = size_t(warps) * (SWIGLU ? 2 : 1) * NT * kSlab * 8 * sizeof(float);
  const bool shared = leaves_room(p, grid, NT);
  auto go = [&](auto kernel) { launch_pdl_with(shared, kernel, grid, dim3(warps * 32), smem, p); };
  if constexpr (NT == 1)
    if (p.in.beside_last) {
      if constexpr (!FP8 && !SWIGLU)
        if (one_round(p, grid, warps)) return go(gemv_kernel<FP8, TO, false, 1, 8, Start::Beside>);
      return go(gemv_kernel<FP8, TO, SWIGLU, 1, U, Start::Beside>);
    }
  if constexpr (!FP8 && !SWIGLU && NT == 1)
    if (one_round(p, grid, warps))
      return p.early ? go(gemv_kernel<FP8, TO, false, 1, 8, Start::Early>)
                     : go(gemv_kernel<FP8, TO, false, 1, 8, Start::Wait>);
  if constexpr (NT == 1)
    if (p.early) return go(gemv_kernel<FP8, TO, SWIGLU, NT, U, Start::Early>);
  go(gemv_kernel<FP8, TO, SWIGLU, NT, U, Start::Wait>);
}

template <bool FP8, class TO, bool SWIGLU>
void dispatch_tiles(const GemvParams& p, int nt, dim3 grid, int warps) {
  if (nt == 1) launch<FP8, TO, SWIGLU, 1>(p, grid, warps);
  else if (nt == 2) launch<FP8, TO, SWIGLU, 2>(p, grid, warps);
  else launch<FP8, TO, SWIGLU, 4>(p, grid, warps);
}

GemvTuning& tuning();

// Whether a dense product loads its first round of weights before it waits (gemv_kernel's
// EARLY), from MOESERVE_GEMV_PREFETCH: `marked` (the default) where the weight is marked
// fetch_early (GemvWeights), `none`, or `regs`: every dense product of at most 8 rows. At batch 1
// an early fetch speeds up the attention's output projection (BENCHMARKS, session 22), but the
// next layer's q|k|v fetching early (21 MB for Qwen3) queues ahead of the MoE combine + norm's
// dependent reads before it (session 19, where the fetch was an L2 prefetch: that norm took 1.7
// us more, and the steps were 1.4-3.3 % slower with it). So only the products that follow a
// kernel with little traffic of its own are marked. (Launching q|k|v only once the norm had read
// its inputs lost: its blocks then start late.)
bool early_fetch(bool marked) {
  static const int mode = [] {
    const char* env = std::getenv("MOESERVE_GEMV_PREFETCH");
    const std::string_view v = env ? env : "marked";
    MS_CHECK(v == "marked" || v == "none" || v == "regs", "MOESERVE_GEMV_PREFETCH=", v,
             ": expected marked, none or regs");
    return v == "none" ? 0 : v == "marked" ? 1 : 2;
  }();
  return mode == 2 || (mode == 1 && marked);
}

// Whether the router runs as one cluster (route_cluster_kernel): its tasks fit 8 blocks of at
// most 8 warps and its parts and scratch 48 KB of shared memory. MOESERVE_ROUTE_CLUSTER=0 (read
// once): never.
bool route_as_cluster(int tasks, size_t smem) {
  static const bool allowed = [] {
    const char* env = std::getenv("MOESERVE_ROUTE_CLUSTER");
    return !(env && std::string_view(env) == "0");
  }();
  return allowed && tasks <= 64 && smem <= 48 * 1024;
}

// The router's launch: one cluster where it fits, else a warp for each of the slabs x S tasks,
// per_block of them a block (as few as fill the multiprocessors, or tuning().route_tasks), with
// at least a warp a row for the top-k. Shared memory for the top-k's group scores or the sort of
// the pairs, whichever needs more (after the parts, in a cluster).
template <bool FP8>
void launch_routed(const GemvParams& p, const RouteTail& r, int S) {
  MS_CHECK(S <= kRouteMaxParts, "gemv: a routed product in ", S, " parts");
  const int tasks = p.slabs * S, tuned = tuning().route_tasks;
  auto tail_smem = [&](int warps) {
    return std::max(size_t(warps) * topk_warp_smem(r.tp), r.sort.offsets ? sort_pairs_smem(r.sort.experts) : size_t(0));
  };
  const int cluster = std::min(8, tasks), cluster_warps = std::max((tasks + cluster - 1) / cluster, int(r.tp.T));
  const size_t cluster_smem = size_t(S) * r.tp.T * r.tp.E * sizeof(float) + tail_smem(cluster_warps);
  if (!tuned && cluster_warps <= 8 && route_as_cluster(tasks, cluster_smem)) {
    const dim3 grid{unsigned(cluster)}, block{unsigned(cluster_warps * 32)};
    auto launch = [&](auto kernel) { launch_pdl_cluster(kernel, grid, grid, block, cluster_smem, p, r, S); };
    switch (r.nv) {
      case 1: launch(route_cluster_kernel<FP8, 1>); break;
      case 2: launch(route_cluster_kernel<FP8, 2>); break;
      case 4: launch(route_cluster_kernel<FP8, 4>); break;
      case 8: launch(route_cluster_kernel<FP8, 8>); break;
      default: fail("gemv: a routed product of ", r.nv, " experts a lane");
    }
    return;
  }
  const int per_block = std::min(8, tuned ? tuned : (tasks + sm_count() - 1) / sm_count());
  const int blocks = (tasks + per_block - 1) / per_block, warps = std::max(per_block, int(r.tp.T));
  const size_t smem = tail_smem(warps);
  Tensor part = scratch(DType::F32, {int64_t(S), r.tp.T, r.tp.E});
  float* pp = part.data<float>();
  const dim3 grid{unsigned(blocks)}, block{unsigned(warps * 32)};
  switch (r.nv) {
    case 1: launch_pdl(route_kernel<FP8, 1>, grid, block, smem, p, r, pp, S, per_block); break;
    case 2: launch_pdl(route_kernel<FP8, 2>, grid, block, smem, p, r, pp, S, per_block); break;
    case 4: launch_pdl(route_kernel<FP8, 4>, grid, block, smem, p, r, pp, S, per_block); break;
    case 8: launch_pdl(route_kernel<FP8, 8>, grid, block, smem, p, r, pp, S, per_block); break;
    default: fail("gemv: a routed product of ", r.nv, " experts a lane");
  }
}

template <bool FP8, bool SWIGLU>
void dispatch_out(const GemvParams& p, DType dtype, int nt, dim3 grid, int warps) {
  if (dtype == DType::BF16) dispatch_tiles<FP8, bf16, SWIGLU>(p, nt, grid, warps);
  else if (dtype == DType::F32) dispatch_tiles<FP8, float, SWIGLU>(p, nt, grid, warps);
  else fail("gemv: unsupported output dtype ", dtype_name(dtype));
}

GemvTuning checked(const GemvTuning& t) {
  MS_CHECK(t.warps >= 0 && t.warps <= 8 && t.blocks_y >= 0 && (t.nt == 0 || t.nt == 1 || t.nt == 2 || t.nt == 4) &&
               t.route_tasks >= 0 && t.route_tasks <= 8,
           "gemv tuning: warps ", t.warps, " (0..8), blocks_y ", t.blocks_y, " (>= 0), nt ", t.nt,
           " (0, 1, 2, 4), route_tasks ", t.route_tasks, " (0..8)");
  return t;
}

GemvTuning& tuning() {
  static GemvTuning t = [] {
    GemvTuning t;
    if (const char* env = std::getenv("MOESERVE_GEMV_TUNE"))
      MS_CHECK(std::sscanf(env, "%d,%d,%d", &t.warps, &t.blocks_y, &t.nt) == 3,
               "MOESERVE_GEMV_TUNE=", env, ": expected warps,blocks_y,nt");
    return checked(t);
  }();
  return t;
}

}  // namespace

GemvTuning gemv_tuning() { return tuning(); }
void set_gemv_tuning(const GemvTuning& t) { tuning() = checked(t); }

bool gemv_supported(int64_t K, int64_t w_ld, bool fp8, const void* x, int64_t x_ld) {
  const int64_t E = fp8 ? kChunk : 8;
  return K > 0 && K % E == 0 && (w_ld * (fp8 ? 1 : 2)) % 16 == 0 && x_ld % 8 == 0 &&
         reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void gemv(int64_t N, int64_t K, const GemvWeights& w, const GemvRows& rows, const GemvInput& in,
          const GemvOutput& out, bool swiglu, const RouteTail* route) {
  MS_CHECK(gemv_supported(K, w.ld, w.fp8, in.x, in.x_ld), "gemv: unsupported shape K=", K);
  MS_CHECK(!w.fp8 || gemv_fp8_block_k(w.block_k), "gemv: fp8 block_k ", w.block_k,
           " is not a positive multiple of 64");
  MS_CHECK(!w.fp8 || (w.block_n > 0 && w.block_n < (1 << 16) && w.block_k < (1 << 16) && N < (1 << 24) && K < (1 << 24)),
           "gemv: fp8 blocks of ", w.block_n, " x ", w.block_k, " over ", N, " x ", K, " (BlockDiv's range)");
  MS_CHECK(!in.beside_last || (!rows.offsets && !route), "gemv: only a dense product runs beside the kernel before");
  if (N == 0 || rows.rows == 0) return;
  GemvParams p{w, rows, in, out.out, out.out_ld, out.bias, int(N), int(K), int((K + kChunk - 1) / kChunk),
               int((N + kSlab - 1) / kSlab), BlockDiv::of(w.fp8 ? w.block_n : 1), BlockDiv::of(w.fp8 ? w.block_k : 1),
               !w.w && early_fetch(w.fetch_early), weights_evict_first()};
  // Tiles of 8 rows per pass over the weights: a group with more rows than NT * 8 streams its
  // weights once more per further pass.
  const int per_group = (rows.rows + rows.expected_groups - 1) / rows.expected_groups;
  int nt = rows.offsets ? (per_group <= 2 ? 1 : per_group <= 8 ? 2 : 4)
                        : (rows.rows <= 8 ? 1 : rows.rows <= 16 ? 2 : 4);
  // Four warps split K, eight when few slabs would leave multiprocessors idle; enough blocks
  // over slabs for several waves, each block walking the rest in turn.
  int warps = int64_t(rows.expected_groups) * p.slabs < 2 * sm_count() && p.chunks >= 16 ? 8 : 4;
  const int blocks_per_group = std::max(1, (32 * sm_count() + rows.expected_groups - 1) / rows.expected_groups);
  dim3 grid(unsigned(rows.max_groups), unsigned(std::min(p.slabs, blocks_per_group)));
  if (route) {
    MS_CHECK(!swiglu && !rows.offsets && !w.w && rows.rows <= 8 && out.dtype == DType::F32 && route->tp.T == rows.rows &&
                 route->tp.E == N && route->tp.ls == out.out_ld,
             "gemv: a routed product takes a dense F32 output of at most 8 rows");
    // The router's parts are those of gemv_kernel's warps at this automatic shape, so its logits
    // are the unrouted product's (cuda::linear's) bit for bit.
    if (w.fp8) launch_routed<true>(p, *route, warps);
    else launch_routed<false>(p, *route, warps);
    return;
  }
  const GemvTuning& tune = tuning();
  if (tune.warps) warps = tune.warps;
  if (tune.blocks_y) grid.y = unsigned(std::min(p.slabs, tune.blocks_y));
  if (tune.nt) nt = tune.nt;
  if (w.fp8) {
    if (swiglu) dispatch_out<true, true>(p, out.dtype, nt, grid, warps);
    else dispatch_out<true, false>(p, out.dtype, nt, grid, warps);
  } else {
    if (swiglu) dispatch_out<false, true>(p, out.dtype, nt, grid, warps);
    else dispatch_out<false, false>(p, out.dtype, nt, grid, warps);
  }
}

}  // namespace ms::cuda
