// GQA decode on the tensor cores (flash_prefill.h). A block of 4 warps takes one (query, KV head,
// split of the keys); its warps take turns over the split's 16-key steps (warp w: steps w, w + 4,
// ...) and merge their softmaxes in shared memory at the end, so a split writes one partial for 4
// warps' keys. The query heads sharing the KV head are the rows of mma.m16n8k16 (up to 16), keys
// its columns for S = Q K^T and its k for O += P V: flash_softmax.cuh's step, on 16 keys.
//
// Decode reads every key once, so the kernel is a stream of the KV cache: each warp copies the
// K and V rows of its steps with cp.async into a private ring of kStages steps in shared memory,
// keeping kStages - 1 steps (16 KB) in flight while it computes one; the slot indices of a step
// are loaded one step before its copies are issued. Each copy instruction reads two whole
// 256-byte rows (lanes 0-15 one key, 16-31 the next), so that every 32-byte sector it asks L2
// for is used whole: the stream's rate is bounded by the requests a multiprocessor can issue,
// and pieces scattered over half-used sectors took twice as many. Rows are padded to 272 bytes,
// which makes ldmatrix's 8 rows of a matrix hit 8 different bank quads. A lane reads rows other
// lanes copied, so the warp synchronises after its wait; no other warp touches its ring.
//
// With the step's rope (GqaDecodeRope, ROPE): every block norms and ropes its KV head's query
// heads itself into shared memory, a warp a head with rope_head.cuh's functions (the bits
// rope_store_kv_kernel stores), and the block whose split holds a query's new key writes it and
// its value into the caches before any of its warps copies that key. A decode step so has one
// kernel fewer; the rope's round trip after the wait is the kernel's own now (from the end of
// the projection to the end of this kernel took ~5.7 us a Qwen3 layer either way at batch 1;
// batch 64 gained 1.4 %: BENCHMARKS, session 26).
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/rope_head.cuh"

#include <algorithm>
#include <cmath>

