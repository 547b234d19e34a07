// The batch-1 routed experts in one kernel (moe_experts_fused.h). Block (slot, slice) serves
// group active[slot] (expert e) and:
//   1. asks the copy engine for its `down_rows` rows of e's down weight, into shared memory
//      (rows padded by 16 bytes, so the lanes of a quarter warp read distinct banks);
//   2. computes its `gu_slabs` slabs of 16 intermediate features, silu(x . gate) * (x . up),
//      as gemv_kernel's blocks would (split_gu "virtual warps" over K, summed in their order),
//      and writes them, rounded to BF16, to act;
//   3. meets e's other blocks at a counter in global memory (all are resident: one block a
//      multiprocessor at most, groups x slices <= SMs);
//   4. reads e's whole act rows from L2 and multiplies its staged down rows by them, each
//      output's chunks summed as gemv's split_down warps would, into ye (F32).
#include "kernels/cuda/moe_experts_fused.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/mma.h"

namespace ms::cuda {
namespace {

constexpr int kChunk = 64;     // k a warp step (gemv.cu's)
constexpr int kSlab = 16;      // output features an mma tile
constexpr int kU = 2;          // chunks of a [gate | up] task in flight (gemv's unroll for SwiGLU)
constexpr int kMaxRows = 8;    // rows an expert: one mma tile
constexpr int kMaxSlots = 64;  // groups a launch
constexpr int kMaxWarps = 16;
constexpr int kPad = 16;       // bytes after each staged row

// Blocks of a slot that have reached the meeting point, and the meetings held: the last block
// to arrive resets the count and bumps the generation that the others wait on.
__device__ unsigned g_slot_arrived[kMaxSlots], g_slot_generation[kMaxSlots];

struct FusedParams {
  const void* const* gate;
  const void* const* up;
  const void* const* down;
  int64_t gu_ld, down_ld;  // row strides in elements
  GemvRows rows;
  GemvInput in;
  bf16* act;
  float* ye;
  int H, I, gu_slabs, down_rows, hs_rows;
};

__device__ __forceinline__ uint32_t shared_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void unpack_pairs(uint4 lo, uint4 hi, uint32_t (&r)[8]) {
  r[0] = lo.x, r[1] = lo.y, r[2] = lo.z, r[3] = lo.w, r[4] = hi.x, r[5] = hi.y, r[6] = hi.z, r[7] = hi.w;
}
// 16 consecutive bf16 (16-byte aligned) as 8 pair registers: from global memory through the
// read-only path (weights, and inputs an earlier kernel wrote), or from shared memory.
__device__ __forceinline__ void load16(const bf16* p, uint32_t (&r)[8]) {
  const uint4* s = reinterpret_cast<const uint4*>(p);
  unpack_pairs(__ldg(s), __ldg(s + 1), r);
}
__device__ __forceinline__ void load16_shared(const void* p, uint32_t (&r)[8]) {
  const uint4* s = reinterpret_cast<const uint4*>(p);
  unpack_pairs(s[0], s[1], r);
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Called by one thread of each of the `blocks` blocks of `slot`, after a __syncthreads that
// follows the block's writes; returns when all have called it, their writes visible.
__device__ void slot_barrier(int slot, unsigned blocks) {
  const unsigned seen = load_acquire(&g_slot_generation[slot]);  // cannot move on before we arrive
  __threadfence();
  if (atomicAdd(&g_slot_arrived[slot], 1u) == blocks - 1) {
    g_slot_arrived[slot] = 0;  // no block of the next launch arrives before this one has ended
    __threadfence();
    store_release(&g_slot_generation[slot], seen + 1);
  } else {
    while (load_acquire(&g_slot_generation[slot]) == seen) {
    }
  }
  __threadfence();
}

template <int SPLIT_GU, int SPLIT_DOWN>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) fused_experts_kernel(FusedParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int H = p.H, I = p.I, stride = 2 * I + kPad;
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  unsigned char* hs = smem + 16;                                  // [hs_rows][stride]: e's act rows
  float* red = reinterpret_cast<float*>(hs + p.hs_rows * stride);  // [gu_slabs][SPLIT_GU][2][16][8]
  unsigned char* wd = reinterpret_cast<unsigned char*>(red + p.gu_slabs * SPLIT_GU * 2 * kSlab * 8);
  const int W = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const uint32_t bar_addr = shared_addr(bar);
  if (threadIdx.x == 0) {
    wg::mbar_init(bar_addr, 1);
    wg::mbar_init_fence();
  }
  __syncthreads();
  pdl_wait();  // the routing (active, offsets, x_rows) and x are the kernels' before
  pdl_trigger();
  const int slot = blockIdx.x, slice = blockIdx.y;
  if (slot >= *p.rows.n_active) return;  // every block of the slot returns: none waits for it
  const int e = p.rows.active[slot];
  const int r0 = p.rows.offsets[e], rows = p.rows.offsets[e + 1] - r0;

  // 1. This block's down rows into shared memory, a bulk copy a row.
  const int n_begin = slice * p.down_rows, n_count = max(0, min(H - n_begin, p.down_rows));
  if (warp == 0) {
    if (lane == 0) wg::mbar_arrive_expect_tx(bar_addr, uint32_t(n_count) * 2 * I);
    __syncwarp();
    const char* down = static_cast<const char*>(p.down[e]);
    for (int i = lane; i < n_count; i += 32)
      wg::bulk_copy_to_shared(shared_addr(wd + i * stride), down + int64_t(n_begin + i) * p.down_ld * 2, 2 * I,
                              bar_addr);
  }

  // 2. [gate | up] of this block's slabs: task (slab, v) is what warp v of gemv_kernel's block
  // for that slab computes (chunks v, v + SPLIT_GU, ... in order).
  const int chunks_h = H / kChunk, slab0 = slice * p.gu_slabs;
  const int slabs = max(0, min(I / kSlab - slab0, p.gu_slabs));
  const int src = g < rows ? (p.in.x_rows ? p.in.x_rows[r0 + g] : r0 + g) : -1;
  const bf16* gate = static_cast<const bf16*>(p.gate[e]);
  const bf16* up = static_cast<const bf16*>(p.up[e]);
  for (int task = warp; task < slabs * SPLIT_GU; task += W) {
    const int ls = task / SPLIT_GU, v = task % SPLIT_GU, n0 = (slab0 + ls) * kSlab;
    const bf16* wrow[2][2] = {{gate + int64_t(n0 + g) * p.gu_ld, gate + int64_t(n0 + g + 8) * p.gu_ld},
                              {up + int64_t(n0 + g) * p.gu_ld, up + int64_t(n0 + g + 8) * p.gu_ld}};
    float acc[2][4] = {};
    for (int c0 = v; c0 < chunks_h; c0 += SPLIT_GU * kU) {
      uint32_t a[kU][2][2][8], xs[kU][8];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int c = c0 + u * SPLIT_GU, k0 = c * kChunk + q * 16;
        if (c >= chunks_h) break;
#pragma unroll
        for (int m = 0; m < 2; ++m) load16(wrow[m][0] + k0, a[u][m][0]), load16(wrow[m][1] + k0, a[u][m][1]);
        if (src >= 0) load16(p.in.x + int64_t(src) * p.in.x_ld + k0, xs[u]);
        else
#pragma unroll
          for (int i = 0; i < 8; ++i) xs[u][i] = 0;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (c0 + u * SPLIT_GU >= chunks_h) break;
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
          for (int m = 0; m < 2; ++m) {
            const uint32_t frag[4] = {a[u][m][0][2 * s], a[u][m][1][2 * s], a[u][m][0][2 * s + 1],
                                      a[u][m][1][2 * s + 1]};
            mma_bf16(acc[m], frag, xs[u][2 * s], xs[u][2 * s + 1]);
          }
      }
    }
    // Lane (g, q) holds features g and g + 8 for rows 2q and 2q + 1.
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      float* r = red + ((ls * SPLIT_GU + v) * 2 + m) * kSlab * 8;
      r[g * 8 + 2 * q] = acc[m][0], r[g * 8 + 2 * q + 1] = acc[m][1];
      r[(g + 8) * 8 + 2 * q] = acc[m][2], r[(g + 8) * 8 + 2 * q + 1] = acc[m][3];
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < slabs * kSlab * 8; i += blockDim.x) {
    const int ls = i / (kSlab * 8), row = (i / kSlab) % 8, f = i % kSlab;
    if (row >= rows) continue;
    float sum[2];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      sum[m] = 0.f;
#pragma unroll
      for (int v = 0; v < SPLIT_GU; ++v) sum[m] += red[((ls * SPLIT_GU + v) * 2 + m) * kSlab * 8 + f * 8 + row];
    }
    const float out = sum[0] / (1.0f + expf(-sum[0])) * sum[1];
    p.act[int64_t(r0 + row) * I + (slab0 + ls) * kSlab + f] = __float2bfloat16_rn(out);
  }

