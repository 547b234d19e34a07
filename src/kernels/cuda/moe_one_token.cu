// The routed experts of one token (batch-1 decode) in one kernel, split over the intermediate.
// Block (slot s, slab j) makes features [jF, jF + F) of its expert's silu(x . gate) * (x . up),
// rounds them to BF16 (grouped_experts' intermediate), and multiplies them by the same F columns
// of the down weight: a partial sum of all H outputs. So the gate|up rows and the down columns
// stream in one pass. The two-kernel path (grouped_experts) must end its gate|up product before
// the down product reads its input, and HBM idles while the last gate|up blocks drain and the
// down blocks start: on the H200 its down product took twice its bytes' time (BENCHMARKS).
//
// F is 64 (a block an SM, whole 128-byte lines of each down row) where the grid fits the
// multiprocessors, its lanes' loads through a shared-memory ring (one_token_ring_kernel) where
// the hidden size allows, else 32 (two blocks an SM). The partials of a slot meet at a counter:
// every block of the slot, once all have stored theirs, sums rows [j * chunk, (j + 1) * chunk)
// of them in slab order into ye, so the result is the same every run (no float atomics). A block
// waits for the slot's other blocks, so the whole grid must be resident at once: the launch
// checks the occupancy and otherwise declines. one_token_expert_parts skips that last step and
// leaves the partials to the MoE combine + norm (norm.cu), which sums them in the same order:
// at batch 1 the counter and the sum cost Qwen3's experts 2.7 us of 23.6 (BENCHMARKS, session 23).
//
// Before it waits for the routing, every block copies the local experts' weight addresses into
// shared memory (stage_expert_table), so that from the slot's expert id to its first weight load
// no other round trip lies. (Asking L2 there for the next layer's first weight too, while HBM
// idles under the router, made q|k|v 0.8 us shorter and this kernel and the attention as much
// longer: BENCHMARKS, session 31.)
//
// With ye, the kernel lets the next one start (PDL) only once its partials are stored. Earlier would be
// safe too (that launch waits until every block here has triggered, so is resident), but the
// norm after this kernel triggers at once and the next layer's q|k|v product then launches, and
// when it fetches early (MOESERVE_GEMV_PREFETCH=regs; in session 17 an L2 prefetch) its weights
// stream while these do (BENCHMARKS, session 17: this kernel's share of a Qwen3 layer was 27.7 us
// against 25.3). Without ye it does so once its gate|up sums are made: the norm after it then waits,
// resident, and only lets the next product in once this kernel has ended.
#include "kernels/cuda/moe_grouped.h"

#include <cstdlib>
#include <iterator>
#include <string_view>

