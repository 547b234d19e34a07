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
// Before the wait for the kernel before it (launched early: launch_pdl), the block asks L2 for
// its split's first keys (prefetch_keys), so that the stream of the cache overlaps that kernel;
// MOESERVE_GQA_DECODE_PREFETCH=0 (read per call) leaves that out, for the bench to compare.
//
// Split-KV merges in the kernel itself, with no second kernel: the splits of one (query, KV
// head) count their partials on a device counter, and the one that completes a group of fan_in
// splits merges the group; the one that completes the groups merges those into the output
// (merge_splits). The counters go back to 0 as they complete, so every launch, eager or replayed
// from a graph, finds them zeroed.
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/mma.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace ms::cuda {
namespace {

constexpr int kD = 128, kStep = 16, kWarps = 4, kStages = 3;
constexpr int kPieces = 16;                        // 16-byte pieces a lane copies a step: 8 of K, 8 of V
constexpr int kRing = kStages * kPieces * 32;      // uint4 a warp
constexpr int kAccStride = kD + 8;                 // merge rows: float2 stores of a warp hit 32 banks
constexpr size_t kSmem = size_t(kWarps) * kRing * 16;  // 96 KB: two blocks a multiprocessor
static_assert(size_t(kWarps) * 16 * (kAccStride + 2) * 4 <= kSmem, "the merge reuses the ring");
// Keys a block prefetches into L2 before its wait: 64 KB of K and V a block, at most 17 MB for
// the 264 blocks an H200 holds at once, a third of its L2. Batch-1 decode at 4k keys (128 keys
// a split) so has all of its 8.4 MB asked for before the wait.
constexpr int kPrefetchKeys = 128;
constexpr int kFlatMerge = 16;     // up to this many splits merge in one level (two loads a thread)
constexpr int kMergeBatch = 8;     // partials a merging thread loads at once
constexpr int kArrivals = 4096;    // counters: (queries x KV heads) x (groups + 1) must fit

// Splits of the running launch that have written their partials, per (query, KV head) and group
// of splits, then per (query, KV head) the groups merged (see merge_splits). One stream a GPU
// runs these launches one after another (each waits for the kernel before it to finish before it
// counts), and each leaves every counter at 0, so one set a GPU serves them all.
__device__ unsigned g_split_arrivals[kArrivals] = {};

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
    const int64_t prow = ((int64_t(t) * p.Hkv + kvh) * p.splits + blockIdx.z) * group + row;
    p.part_acc[prow * kD + pos] = acc;  // in the smem order: coalesced, and merge_partials reads it so
    if (pos == 0) p.part_ml[2 * prow] = M, p.part_ml[2 * prow + 1] = L;  // empty split: -inf, 0
  }
}

// Whether this block is the last of `n` to arrive at `count` (each arrives once), which it then
// resets. What any thread of the arriving blocks wrote before the call is seen by the last one's
// threads after it (as cooperative groups' grid sync: the barrier, then one thread's fences).
__device__ bool last_to_arrive(unsigned* count, int n) {
  __syncthreads();
  bool last = false;
  if (threadIdx.x == 0) {
    __threadfence();  // the block's writes, ordered before this by the barrier, before it counts
    last = atomicAdd(count, 1u) == unsigned(n) - 1;
    if (last) *count = 0u, __threadfence();  // all n are in: nothing else touches it in this launch
  }
  return __syncthreads_or(last);
}

// Merges n partials of (query t, KV head kvh), those of splits first, first + step, ...: into
// the output (final), else into the partial of split `first`. A thread takes 8 dims of a row
// (two float4: dims 16i + c of the output), loading the (max, sum) and dims of kMergeBatch
// splits at once, so that a merge of up to 8 splits (8 heads) is one round trip to L2, where
// the other blocks' partials are (__ldcg).
__device__ void merge_partials(const GqaDecodeLaunch& p, int t, int kvh, int first, int n, int step, bool final) {
  constexpr int kCols = kD / 8;  // threads a row
  const int group = p.Hq / p.Hkv, items = group * kCols;
  const int64_t base = (int64_t(t) * p.Hkv + kvh) * p.splits;  // the partial of split 0
  float4* acc4 = reinterpret_cast<float4*>(p.part_acc);
  float2* ml2 = reinterpret_cast<float2*>(p.part_ml);
  for (int i0 = 0; i0 < items; i0 += blockDim.x) {  // every thread runs every pass (the __syncwarp)
    const int item = i0 + int(threadIdx.x), row = item / kCols, c = item % kCols;
    const bool mine = item < items;
    float m = -INFINITY, l = 0.f, acc[8] = {};
    for (int z0 = 0; z0 < n; z0 += kMergeBatch) {
      float2 ml[kMergeBatch];
      float4 a[kMergeBatch][2];
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b) {
        const bool in = mine && z0 + b < n;
        const int64_t r = (base + first + int64_t(in ? z0 + b : 0) * step) * group + (mine ? row : 0);
        ml[b] = in ? __ldcg(ml2 + r) : make_float2(-INFINITY, 0.f);
#pragma unroll
        for (int h = 0; h < 2; ++h)
          a[b][h] = in ? __ldcg(acc4 + r * (kD / 4) + 2 * c + h) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int b = 0; b < kMergeBatch; ++b) {
        const float m_new = fmaxf(m, ml[b].x);
        if (m_new == -INFINITY) continue;  // no keys so far, nor in this split
        const float keep = exp2f(m - m_new), w = exp2f(ml[b].x - m_new);  // an empty split weighs nothing
        const float* af = reinterpret_cast<const float*>(a[b]);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = acc[i] * keep + af[i] * w;
        l = l * keep + ml[b].y * w, m = m_new;
      }
    }
    if (!final) {
      __syncwarp();  // the row's (max, sum), read by its lanes (of this warp), before its lane 0 overwrites it
      if (!mine) continue;
      const int64_t r = (base + first) * group + row;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        acc4[r * (kD / 4) + 2 * c + h] = make_float4(acc[4 * h], acc[4 * h + 1], acc[4 * h + 2], acc[4 * h + 3]);
      if (c == 0) ml2[r] = make_float2(m, l);
      continue;
    }
    if (!mine) continue;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    bf16* o = p.out + int64_t(t) * p.o_s0 + int64_t(kvh * group + row) * p.o_s1;
#pragma unroll
    for (int i = 0; i < 8; ++i) o[16 * i + c] = __float2bfloat16_rn(acc[i] * inv);  // pos 8c + i
  }
}