namespace ms::cuda {
namespace {

constexpr int kD = 128, kStep = 16, kWarps = 4, kStages = 3;
constexpr int kRow = kD + 8;                            // bf16 a row in shared memory (16 bytes of padding)
constexpr int kStage = 2 * kStep * kRow;                // bf16 a stage: the step's K rows, then its V rows
constexpr int kRing = kStages * kStage;                 // bf16 a warp
constexpr size_t kSmem = size_t(kWarps) * kRing * 2;    // 102 KB: two blocks a multiprocessor
constexpr int kRopeHalf = kD / 2;                       // NeoX rope over the whole head
constexpr size_t kQSmem = size_t(16) * kRow * 2;        // ROPE: the roped query heads, 4 KB
using RopeHead = HeadRegs<2, 2>;                        // rope_store_kv_kernel's registers for 128 dims
constexpr int kAccStride = kD + 8;                      // merge rows: a warp's float2 stores hit 32 banks
static_assert(size_t(16) * kAccStride * 4 + 16 * 8 <= size_t(kRing) * 2, "a warp's merge rows fit its ring");

constexpr int kNoCopy = -2;  // a slot issue_step leaves alone: the row is written by st.shared (ROPE)

// The cache slot of key k0 + lane % 16 (-1: past the split's end; kNoCopy: the key `own`);
// issue_step hands them around.
__device__ __forceinline__ int lane_slot(const int32_t* slots, int k0, int ke, int own, int lane) {
  const int key = k0 + lane % kStep;
  return key == own ? kNoCopy : key < ke ? slots[key] : -1;
}

// Issues the copies of one step into the stage `st`: row r (K at st + r kRow, V kStep rows on)
// from lanes 16 (r % 2) .. + 15, 16 bytes each, at the slot lane r holds. Keys past the split's
// end are zero-filled; a kNoCopy row is not touched.
__device__ __forceinline__ void issue_step(bf16* st, int slot, int lane, const bf16* kbase, int64_t k_s0,
                                           const bf16* vbase, int64_t v_s0) {
  const int c = 8 * (lane % 16);
#pragma unroll
  for (int i = 0; i < kStep / 2; ++i) {
    const int row = 2 * i + lane / 16, s = __shfl_sync(0xffffffffu, slot, row);
    if (s == kNoCopy) continue;
    const int64_t at = s >= 0 ? s : 0;
    cp_async16(st + row * kRow + c, kbase + at * k_s0 + c, s >= 0);
    cp_async16(st + (kStep + row) * kRow + c, vbase + at * v_s0 + c, s >= 0);
  }
}

// The block's 4 softmaxes (max in log2 units and sum per row, unnormalised O) into one: the
// output itself when there is one split, else the split's partial. Each warp leaves its rows in
// its own ring (done with it), so one barrier suffices; then each warp merges whole rows, a
// float4 of dims a lane: the (max, sum) loads are broadcasts, the row's 4 weights are computed
// once for 4 dims, and the stores are contiguous.
__device__ void merge_warps(bf16* ring, const GqaDecodeLaunch& p, int t, int kvh, const float (&o)[kD / 8][4],
                            const float (&m)[2], const float (&l)[2]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4, group = p.Hq / p.Hkv;
  auto acc_of = [&](int w) { return reinterpret_cast<float*>(ring + w * kRing); };  // [16][kAccStride]
  auto ml_of = [&](int w) { return reinterpret_cast<float2*>(acc_of(w) + 16 * kAccStride); };  // [16]
  float* acc_s = acc_of(warp);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = g + 8 * r;
    if (q == 0) ml_of(warp)[row] = make_float2(m[r], l[r]);
#pragma unroll
    for (int dn = 0; dn < kD / 8; ++dn)
      *reinterpret_cast<float2*>(acc_s + row * kAccStride + 8 * dn + 2 * q) = make_float2(o[dn][2 * r], o[dn][2 * r + 1]);
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < group * (kD / 4); idx += blockDim.x) {
    const int row = idx / (kD / 4), d = 4 * (idx % (kD / 4)), h = kvh * group + row;
    float2 ml[kWarps];
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) ml[w] = ml_of(w)[row], M = fmaxf(M, ml[w].x);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float L = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = ml[w].x == -INFINITY ? 0.f : exp2f(ml[w].x - M);  // a warp without keys weighs nothing
      const float4 a = *reinterpret_cast<const float4*>(acc_of(w) + row * kAccStride + d);
      acc.x += f * a.x, acc.y += f * a.y, acc.z += f * a.z, acc.w += f * a.w, L += f * ml[w].y;
    }
    if (p.splits == 1) {
      const float inv = L > 0.f ? 1.f / L : 0.f;
      auto* dst = reinterpret_cast<__nv_bfloat162*>(p.out + int64_t(t) * p.o_s0 + int64_t(h) * p.o_s1 + d);
      dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv), dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
      continue;
    }
    const int64_t prow = (int64_t(blockIdx.z) * p.T + t) * p.Hq + h;
    *reinterpret_cast<float4*>(p.part_acc + prow * kD + d) = acc;
    if (d == 0) p.part_ml[2 * prow] = M * float(M_LN2), p.part_ml[2 * prow + 1] = L;  // empty split: -inf, 0
  }
}

// What the rope needs that no kernel of the step writes (the position's cos/sin, the norm
// weights, the new key's slot), loaded before the wait for the projection.
struct RopeInputs {
  RopeRegs<2> cs;
  RopeHead wq, wk;
  int64_t slot;
};

__device__ __forceinline__ void load_rope_inputs(const GqaDecodeRope& r, int t, bool new_key, int lane,
                                                 RopeInputs& in) {
  const int pos = r.positions[t];
  load_cos_sin(r.cos + int64_t(pos) * kRopeHalf, r.sin + int64_t(pos) * kRopeHalf, kRopeHalf, lane, in.cs);
  if (r.q_norm) load_head(r.q_norm, kD, kRopeHalf, false, lane, in.wq);
  if (r.k_norm && new_key) load_head(r.k_norm, kD, kRopeHalf, false, lane, in.wk);
  in.slot = new_key ? r.new_slots[t] : 0;
}

constexpr int kQHeadsPerWarp = 16 / kWarps;  // query heads a warp ropes (a KV head's group: at most 16)