namespace ms::cuda {
namespace {

constexpr int kMaxSlots = 16;
constexpr int kMaxHidden = 8192;  // the token's row in shared memory
constexpr int kMaxExperts = 512;  // a rank's experts whose weight addresses shared memory holds

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
  float* ye;    // [rows][H]; null: the parts are the result (one_token_expert_parts), no sum_slot
  bool evict_first;  // the weights' L2 policy (weights_evict_first)
};

// The slot's expert's gate, up and down addresses.
struct ExpertWeightsAt {
  const void *gate, *up, *down;
};

// Every local expert's weight addresses copied into shared memory `at` (3 * E pointers) before
// the kernel waits: no kernel writes them, and read from global memory once the routing is known
// they were a round trip between the expert's id and its first weight load (Qwen3's experts
// kernel 0.7 us shorter a layer without it: BENCHMARKS, session 28).
__device__ __forceinline__ const void** stage_expert_table(const Params& p, void* at) {
  auto** t = static_cast<const void**>(at);
  for (int i = threadIdx.x; i < p.E; i += blockDim.x) t[i] = p.gate[i], t[p.E + i] = p.up[i], t[2 * p.E + i] = p.down[i];
  __syncthreads();
  return t;
}

__device__ __forceinline__ ExpertWeightsAt expert_weights(const Params& p, const void* const* table, int e) {
  return {table[e], table[p.E + e], table[2 * p.E + e]};
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The warp's kRows gate|up sums (lane-partial) made silu(gate) * up of its kRows / 2 features,
// rounded to BF16 as grouped_experts' intermediate, into hs.
template <int kRows>
__device__ __forceinline__ void gate_up_to_hs(float (&acc)[kRows], float* hs, int warp, int lane) {
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
}

// acc[r] += the 8 products of gate|up piece w[r] with the token's 8 inputs x8.
template <int kRows>
__device__ __forceinline__ void gate_up_piece(const uint4 (&w)[kRows], uint4 x8, float (&acc)[kRows]) {
  float xf[8];
  unpack8(x8, xf);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float wf[8];
    unpack8(w[r], wf);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
  }
}

// One down piece: 16 bytes of a down row (8 of the slab's features) times their h, summed over
// the row's kLanes lanes; the row's first lane stores it.
template <int kLanes>
__device__ __forceinline__ void down_piece(uint4 w, const float (&hq)[8], bool first_lane, float* dst) {
  float wf[8], v = 0.f;
  unpack8(w, wf);
#pragma unroll
  for (int i = 0; i < 8; ++i) v = fmaf(wf[i], hq[i], v);
#pragma unroll
  for (int off = 1; off < kLanes; off *= 2) v += __shfl_xor_sync(~0u, v, off);
  if (first_lane) __stcg(dst, v);
}

// Once every thread of the block has stored its pieces of the partial: the slot's blocks meet
// at its counter, then this one sums rows [j * chunk, (j + 1) * chunk) of the slot's partials in
// slab order into ye; the last to finish resets the counters.
__device__ void sum_slot(const Params& p, int s, int j, int row) {
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
  for (int n = j * p.chunk + threadIdx.x; n < n_end; n += blockDim.x) {
    float v = 0.f;
#pragma unroll 8
    for (int k = 0; k < p.slabs; ++k) v += __ldcg(parts + int64_t(k) * p.H + n);
    p.ye[int64_t(row) * p.H + n] = v;
  }
  if (threadIdx.x == 0 && atomicAdd(&g_summed[s], 1u) == unsigned(p.slabs) - 1) g_arrived[s] = 0, g_summed[s] = 0;
}

// What both kernels' threads take: the slot's expert (or -1: another rank's), the token's row in
// shared memory, and the addresses of this lane's pieces.
template <int F, int W>
struct Lanes {
  static constexpr int kRows = 2 * F / W;       // gate and up rows a warp (interleaved: gate f, up f, ...)
  static constexpr int kLanes = F / 8;          // lanes that share a down row, 16 bytes each
  static constexpr int kRowsAtOnce = 32 / kLanes;  // down rows a warp's load takes ("a group")
  static_assert(kRows % 2 == 0 && kLanes <= 32 && 32 % kLanes == 0);
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32, rr = lane / kLanes, q = lane % kLanes;
  // [gate | up]: warp w takes features kRows / 2 * w onwards, a row of each matrix; lane l the
  // 16 bytes at l * 8 of every 256-wide chunk of K. Down: kLanes lanes take one row of the slab's
  // columns, 16 bytes (8 features) each; warp w the groups w, w + W, ...
  const bf16* w_row[kRows];
  const bf16* down;
  __device__ Lanes(const Params& p, const ExpertWeightsAt& w, int j) {
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      w_row[r] = static_cast<const bf16*>(r % 2 ? w.up : w.gate) + int64_t(j * F + warp * (kRows / 2) + r / 2) * p.gu_ld +
                 lane * 8;
    down = static_cast<const bf16*>(w.down) + j * F + q * 8;
  }
  __device__ const bf16* down_row(const Params& p, int g) const { return down + int64_t(g * kRowsAtOnce + rr) * p.down_ld; }
};

// F intermediate features a block (F * 2 bytes of each down row), W warps, B blocks an SM; each
// lane's loads go to registers, two 256-wide chunks of gate|up a round, then 8 down groups.
template <int F, int W, int B>
__global__ void __launch_bounds__(W * 32, B) one_token_kernel(Params p) {
  using L = Lanes<F, W>;
  extern __shared__ uint4 xs[];  // [H / 8] the token's row, then the experts' addresses
  __shared__ float hs[F];
  const int j = blockIdx.x, s = blockIdx.y;
  const void* const* table = stage_expert_table(p, xs + p.H / 8);
  pdl_wait();
  const int e = p.ids[s] - p.first, row = p.row_of[s];
  if (row < 0 || e < 0 || e >= p.E) return;  // another rank's expert: the slot's every block leaves
  for (int i = threadIdx.x; i < p.H / 8; i += W * 32) xs[i] = reinterpret_cast<const uint4*>(p.x)[i];
  const L l(p, expert_weights(p, table, e), j);
  const uint64_t policy = l2_policy(p.evict_first);
  float acc[L::kRows] = {};
  const int chunks = p.H / 256;
  __syncthreads();  // xs
  for (int c0 = 0; c0 < chunks; c0 += 2) {
    uint4 w[2][L::kRows];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
      for (int r = 0; r < L::kRows; ++r)
        w[u][r] = c0 + u < chunks ? ldg16(l.w_row[r] + (c0 + u) * 256, policy) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 2; ++u)
      if (c0 + u < chunks) gate_up_piece(w[u], xs[(c0 + u) * 32 + l.lane], acc);
  }
  gate_up_to_hs(acc, hs, l.warp, l.lane);
  if (!p.ye) pdl_trigger();  // no counter to meet at: the kernel after may take its place now
  __syncthreads();
  float hq[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) hq[i] = hs[l.q * 8 + i];
  float* part = p.part + (int64_t(s) * p.slabs + j) * p.H;
  const int groups = p.H / L::kRowsAtOnce;
  for (int g0 = l.warp; g0 < groups; g0 += W * 8) {
    uint4 w[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = g0 + u * W;
      w[u] = g < groups ? ldg16(l.down_row(p, g), policy) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int g = g0 + u * W;
      if (g < groups) down_piece<L::kLanes>(w[u], hq, l.q == 0, part + g * L::kRowsAtOnce + l.rr);
    }
  }
  if (p.ye) sum_slot(p, s, j, row);
}

