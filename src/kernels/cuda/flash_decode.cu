// GQA decode on the tensor cores (flash_prefill.h). A block of 4 warps takes one (query, KV head,
// split of the keys); its warps take turns over the split's 16-key steps (warp w: steps w, w + 4,
// ...) and merge their softmaxes in shared memory at the end, so a split writes one partial for 4
// warps' keys. The query heads sharing the KV head are the rows of mma.m16n8k16 (up to 16), keys
// its columns for S = Q K^T and its k for O += P V. Since a dot product does not care in which
// order it sums, the dims of Q and K (and the dims of V and O) are numbered so that each lane's
// pieces are contiguous: lane (g, q) holds dims 32q .. 32q + 31 of its Q and K rows, and dims
// 16g .. 16g + 15 of the V rows of keys 2q, 2q + 1, 2q + 8, 2q + 9 of each step.
//
// Decode reads every key once, so the kernel is a stream of the KV cache: each lane copies its
// own 16-byte pieces of a step with cp.async into a private ring of kStages steps in shared
// memory (piece c of lane l at [c][l]: conflict-free), keeping kStages - 1 steps (16 KB a warp)
// in flight while it computes one; the slot indices of a step are loaded one step before its
// copies are issued. A lane reads back only what it copied itself, so the ring needs no barrier.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/mma.h"

#include <algorithm>
#include <cmath>

namespace ms::cuda {
namespace {

constexpr int kD = 128, kStep = 16, kWarps = 4, kStages = 3;
constexpr int kPieces = 16;                        // 16-byte pieces a lane copies a step: 8 of K, 8 of V
constexpr int kRing = kStages * kPieces * 32;      // uint4 a warp
constexpr int kAccStride = kD + 8;                 // merge rows: float2 stores of a warp hit 32 banks
constexpr size_t kSmem = size_t(kWarps) * kRing * 16;  // 96 KB: two blocks a multiprocessor
static_assert(size_t(kWarps) * 16 * (kAccStride + 2) * 4 <= kSmem, "the merge reuses the ring");

// The cache slots of one step's keys that lane (g, q) copies (-1: past the split's end).
struct StepSlots {
  int k[2], v[4];
};

__device__ __forceinline__ StepSlots step_slots(const int32_t* slots, int k0, int ke, int g, int q) {
  StepSlots s;
#pragma unroll
  for (int n = 0; n < 2; ++n) s.k[n] = k0 + 8 * n + g < ke ? slots[k0 + 8 * n + g] : -1;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = k0 + (i >> 1) * 8 + 2 * q + (i & 1);
    s.v[i] = key < ke ? slots[key] : -1;
  }
  return s;
}

// Issues the copies of one step into `dst` (this lane's pieces of one ring stage).
__device__ __forceinline__ void issue_step(uint4* dst, const StepSlots& s, const bf16* kbase, int64_t k_s0,
                                           const bf16* vbase, int64_t v_s0) {
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const bf16* src = kbase + (s.k[n] >= 0 ? int64_t(s.k[n]) * k_s0 : 0);
#pragma unroll
    for (int i = 0; i < 4; ++i) cp_async16(dst + (4 * n + i) * 32, src + 8 * i, s.k[n] >= 0);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bf16* src = vbase + (s.v[i] >= 0 ? int64_t(s.v[i]) * v_s0 : 0);
#pragma unroll
    for (int j = 0; j < 2; ++j) cp_async16(dst + (8 + 2 * i + j) * 32, src + 8 * j, s.v[i] >= 0);
  }
}

__device__ __forceinline__ void unpack(const uint4& v, uint32_t* w) { w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w; }