// The block's query heads normed and roped into q_s ([group][kRow]), a warp a head; and, when
// `new_key` (the warp whose steps hold the query's new key), that key roped into the key cache
// and its value copied into the value cache, and also into `new_row` ([2 kStep][kRow] from the
// key's row of its stage; null when the stage is issued later, from the cache). Every load is
// issued before any value is used (one round trip); a barrier follows, after which q_s is the
// block's and the caches hold the new key for the copies issued from here on.
__device__ void rope_queries_and_new_key(const GqaDecodeLaunch& p, int t, int kvh, bool new_key, const RopeInputs& in,
                                         bf16* q_s, bf16* new_row) {
  const GqaDecodeRope& r = p.rope;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = p.Hq / p.Hkv;
  RopeHead x[kQHeadsPerWarp], k;
  float v[kD / 32];
#pragma unroll
  for (int i = 0; i < kQHeadsPerWarp; ++i) {
    const int row = warp + kWarps * i;
    if (row < group)
      load_head(p.q + int64_t(t) * p.q_s0 + int64_t(kvh * group + row) * p.q_s1, kD, kRopeHalf, false, lane, x[i]);
  }
  if (new_key) {
    load_head(r.k_new + int64_t(t) * r.kn_s0 + int64_t(kvh) * r.kn_s1, kD, kRopeHalf, false, lane, k);
    const bf16* vsrc = r.v_new + int64_t(t) * r.vn_s0 + int64_t(kvh) * r.vn_s1;
#pragma unroll
    for (int j = 0; j < kD / 32; ++j) v[j] = load_f(vsrc + lane + 32 * j);
  }
#pragma unroll
  for (int i = 0; i < kQHeadsPerWarp; ++i) {
    const int row = warp + kWarps * i;
    if (row >= group) continue;
    if (r.q_norm) norm_head<bf16>(x[i], in.wq, r.eps, kD, false);
    store_head(q_s + row * kRow, x[i], in.cs, kD, kRopeHalf, false, false, lane);
  }
  if (new_key) {
    if (r.k_norm) norm_head<bf16>(k, in.wk, r.eps, kD, false);
    // p.k / p.v are the caches the kernel reads: written here, before any copy of this key.
    bf16* kdst = const_cast<bf16*>(p.k) + in.slot * p.k_s0 + int64_t(kvh) * p.k_s1;
    bf16* vdst = const_cast<bf16*>(p.v) + in.slot * p.v_s0 + int64_t(kvh) * p.v_s1;
    store_head(kdst, k, in.cs, kD, kRopeHalf, true, false, lane);
#pragma unroll
    for (int j = 0; j < kD / 32; ++j) store_f(vdst + lane + 32 * j, v[j]);
    if (new_row) {
      store_head(new_row, k, in.cs, kD, kRopeHalf, true, false, lane);
#pragma unroll
      for (int j = 0; j < kD / 32; ++j) store_f(new_row + kStep * kRow + lane + 32 * j, v[j]);
    }
  }
  __syncthreads();
}

