// The routed experts of one token (batch-1 decode) in one kernel, split over the intermediate.
// Block (slot s, slab j) makes features [jF, jF + F) of its expert's silu(x . gate) * (x . up),
// rounds them to BF16 (grouped_experts' intermediate), and multiplies them by the same F columns
// of the down weight: a partial sum of all H outputs. So the gate|up rows and the down columns
// stream in one pass. The two-kernel path (grouped_experts) must end its gate|up product before
// the down product reads its input, and HBM idles while the last gate|up blocks drain and the
// down blocks start: on the H200 its down product took twice its bytes' time (BENCHMARKS).
//
// F is 64 (a block an SM, whole 128-byte lines of each down row) where the grid fits the
// multiprocessors, else 32 (two blocks an SM). The partials of a slot meet at a counter: every
// block of the slot, once all have stored theirs, sums rows [j * chunk, (j + 1) * chunk) of them
// in slab order into ye, so the result is the same every run (no float atomics). A block waits
// for the slot's other blocks, so the whole grid must be resident at once: the launch checks the
// occupancy and otherwise declines.
//
// The kernel lets the next one start (PDL) only once its partials are stored. Earlier would be
// safe too (that launch waits until every block here has triggered, so is resident), but the
// norm after this kernel triggers at once and the next layer's q|k|v product then prefetches its
// weights while these stream; after the partials its prefetch lands in the sums' idle HBM
// (BENCHMARKS, session 17: with it, this kernel's share of a Qwen3 layer was 27.7 us against
// 25.3, on two machines).
#include "kernels/cuda/moe_grouped.h"

#include <cstdlib>

