// Attention on the tensor cores (flash-attention style), for GQA heads of 128 dims and for
// absorbed MLA over DeepSeek's 512 + 64 latent cache: prefill kernels used by attention() /
// mla_attention() when the step's sequences bring many queries each (prefill, extend), and
// split-KV decode kernels whose partial softmaxes are merged either inside the kernel (by the
// last block of each query and head group) or by attention.cu's merge kernel. Other shapes keep
// attention.cu's CUDA-core kernel.
#pragma once
#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// Whether the tensor-core kernel takes these shapes (head dims, strides and alignment).
bool flash_prefill_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out);

// Same contract as ops::attention; the layout is on the host (not a captured step).
void flash_prefill(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionLayout& layout,
                   float scale, Tensor& out);
// The same with blocks of `block_rows` queries (64 or 128), which flash_prefill picks by the
// queries a sequence brings; tests and the bench run both.
void flash_prefill_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows);

bool flash_mla_supported(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const Tensor& out);

// Same contract as ops::mla_attention; the layout is on the host.
void flash_mla_prefill(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                       const ops::AttentionLayout& layout, float scale, Tensor& out);

// Decode's launch of the MLA kernel over device arrays (split-KV): query t sees keys
// slots[kv_begin[t] + j], j < visible[t]; split z of `splits` takes j in [z * len, (z + 1) * len)
// with len = split_len, or (split_len 0) visible[t] / splits rounded up to 32. One split writes
// out; more write f32 partials part_acc [splits, T, H, 512] and part_ml [splits, T, H, 2]
// (max in natural-log units, sum; an empty split: -inf, 0 and zeros) for attention.cu's merge,
// or, with `fused`, merged by the kernel itself. (bf16 spelled __nv_bfloat16 here so that
// host-compiled tests can include this header.)
struct MlaLaunch {
  const __nv_bfloat16* ql; int64_t ql_s0, ql_s1;
  const __nv_bfloat16* qr; int64_t qr_s0, qr_s1;
  const __nv_bfloat16* kv; int64_t kv_s0;
  __nv_bfloat16* out; int64_t o_s0, o_s1;
  const int32_t* slots; const int32_t* kv_begin; const int32_t* visible;
  float* part_acc; float* part_ml;
  bool fused;  // T x H / 16 <= kMergeCounters
  int T, H, splits, split_len;
  float scale;
};
void flash_mla(const MlaLaunch& l);
// Splits of the keys for decode: enough blocks for one a multiprocessor, at least 64 keys each.
int flash_mla_decode_splits(int64_t T, int64_t H, int max_visible);

// GQA decode (flash_decode.cu), one block of warps per query, KV head and split; the same split
// and partial conventions as MlaLaunch (partials [splits, T, Hq, 128]).
struct GqaDecodeLaunch {
  const __nv_bfloat16* q; int64_t q_s0, q_s1;
  const __nv_bfloat16* k; int64_t k_s0, k_s1;
  const __nv_bfloat16* v; int64_t v_s0, v_s1;
  __nv_bfloat16* out; int64_t o_s0, o_s1;
  const int32_t* slots; const int32_t* kv_begin; const int32_t* visible;
  float* part_acc; float* part_ml;
  bool fused;  // T x Hkv <= kMergeCounters
  int T, Hq, Hkv, splits, split_len;
  float scale;
};
bool flash_decode_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache);
// Splits of the keys for T queries: two blocks a multiprocessor, at least 64 keys each.
int flash_decode_splits(int64_t T, int64_t Hkv, int max_visible);
void flash_decode(const GqaDecodeLaunch& l);

// The fused merge's arrival counters: each decode kernel has kMergeCounters of its own in device
// memory (zero when the module loads, on every GPU; the last block of each launch's (query, head
// group) puts its counter back), one per (query, head group) of a launch.
constexpr int kMergeCounters = 4096;

// Who merges decode's split-KV partials: Fused, the attention kernel's last block of each (query,
// head group) (no second launch, no wait for the whole grid); Split, attention.cu's merge kernel;
// Auto, fused where that one block's merge reads few enough partials (attention.cu says why).
// MOESERVE_DECODE_MERGE=fused|split|auto sets the starting value (auto when unset); the tests
// and the bench set it to run both paths. A captured step keeps the choice it was captured with.
enum class DecodeMerge { Auto, Fused, Split };
void set_decode_merge(DecodeMerge m);
DecodeMerge decode_merge();

}  // namespace ms::cuda