  // 3. Every block of e has written its features.
  __syncthreads();
  if (threadIdx.x == 0) slot_barrier(slot, gridDim.y);
  __syncthreads();

  // 4. e's act rows (written in this kernel: read past L1), then the staged down rows.
  const int pieces = I / 8;  // 16-byte pieces a row
  for (int i = threadIdx.x; i < rows * pieces; i += blockDim.x) {
    const int row = i / pieces, c = i % pieces;
    reinterpret_cast<uint4*>(hs + row * stride)[c] =
        __ldcg(reinterpret_cast<const uint4*>(p.act + int64_t(r0 + row) * I) + c);
  }
  wg::mbar_wait(bar_addr, 0);
  __syncthreads();
  const int chunks_i = I / kChunk;
  for (int ls = warp; ls * kSlab < n_count; ls += W) {
    const unsigned char* w0 = wd + (ls * kSlab + g) * stride + q * 32;
    const unsigned char* w1 = w0 + 8 * stride;
    const unsigned char* xr = hs + g * stride + q * 32;
    float acc[SPLIT_DOWN][4] = {};
    for (int c0 = 0; c0 < chunks_i; c0 += SPLIT_DOWN) {
#pragma unroll
      for (int v = 0; v < SPLIT_DOWN; ++v) {  // chunk c0 + v is warp v's of gemv_kernel's block
        const int c = c0 + v;
        if (c >= chunks_i) break;
        uint32_t a0[8], a1[8], x[8] = {};
        load16_shared(w0 + c * kChunk * 2, a0);
        load16_shared(w1 + c * kChunk * 2, a1);
        if (g < rows) load16_shared(xr + c * kChunk * 2, x);
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const uint32_t frag[4] = {a0[2 * s], a1[2 * s], a0[2 * s + 1], a1[2 * s + 1]};
          mma_bf16(acc[v], frag, x[2 * s], x[2 * s + 1]);
        }
      }
    }
    float out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      out[i] = 0.f;
#pragma unroll
      for (int v = 0; v < SPLIT_DOWN; ++v) out[i] += acc[v][i];
    }
    const int n = n_begin + ls * kSlab + g;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int row = 2 * q + j;
      if (row >= rows) continue;
      float* y = p.ye + int64_t(r0 + row) * H;
      y[n] = out[j], y[n + 8] = out[2 + j];
    }
  }
}