// Online softmax and P V of the step whose pieces lie at `st`, keys k0 .. k0 + 15 (those from ke
// on masked). Rows g (values 0, 1) and g + 8 (values 2, 3) of S; a quad shares a row.
__device__ __forceinline__ void compute_step(const uint4* st, const uint32_t (&qa)[kD / 16][4], int k0, int ke,
                                             int q, float scale_log2, float (&o)[kD / 8][4], float (&m)[2],
                                             float (&l)[2]) {
  uint32_t kw[2][16], vw[4][8];
#pragma unroll
  for (int c = 0; c < 8; ++c) unpack(st[c * 32], &kw[c / 4][4 * (c % 4)]);
#pragma unroll
  for (int c = 0; c < 8; ++c) unpack(st[(8 + c) * 32], &vw[c / 2][4 * (c % 2)]);
  float s[2][4] = {};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int st16 = 0; st16 < kD / 16; ++st16) mma_bf16(s[n], qa[st16], kw[n][2 * st16], kw[n][2 * st16 + 1]);
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
    const float m_new = fmaxf(m[r], tile_max[r]);  // finite: key k0 < ke is in every step
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

// The block's 4 softmaxes (max in log2 units and sum per row, unnormalised O) into one: the
// output itself when there is one split, else the split's partial. smem holds the warps' O with
// dims reordered (dim 16j + dn at 8dn + j) so that both the stores and the loads are
// conflict-free.
__device__ void merge_warps(float* smem, const GqaDecodeLaunch& p, int t, int kvh, const float (&o)[kD / 8][4],
                            const float (&m)[2], const float (&l)[2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4, group = p.Hq / p.Hkv;
  float* acc_s = smem;                                                          // [kWarps][16][kAccStride]
  float2* ml_s = reinterpret_cast<float2*>(smem + kWarps * 16 * kAccStride);  // [kWarps][16]
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = warp * 16 + g + 8 * r;
    if (q == 0) ml_s[row] = make_float2(m[r], l[r]);
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn)
      *reinterpret_cast<float2*>(acc_s + row * kAccStride + 8 * dn + 2 * q) = make_float2(o[dn][2 * r], o[dn][2 * r + 1]);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < group * kD; idx += blockDim.x) {
    const int row = idx / kD, pos = idx % kD, d = 16 * (pos % 8) + pos / 8, h = kvh * group + row;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, ml_s[w * 16 + row].x);
    float acc = 0.f, L = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float2 ml = ml_s[w * 16 + row];
      const float f = ml.x == -INFINITY ? 0.f : exp2f(ml.x - M);  // a warp without keys weighs nothing
      acc += f * acc_s[(w * 16 + row) * kAccStride + pos], L += f * ml.y;
    }
    if (p.splits == 1) {
      p.out[int64_t(t) * p.o_s0 + int64_t(h) * p.o_s1 + d] = __float2bfloat16_rn(L > 0.f ? acc / L : 0.f);
      continue;
    }
    const int64_t prow = (int64_t(blockIdx.z) * p.T + t) * p.Hq + h;
    p.part_acc[prow * kD + d] = acc;
    if (pos == 0) p.part_ml[2 * prow] = M * float(M_LN2), p.part_ml[2 * prow + 1] = L;  // empty split: -inf, 0
  }
}