#ifdef __CUDACC__
namespace ms::cuda {

// Asynchronous 16-byte copies from global to shared memory (cp.async, L2 only: the KV cache is
// streamed once), so that the decode kernels keep several steps of keys in flight without
// holding them in registers. `valid` false copies nothing and zero-fills the 16 bytes: keys past
// a split's end must read as zeros, since a zero probability times a stale NaN is NaN.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
// Closes the group of copies issued since the last commit (an empty group when none were).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// The fused split merge, called by every thread of a block once its partial is stored: the
// block counts itself in `counter` (its query and head group's, of kMergeCounters) and learns
// whether it came last of the `splits` blocks. Each thread fences its own stores before the count, and the last block
// fences after it, so the last block sees every split's partial (read through L2: __ldcg). The
// last block also puts the counter back to zero: the next launch, or the next replay of a graph,
// starts from zero, and it cannot count before this kernel ends (it waits for it: pdl_wait).
__device__ __forceinline__ bool arrive_last(unsigned* counter, int splits) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == unsigned(splits - 1);
    if (last) {
      __threadfence();
      *counter = 0u;
    }
  }
  __syncthreads();
  return last;
}

// The merge of one query's partials for `rows` (at most 16) heads by one block of THREADS: out
// row r (at out + r * o_s1) = sum_z w_z acc_z / sum_z w_z l_z with w_z = e^(m_z - M), summed over
// the splits z in index order whichever block runs it, from partial rows z * split_rows + row0 +
// r. The block has the merge to itself, so what sets its time is the bytes in flight: the splits'
// rows come by cp.async into the block's shared memory (`smem`, `smem_bytes`, free by now), as
// many splits at once as fit (all of them for GQA's 33 x 4 KB at batch 1), each thread owning 4
// dims of up to 16 rows throughout. Needs room for splits * rows (m, l) pairs and one split's rows.
template <int DV, int THREADS>
__device__ void merge_splits(const float* part_acc, const float* part_ml, int splits, int64_t split_rows, int64_t row0,
                             int rows, bf16* out, int64_t o_s1, float4* smem, int smem_bytes) {
  constexpr int kPieces = DV / 4, kPer = (16 * kPieces + THREADS - 1) / THREADS;
  float2* ml_s = reinterpret_cast<float2*>(smem);  // split z, row r at z * rows + r: (m, l), then (w, l)
  float* row_s = reinterpret_cast<float*>(ml_s + splits * rows);  // [16]: M, then 1 / sum_z w_z l_z
  float4* buf = smem + (splits * rows * 8 + 16 * 4 + 15) / 16;
  const int chunk = int((smem_bytes / 16 - (buf - smem)) / (rows * kPieces));  // splits a pass
  for (int i = threadIdx.x; i < splits * rows; i += THREADS)
    ml_s[i] = __ldcg(reinterpret_cast<const float2*>(part_ml) + (i / rows) * split_rows + row0 + i % rows);
  __syncthreads();
  if (threadIdx.x < rows) {
    float M = -INFINITY;
    for (int z = 0; z < splits; ++z) M = fmaxf(M, ml_s[z * rows + threadIdx.x].x);
    row_s[threadIdx.x] = M;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < splits * rows; i += THREADS) {  // an empty split (m = -inf) weighs nothing
    const float m = ml_s[i].x;
    ml_s[i].x = m == -INFINITY ? 0.f : expf(m - row_s[i % rows]);
  }
  __syncthreads();
  if (threadIdx.x < rows) {  // read after the first pass's barrier
    float L = 0.f;
    for (int z = 0; z < splits; ++z) L += ml_s[z * rows + threadIdx.x].x * ml_s[z * rows + threadIdx.x].y;
    row_s[threadIdx.x] = L > 0.f ? 1.0f / L : 0.f;
  }
  float acc[kPer][4] = {};
  for (int z0 = 0; z0 < splits; z0 += chunk) {
    const int nz = min(chunk, splits - z0);
    for (int i = threadIdx.x; i < nz * rows * kPieces; i += THREADS) {
      const int z = z0 + i / (rows * kPieces), r = (i / kPieces) % rows;  // weight 0: not loaded
      cp_async16(buf + i, part_acc + (z * split_rows + row0 + r) * DV + 4 * (i % kPieces), ml_s[z * rows + r].x != 0.f);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int idx = int(threadIdx.x) + k * THREADS, r = idx / kPieces, c = idx % kPieces;
      if (r >= rows) continue;
      for (int zz = 0; zz < nz; ++zz) {
        const float w = ml_s[(z0 + zz) * rows + r].x;
        const float4 a = buf[(zz * rows + r) * kPieces + c];
        acc[k][0] += w * a.x, acc[k][1] += w * a.y, acc[k][2] += w * a.z, acc[k][3] += w * a.w;
      }
    }
    __syncthreads();  // the next pass overwrites buf
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int idx = int(threadIdx.x) + k * THREADS, r = idx / kPieces, c = idx % kPieces;
    if (r >= rows) continue;
    const float inv = row_s[r];
    auto* o = reinterpret_cast<__nv_bfloat162*>(out + r * o_s1 + 4 * c);
    o[0] = __floats2bfloat162_rn(acc[k][0] * inv, acc[k][1] * inv);
    o[1] = __floats2bfloat162_rn(acc[k][2] * inv, acc[k][3] * inv);
  }
}

}  // namespace ms::cuda
#endif