template <int SPLIT_GU, int SPLIT_DOWN>
void launch(const FusedExpertsPlan& plan, const FusedParams& p, int groups) {
  static PerDeviceOnce once;
  once([] {
    int optin = 0;
    MS_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()));
    MS_CUDA(cudaFuncSetAttribute(fused_experts_kernel<SPLIT_GU, SPLIT_DOWN>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  });
  launch_pdl(fused_experts_kernel<SPLIT_GU, SPLIT_DOWN>, dim3(unsigned(groups), unsigned(plan.slices)),
             dim3(unsigned(plan.warps * 32)), plan.smem, p);
}

bool disabled() {
  const char* v = std::getenv("MOESERVE_MOE_FUSED");
  return v && std::strcmp(v, "0") == 0;
}

int max_shared_bytes() {
  int optin = 0;
  MS_CUDA(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, current_device()));
  return optin;
}

}  // namespace

std::optional<FusedExpertsPlan> fused_experts_plan(const ExpertTable& t, const GemvRows& rows, int64_t tokens) {
  const int64_t H = t.hidden, I = t.intermediate;
  const int groups = rows.max_groups;
  if (disabled() || t.fp8 || !hopper() || tokens < 1 || tokens > kMaxRows || groups < 1 || groups > kMaxSlots ||
      H % kChunk != 0 || I % kChunk != 0 || t.gate_up.ld % 8 != 0 || t.down.ld % 8 != 0)
    return std::nullopt;
  FusedExpertsPlan plan;
  plan.slices = int(std::min<int64_t>(sm_count() / groups, I / kSlab));
  if (plan.slices < 1) return std::nullopt;
  // gemv's sums, grouped as its automatic launch (or the tuning a bench set) groups them.
  const GemvTuning tune = gemv_tuning();
  plan.split_gu = tune.warps ? tune.warps : gemv_split_warps(I, H, rows.expected_groups);
  plan.split_down = tune.warps ? tune.warps : gemv_split_warps(H, I, rows.expected_groups);
  const auto supported = [](int s) { return s == 4 || s == 8; };
  if (!supported(plan.split_gu) || !supported(plan.split_down)) return std::nullopt;
  plan.gu_slabs = int((I / kSlab + plan.slices - 1) / plan.slices);
  plan.down_rows = int((H / kSlab + plan.slices - 1) / plan.slices) * kSlab;
  plan.warps = std::clamp(std::max(plan.gu_slabs * plan.split_gu, plan.down_rows / kSlab), 1, kMaxWarps);
  const int64_t stride = 2 * I + kPad;
  plan.hs_rows = int(tokens);  // an expert's rows: at most one a token
  plan.smem = size_t(16 + plan.hs_rows * stride + int64_t(plan.gu_slabs) * plan.split_gu * 2 * kSlab * 8 * 4 +
                     plan.down_rows * stride);
  if (plan.smem > size_t(max_shared_bytes())) return std::nullopt;
  return plan;
}

void fused_experts(const FusedExpertsPlan& plan, const ExpertTable& t, const GemvRows& rows, const GemvInput& x,
                   bf16* act, float* ye) {
  const FusedParams p{t.gate_up.w, t.gate_up.w2, t.down.w, t.gate_up.ld, t.down.ld, rows, x, act, ye,
                      int(t.hidden), int(t.intermediate), plan.gu_slabs, plan.down_rows, plan.hs_rows};
  const int groups = rows.max_groups;
  if (plan.split_gu == 4 && plan.split_down == 4) launch<4, 4>(plan, p, groups);
  else if (plan.split_gu == 4) launch<4, 8>(plan, p, groups);
  else if (plan.split_down == 4) launch<8, 4>(plan, p, groups);
  else launch<8, 8>(plan, p, groups);
}

}  // namespace ms::cuda