__global__ void __launch_bounds__(kWarps * 32, 2) flash_decode_kernel(GqaDecodeLaunch p) {
  extern __shared__ uint4 ring[];  // [kWarps][kStages][kPieces][32]
  pdl_trigger();  // the merge after this may launch: it waits for these partials
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int t = blockIdx.x, kvh = blockIdx.y, group = p.Hq / p.Hkv;
  const int kv0 = p.kv_begin[t], visible = p.visible[t];
  const int len = p.split_len > 0 ? p.split_len : ((visible + p.splits - 1) / p.splits + 31) / 32 * 32;
  const int kb = min(visible, int(blockIdx.z) * len), ke = min(visible, kb + len);
  const int first = kb + kStep * warp, stride = kStep * kWarps;  // this warp's steps
  const int steps = first < ke ? (ke - first + stride - 1) / stride : 0;
  const int32_t* slots = p.slots + kv0;

  // The first kStages steps' slots, then their copies, before the query: every load the warp
  // can make without waiting is in flight at once. The slots are the step's metadata, on the
  // device before any kernel of the step ran, so they are read before the wait for the kernel
  // before this one (launched early: launch_pdl), whose writes (the query, the new keys) the
  // copies need.
  StepSlots sl[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) sl[s] = step_slots(slots, first + s * stride, ke, g, q);
  pdl_wait();
  const bf16* kbase = p.k + int64_t(kvh) * p.k_s1 + 32 * q;
  const bf16* vbase = p.v + int64_t(kvh) * p.v_s1 + 16 * g;
  uint4* mine = ring + warp * kRing + lane;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) issue_step(mine + s * kPieces * 32, sl[s], kbase, p.k_s0, vbase, p.v_s0);
    cp_async_commit();
  }
  uint32_t qa[kD / 16][4];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    const uint4* src = reinterpret_cast<const uint4*>(p.q + int64_t(t) * p.q_s0 + int64_t(kvh * group + row) * p.q_s1 + 32 * q);
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 4; ++i) unpack(row < group ? src[i] : make_uint4(0, 0, 0, 0), &w[4 * i]);
#pragma unroll
    for (int s = 0; s < kD / 16; ++s) qa[s][r] = w[2 * s], qa[s][2 + r] = w[2 * s + 1];
  }
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * float(M_LOG2E);

  StepSlots pending = sl[kStages - 1];
  for (int j = 0, stage = 0; j < steps; ++j, stage = stage + 1 == kStages ? 0 : stage + 1) {
    // Step j + kStages - 1 goes into the stage step j - 1 used. This lane's reads of it fed the
    // mma instructions of step j - 1, which are issued in order before these copies, so they
    // have completed.
    const int ahead = j + kStages - 1;
    const int ahead_stage = stage == 0 ? kStages - 1 : stage - 1;
    if (ahead < steps) issue_step(mine + ahead_stage * kPieces * 32, pending, kbase, p.k_s0, vbase, p.v_s0);
    cp_async_commit();
    pending = step_slots(slots, first + (ahead + 1) * stride, ke, g, q);
    cp_async_wait<kStages - 1>();  // step j has landed
    compute_step(mine + stage * kPieces * 32, qa, first + j * stride, ke, q, scale_log2, o, m, l);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncthreads();  // every warp is done with its ring: the merge reuses it
  merge_warps(reinterpret_cast<float*>(ring), p, t, kvh, o, m, l);
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

// Two resident blocks a multiprocessor (the ring's 96 KB each): 8 warps, each with two steps
// (16 KB) in flight, 128 KB an SM, which is past what the SM's share of the bandwidth needs
// over the memory latency (~30 KB). Rounded down, so that every block of the launch is resident
// at once (no second wave); at least 64 keys a split: one step for each of its warps.
// But no more splits than it takes for a block on every multiprocessor and every split's keys
// in flight at once (128: the ring's two steps ahead for each of 4 warps): past that, more
// splits put no more bytes in flight, only more partials to write and merge. Batch-1 decode at
// 4k keys (4 KV heads) takes 32 splits of 128 keys so, not 64 of 64: the same 64 KB in flight
// an SM, half the partials (0.5 MB) and half the merge.
int flash_decode_splits(int64_t T, int64_t Hkv, int max_visible) {
  const int64_t blocks = T * Hkv, sms = sm_count();
  const int64_t most = std::min<int64_t>(2 * sms / blocks, (max_visible + 63) / 64);
  const int64_t in_flight = int64_t(kWarps) * kStep * (kStages - 1);
  const int64_t enough = std::max<int64_t>((sms + blocks - 1) / blocks, (max_visible + in_flight - 1) / in_flight);
  return int(std::max<int64_t>(1, std::min(most, enough)));
}

void flash_decode(const GqaDecodeLaunch& l) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(flash_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
  });
  dim3 grid(unsigned(l.T), unsigned(l.Hkv), unsigned(l.splits));
  launch_pdl(flash_decode_kernel, grid, dim3(kWarps * 32), kSmem, l);
  MS_CUDA_LAUNCHED("flash_decode_kernel");
}

}  // namespace ms::cuda