// After the block wrote its partial: split z is in group z / fan_in; the group's last block
// merges the group (one group: into the output), and the last group's merger merges the groups'
// results (each in the partial of its group's first split) into the output. A level costs a
// counter's round trip to L2 and one load of up to kMergeBatch partials a thread: up to 16
// splits merge flat (two loads), more in groups of about sqrt(splits). With 33 splits (batch 1
// at 4k keys), 6 groups of up to 6: two merges of 6 partials (24 KB for 8 heads) one after the
// other, where one block would read 33 (132 KB, five loads a thread, ~1 us at an SM's share of
// L2 bandwidth), and the merge kernel cost 3.6 us.
__device__ void merge_splits(const GqaDecodeLaunch& p, int fan_in, int t, int kvh) {
  const int pair = t * p.Hkv + kvh, groups = (p.splits + fan_in - 1) / fan_in;
  const int grp = int(blockIdx.z) / fan_in, first = grp * fan_in, n = min(fan_in, p.splits - first);
  if (!last_to_arrive(g_split_arrivals + pair * groups + grp, n)) return;
  merge_partials(p, t, kvh, first, n, 1, groups == 1);
  if (groups == 1 || !last_to_arrive(g_split_arrivals + p.T * p.Hkv * groups + pair, groups)) return;
  merge_partials(p, t, kvh, 0, groups, fan_in, true);
}

// L2 prefetches of the split's first `keys` keys (every line of their K and V rows), one key a
// thread. A prefetch has no effect on values, so it may run before the wait even for a key the
// kernel before this one is writing: L2 is where both meet.
__device__ void prefetch_keys(const GqaDecodeLaunch& p, const int32_t* slots, int kb, int ke, int kvh, int keys) {
  const int n = min(ke - kb, keys);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t s = slots[kb + i];
    const uintptr_t rows[2] = {reinterpret_cast<uintptr_t>(p.k + s * p.k_s0 + int64_t(kvh) * p.k_s1),
                               reinterpret_cast<uintptr_t>(p.v + s * p.v_s0 + int64_t(kvh) * p.v_s1)};
#pragma unroll
    for (uintptr_t r : rows)
      for (uintptr_t line = r & ~uintptr_t(127); line < r + kD * sizeof(bf16); line += 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
}

__global__ void __launch_bounds__(kWarps * 32, 2) flash_decode_kernel(GqaDecodeLaunch p, int fan_in, int prefetch) {
  extern __shared__ uint4 ring[];  // [kWarps][kStages][kPieces][32]
  pdl_trigger();  // the kernel after this may launch: it waits for this one to finish
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
  prefetch_keys(p, slots, kb, ke, kvh, prefetch);
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
  if (p.splits > 1) merge_splits(p, fan_in, t, kvh);
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
  // Groups of about sqrt(splits) splits balance the two levels of the merge (merge_splits).
  const int fan_in = l.splits <= kFlatMerge ? l.splits : int(std::ceil(std::sqrt(double(l.splits))));
  const int64_t groups = (l.splits + fan_in - 1) / fan_in;
  MS_CHECK(l.splits == 1 || int64_t(l.T) * l.Hkv * (groups + 1) <= kArrivals, "flash_decode: ", l.T, " queries x ",
           l.Hkv, " KV heads in ", l.splits, " splits exceed the merge's counters");
  dim3 grid(unsigned(l.T), unsigned(l.Hkv), unsigned(l.splits));
  const char* env = std::getenv("MOESERVE_GQA_DECODE_PREFETCH");
  const int prefetch = env && std::string_view(env) == "0" ? 0 : kPrefetchKeys;
  launch_pdl(flash_decode_kernel, grid, dim3(kWarps * 32), kSmem, l, fan_in, prefetch);
  MS_CUDA_LAUNCHED("flash_decode_kernel");
}

}  // namespace ms::cuda