template <bool ROPE>
__global__ void __launch_bounds__(kWarps * 32, 2) flash_decode_kernel(GqaDecodeLaunch p) {
  extern __shared__ uint4 smem[];  // [kWarps][kStages][2 kStep][kRow] bf16, then (ROPE) [16][kRow] q
  pdl_trigger();  // the merge after this may launch: it waits for these partials
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
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
  // before this one (launched early: launch_pdl), which wrote the query and the step's new keys.
  // Keys older than those were written by earlier steps: a warp whose first steps hold none of
  // the new ones copies them before the wait too, while the projection and rope finish.
  // ROPE: the query's new key (its last) is the kernel's to write. The block whose split holds it
  // finds it in step new_step of its steps; when that step is among the warp's first copies, the
  // warp writes the key's row into the stage itself (no copy of it), so that every first copy
  // may go before the wait; a later step copies it from the cache, written before the loop.
  const int new_step = ROPE && ke == visible && kb < ke ? (visible - 1 - kb) / kStep : -1;
  const bool new_key = new_step >= 0 && new_step % kWarps == warp;
  const bool new_in_ring = new_key && new_step / kWarps < kStages - 1;
  const int own = new_in_ring ? visible - 1 : -1;
  int sl[kStages];
#pragma unroll
  for (int s = 0; s < kStages; ++s) sl[s] = lane_slot(slots, first + s * stride, ke, own, lane);
  const bf16* kbase = p.k + int64_t(kvh) * p.k_s1;
  const bf16* vbase = p.v + int64_t(kvh) * p.v_s1;
  bf16* ring = reinterpret_cast<bf16*>(smem);
  bf16* mine = ring + warp * kRing;
  auto issue_first = [&] {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < steps) issue_step(mine + s * kStage, sl[s], lane, kbase, p.k_s0, vbase, p.v_s0);
      cp_async_commit();
    }
  };
  const int last_first_key = min(ke, first + (kStages - 2) * stride + kStep);  // past the first steps' keys
  const bool old_keys = ROPE || last_first_key <= visible - p.fresh;
  if (old_keys) issue_first();
  RopeInputs rope_in;
  if constexpr (ROPE) load_rope_inputs(p.rope, t, new_key, lane, rope_in);
  pdl_wait();
  bf16* q_s = ring + kWarps * kRing;
  if constexpr (ROPE) {
    const int row = (visible - 1 - kb) % kStep;
    bf16* new_row = new_in_ring ? mine + (new_step / kWarps) * kStage + row * kRow : nullptr;
    rope_queries_and_new_key(p, t, kvh, new_key, rope_in, q_s, new_row);
  }
  if (!old_keys) issue_first();
  uint32_t qf[kD / 16][4];  // rows: the KV head's query heads (zero past the group)
  if constexpr (ROPE)
    flash_load_q<kD>(q_s, kRow, 0, 0, 0, {lane / 4, lane / 4 + 8}, group, lane % 4, qf);
  else
    flash_load_q<kD>(p.q + int64_t(t) * p.q_s0 + int64_t(kvh * group) * p.q_s1, p.q_s1, 0, 0, 0,
                     {lane / 4, lane / 4 + 8}, group, lane % 4, qf);
  float o[kD / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * float(M_LOG2E);
  const int seen[2] = {ke, ke};

  int pending = sl[kStages - 1];
  for (int j = 0, stage = 0; j < steps; ++j, stage = stage + 1 == kStages ? 0 : stage + 1) {
    // Step j + kStages - 1 goes into the stage step j - 1 used. The warp's ldmatrix reads of it
    // fed the mma instructions of step j - 1, which are issued in order before these copies, so
    // they have completed.
    const int ahead = j + kStages - 1;
    const int ahead_stage = stage == 0 ? kStages - 1 : stage - 1;
    if (ahead < steps) issue_step(mine + ahead_stage * kStage, pending, lane, kbase, p.k_s0, vbase, p.v_s0);
    cp_async_commit();
    pending = lane_slot(slots, first + (ahead + 1) * stride, ke, own, lane);
    cp_async_wait<kStages - 1>();  // this lane's copies of step j have landed
    __syncwarp();                  // and every other lane's
    const bf16* st = mine + stage * kStage;
    const int k0 = first + j * stride;
    float s[kStep / 8][4] = {};
    flash_scores<kStep, kD, kRow>(qf, st, lane, s);
    flash_softmax_pv<kStep, kD, kRow>(s, k0 + kStep > ke, k0, seen, scale_log2, st + kStep * kRow, lane, m, l, o);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  __syncwarp();  // every lane is done with the ring: its merge rows overwrite it
  merge_warps(ring, p, t, kvh, o, m, l);
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

// Two resident blocks a multiprocessor (the ring's 102 KB each): 8 warps, each with two steps
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
    MS_CUDA(cudaFuncSetAttribute(flash_decode_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmem)));
    MS_CUDA(cudaFuncSetAttribute(flash_decode_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmem + kQSmem)));
  });
  MS_CHECK(!l.with_rope || l.fresh == 1, "flash_decode: the rope inside takes one new key a query, not ", l.fresh);
  dim3 grid(unsigned(l.T), unsigned(l.Hkv), unsigned(l.splits));
  if (l.with_rope) launch_pdl(flash_decode_kernel<true>, grid, dim3(kWarps * 32), kSmem + kQSmem, l);
  else launch_pdl(flash_decode_kernel<false>, grid, dim3(kWarps * 32), kSmem, l);
  MS_CUDA_LAUNCHED("flash_decode_kernel");
}

}  // namespace ms::cuda