namespace ms::cuda {
namespace {

constexpr int kMaxSlots = 16;
constexpr int kMaxHidden = 8192;  // the token's row in shared memory

// Blocks of slot s that stored their partial, and that finished their sum; the last to finish
// resets both for the next launch (one stream a GPU runs these one after another).
__device__ unsigned g_arrived[kMaxSlots], g_summed[kMaxSlots];

struct Params {
  const bf16* x;           // [H]
  const int32_t* ids;      // [K] expert of each slot
  const int32_t* row_of;   // [K] row of ye for each slot (-1: another rank's expert)
  const void* const* gate;
  const void* const* up;
  const void* const* down;
  int64_t gu_ld, down_ld;
  int first, E, H, slabs, chunk;
  float* part;  // [K][slabs][H]
  float* ye;    // [rows][H]
};

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// F intermediate features a block (F * 2 bytes of each down row), W warps, B blocks an SM.
template <int F, int W, int B>
__global__ void __launch_bounds__(W * 32, B) one_token_kernel(Params p) {
  constexpr int kThreads = W * 32;
  constexpr int kRows = 2 * F / W;       // gate and up rows a warp (interleaved: gate f, up f, ...)
  constexpr int kLanes = F / 8;          // lanes that share a down row, 16 bytes each
  constexpr int kRowsAtOnce = 32 / kLanes;  // down rows a warp's load takes
  static_assert(kRows % 2 == 0 && kLanes <= 32 && 32 % kLanes == 0);
  extern __shared__ uint4 xs[];  // [H / 8] the token's row
  __shared__ float hs[F];
  const int j = blockIdx.x, s = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_wait();
  const int e = p.ids[s] - p.first, row = p.row_of[s];
  if (row < 0 || e < 0 || e >= p.E) return;  // another rank's expert: the slot's every block leaves
  for (int i = threadIdx.x; i < p.H / 8; i += kThreads) xs[i] = reinterpret_cast<const uint4*>(p.x)[i];

  // [gate | up]: warp w takes features kRows / 2 * w onwards, a row of each matrix; lane l the
  // 16 bytes at l * 8 of every 256-wide chunk of K, two chunks a round.
  const bf16* w_row[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    w_row[r] = static_cast<const bf16*>((r % 2 ? p.up : p.gate)[e]) +
               int64_t(j * F + warp * (kRows / 2) + r / 2) * p.gu_ld + lane * 8;
  float acc[kRows] = {};
  const int chunks = p.H / 256;
  __syncthreads();  // xs
  for (int c0 = 0; c0 < chunks; c0 += 2) {
    uint4 w[2][kRows];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        w[u][r] = c0 + u < chunks ? __ldg(reinterpret_cast<const uint4*>(w_row[r] + (c0 + u) * 256)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      if (c0 + u >= chunks) break;
      float xf[8];
      unpack8(xs[(c0 + u) * 32 + lane], xf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[8];
        unpack8(w[u][r], wf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int off = 16; off > 0; off /= 2) acc[r] += __shfl_xor_sync(~0u, acc[r], off);
  if (lane == 0)
#pragma unroll
    for (int f = 0; f < kRows / 2; ++f) {
      const float g = acc[2 * f], h = g / (1.0f + expf(-g)) * acc[2 * f + 1];
      hs[warp * (kRows / 2) + f] = __bfloat162float(__float2bfloat16_rn(h));
    }
  __syncthreads();

  // Down: kLanes lanes take one row of the slab's columns, 16 bytes (8 features) each, so a
  // warp's load takes kRowsAtOnce rows ("a group"); warp w the groups w, w + W, ...
  const int rr = lane / kLanes, q = lane % kLanes, groups = p.H / kRowsAtOnce;
  float hq[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) hq[i] = hs[q * 8 + i];
  const bf16* down = static_cast<const bf16*>(p.down[e]) + j * F + q * 8;
  float* part = p.part + (int64_t(s) * p.slabs + j) * p.H;
  for (int g0 = warp; g0 < groups; g0 += W * 8) {
    uint4 w[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = g0 + u * W;
      w[u] = g < groups ? __ldg(reinterpret_cast<const uint4*>(down + int64_t(g * kRowsAtOnce + rr) * p.down_ld))
                        : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = g0 + u * W;
      if (g >= groups) break;
      float wf[8], v = 0.f;
      unpack8(w[u], wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) v = fmaf(wf[i], hq[i], v);
#pragma unroll
      for (int off = 1; off < kLanes; off *= 2) v += __shfl_xor_sync(~0u, v, off);
      if (q == 0) __stcg(part + g * kRowsAtOnce + rr, v);
    }
  }

  // Every block of the slot has stored its partial: then each sums its rows of them.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(&g_arrived[s], 1u);
    while (load_acquire(&g_arrived[s]) < unsigned(p.slabs)) __nanosleep(32);
  }
  __syncthreads();
  pdl_trigger();
  const float* parts = p.part + int64_t(s) * p.slabs * p.H;
  const int n_end = min(p.H, (j + 1) * p.chunk);
  for (int n = j * p.chunk + threadIdx.x; n < n_end; n += kThreads) {
    float v = 0.f;
#pragma unroll 8
    for (int k = 0; k < p.slabs; ++k) v += __ldcg(parts + int64_t(k) * p.H + n);
    p.ye[int64_t(row) * p.H + n] = v;
  }
  if (threadIdx.x == 0 && atomicAdd(&g_summed[s], 1u) == unsigned(p.slabs) - 1) g_arrived[s] = 0, g_summed[s] = 0;
}

// A launch shape: F features a block, its kernel and that kernel's warps a block.
struct Shape {
  int F;
  void (*kernel)(Params);
  int warps;
};
// Wide slabs first: a block an SM reading whole 128-byte lines of the down rows; else two
// blocks an SM of half the width, for more blocks than multiprocessors.
constexpr Shape kShapes[] = {{64, one_token_kernel<64, 16, 1>, 16}, {32, one_token_kernel<32, 8, 2>, 8}};

// Whether `sh` takes K slots of I features at once on this GPU (every block resident).
bool fits(const Shape& sh, int64_t K, int64_t I, size_t smem) {
  if (I % sh.F != 0) return false;
  int n = 0;
  MS_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, sh.kernel, sh.warps * 32, smem));
  return int64_t(n) * sm_count() >= K * (I / sh.F);
}

}  // namespace

bool one_token_experts(const Tensor& x, const Tensor& ids, const Tensor& row_of, const ExpertTable& t, int first,
                       Tensor& ye) {
  // MOESERVE_MOE_ONE_TOKEN: 0 off; unset or 1 the first shape that fits; 64 or 32 that width only.
  const char* env = std::getenv("MOESERVE_MOE_ONE_TOKEN");
  const int mode = env ? std::atoi(env) : 1;
  if (mode == 0) return false;
  const int64_t H = t.hidden, I = t.intermediate, K = ids.numel();
  if (t.fp8 || x.size(0) != 1 || x.size(1) != H || H % 256 != 0 || H > kMaxHidden || K > kMaxSlots ||
      t.gate_up.ld % 8 != 0 || t.down.ld % 8 != 0 || !aligned16(x.raw(), 0) || !t.gate_up.w || !t.gate_up.w2 ||
      !t.down.w)
    return false;
  const size_t smem = size_t(H) * sizeof(bf16);
  for (const Shape& sh : kShapes) {
    if ((mode != 1 && mode != sh.F) || !fits(sh, K, I, smem)) continue;
    const int slabs = int(I / sh.F);
    Tensor part = scratch(DType::F32, {K, slabs, H});
    Params p{x.data<bf16>(), ids.data<int32_t>(), row_of.data<int32_t>(), t.gate_up.w, t.gate_up.w2, t.down.w,
             t.gate_up.ld, t.down.ld, first, t.experts, int(H), slabs, int((H + slabs - 1) / slabs),
             part.data<float>(), ye.data<float>()};
    launch_pdl(sh.kernel, dim3(unsigned(slabs), unsigned(K)), dim3(unsigned(sh.warps * 32)), smem, p);
    return true;
  }
  return false;
}

}  // namespace ms::cuda