// The same sums with every lane's loads streamed through a private ring of D steps in shared
// memory (cp.async), 8 pieces of 16 bytes a step: the gate|up chunks, then the down groups, in
// one stream, so the first down pieces are in flight while the last gate|up ones are summed and
// bytes in flight are not bound by registers. F = 64 and 16 warps: one block an SM; the hidden
// size a multiple of 512 (whole steps of down groups).
template <int W, int D>
__global__ void __launch_bounds__(W * 32, 1) one_token_ring_kernel(Params p) {
  using L = Lanes<64, W>;
  constexpr int kThreads = W * 32, kPieces = 8;
  static_assert(L::kRows == kPieces, "a gate|up step and a down step are both 8 pieces a lane");
  // [H / 8] the token's row, the ring [D][kPieces][kThreads], then the experts' addresses
  extern __shared__ uint4 smem[];
  __shared__ float hs[64];
  const int j = blockIdx.x, s = blockIdx.y;
  const void* const* table = stage_expert_table(p, smem + p.H / 8 + D * kPieces * kThreads);
  pdl_wait();
  const int e = p.ids[s] - p.first, row = p.row_of[s];
  if (row < 0 || e < 0 || e >= p.E) return;
  uint4* xs = smem;
  uint4* ring = smem + p.H / 8 + threadIdx.x;  // this thread's slots: ring[(stage * kPieces + r) * kThreads]
  const L l(p, expert_weights(p, table, e), j);
  const uint64_t policy = l2_policy(p.evict_first);
  const int chunks = p.H / 256, steps = chunks + p.H / L::kRowsAtOnce / (W * 8);
  auto issue = [&](int t) {
    if (t < steps) {
      uint4* stage = ring + (t % D) * kPieces * kThreads;
#pragma unroll
      for (int r = 0; r < kPieces; ++r)
        cp_async16(stage + r * kThreads,
                   t < chunks ? l.w_row[r] + t * 256 : l.down_row(p, l.warp + ((t - chunks) * 8 + r) * W), true,
                   policy);
    }
    cp_async_commit();  // empty past the last step, so that every wait counts the same groups
  };
#pragma unroll
  for (int t = 0; t < D - 1; ++t) issue(t);
  for (int i = threadIdx.x; i < p.H / 8; i += kThreads) xs[i] = reinterpret_cast<const uint4*>(p.x)[i];
  __syncthreads();  // xs
  float acc[kPieces] = {}, hq[8];
  float* part = p.part + (int64_t(s) * p.slabs + j) * p.H;
  for (int t = 0; t < steps; ++t) {
    issue(t + D - 1);
    cp_async_wait<D - 1>();  // step t's pieces have landed (this thread's own slots)
    const uint4* stage = ring + (t % D) * kPieces * kThreads;
    uint4 w[kPieces];
#pragma unroll
    for (int r = 0; r < kPieces; ++r) w[r] = stage[r * kThreads];
    if (t < chunks) {
      gate_up_piece(w, xs[t * 32 + l.lane], acc);
      if (t == chunks - 1) {
        gate_up_to_hs(acc, hs, l.warp, l.lane);
        if (!p.ye) pdl_trigger();  // as in one_token_kernel
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 8; ++i) hq[i] = hs[l.q * 8 + i];
      }
    } else {
#pragma unroll
      for (int u = 0; u < kPieces; ++u) {
        const int g = l.warp + ((t - chunks) * 8 + u) * W;
        down_piece<L::kLanes>(w[u], hq, l.q == 0, part + g * L::kRowsAtOnce + l.rr);
      }
    }
  }
  if (p.ye) sum_slot(p, s, j, row);
}

constexpr int kRingSteps = 3;
constexpr size_t kRingBytes = size_t(kRingSteps) * 8 * 512 * sizeof(uint4);  // D x 8 pieces x 16 warps' lanes

// A launch shape: its name (MOESERVE_MOE_ONE_TOKEN), F features a block, its kernel and warps,
// shared memory beyond the token's row, and the hidden sizes it takes (a multiple of `h_step`).
struct Shape {
  const char* name;
  int F;
  void (*kernel)(Params);
  int warps;
  size_t ring;
  int h_step;
};
// First that fits: the ring; the same slabs with register loads; two blocks an SM of half the
// width, for more blocks than multiprocessors.
constexpr Shape kShapes[] = {{"ring", 64, one_token_ring_kernel<16, kRingSteps>, 16, kRingBytes, 512},
                             {"64", 64, one_token_kernel<64, 16, 1>, 16, 0, 256},
                             {"32", 32, one_token_kernel<32, 8, 2>, 8, 0, 256}};

// The experts' addresses in shared memory (stage_expert_table).
constexpr size_t table_bytes(int64_t experts) { return size_t(3) * experts * sizeof(void*); }

// Blocks of shape i a multiprocessor holds, asked once a GPU with the largest row's shared memory
// (every shape is bound by its registers or its ring, not by the row), its shared memory allowed
// first: a decode step without graphs asks at every MoE layer.
int blocks_per_sm(size_t i) {
  static PerDeviceOnce once[std::size(kShapes)];
  static int blocks[64][std::size(kShapes)];
  const Shape& sh = kShapes[i];
  const int dev = current_device();
  once[i]([&] {
    const size_t smem = kMaxHidden * sizeof(bf16) + sh.ring + table_bytes(kMaxExperts);
    if (sh.ring) MS_CUDA(cudaFuncSetAttribute(sh.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    MS_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks[dev][i], sh.kernel, sh.warps * 32, smem));
  });
  return blocks[dev][i];
}

// Whether shape i takes K slots of I features of a hidden size H at once on this GPU (every
// block resident).
bool fits(size_t i, int64_t K, int64_t H, int64_t I) {
  const Shape& sh = kShapes[i];
  return I % sh.F == 0 && H % sh.h_step == 0 && int64_t(blocks_per_sm(i)) * sm_count() >= K * (I / sh.F);
}

// Both entry points: the first launch shape that takes the slots (MOESERVE_MOE_ONE_TOKEN: 0 off;
// unset or 1 the first shape that fits; a shape's name, ring, 64 or 32, that shape only), its
// partials into `parts` and, with ye, their sums into ye. Returns slabs (0: nothing launched).
int launch_one_token(const Tensor& x, const Tensor& ids, const Tensor& row_of, const ExpertTable& t, int first,
                     float* ye, Tensor& parts) {
  const char* env = std::getenv("MOESERVE_MOE_ONE_TOKEN");
  const std::string_view mode = env ? env : "1";
  if (mode == "0") return 0;
  const int64_t H = t.hidden, I = t.intermediate, K = ids.numel();
  if (t.fp8 || x.size(0) != 1 || x.size(1) != H || H % 256 != 0 || H > kMaxHidden || K > kMaxSlots ||
      t.gate_up.ld % 8 != 0 || t.down.ld % 8 != 0 || !aligned16(x.raw(), 0) || !t.gate_up.w || !t.gate_up.w2 ||
      !t.down.w || t.experts > kMaxExperts)
    return 0;
  for (size_t i = 0; i < std::size(kShapes); ++i) {
    const Shape& sh = kShapes[i];
    if ((mode != "1" && mode != sh.name) || !fits(i, K, H, I)) continue;
    const size_t smem = size_t(H) * sizeof(bf16) + sh.ring + table_bytes(t.experts);
    const int slabs = int(I / sh.F);
    parts = scratch(DType::F32, {K * slabs, H});
    Params p{x.data<bf16>(), ids.data<int32_t>(), row_of.data<int32_t>(), t.gate_up.w, t.gate_up.w2, t.down.w,
             t.gate_up.ld, t.down.ld, first, t.experts, int(H), slabs, int((H + slabs - 1) / slabs),
             parts.data<float>(), ye, weights_evict_first()};
    launch_pdl(sh.kernel, dim3(unsigned(slabs), unsigned(K)), dim3(unsigned(sh.warps * 32)), smem, p);
    return slabs;
  }
  return 0;
}

}  // namespace

bool one_token_experts(const Tensor& x, const Tensor& ids, const Tensor& row_of, const ExpertTable& t, int first,
                       Tensor& ye) {
  Tensor parts;
  return launch_one_token(x, ids, row_of, t, first, ye.data<float>(), parts) > 0;
}

int one_token_expert_parts(const Tensor& x, const Tensor& ids, const Tensor& row_of, const ExpertTable& t, int first,
                           Tensor& parts) {
  return launch_one_token(x, ids, row_of, t, first, nullptr, parts);
}

}  // namespace ms::cuda
