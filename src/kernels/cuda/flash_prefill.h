// Attention on the tensor cores (flash-attention style), for GQA heads of 128 dims and for
// absorbed MLA over DeepSeek's 512 + 64 latent cache: prefill kernels used by attention() /
// mla_attention() when the step's sequences bring many queries each (prefill, extend), and
// split-KV decode kernels whose partial softmaxes are merged by their own last block (given
// counters) or by attention.cu's merge kernel. Other shapes keep attention.cu's CUDA-core kernel.
#pragma once
#include "kernels/cuda/cuda_common.h"

#include <string>
#include <string_view>
#include <vector>

namespace ms::cuda {

// Whether the tensor-core kernel takes these shapes (head dims, strides and alignment).
bool flash_prefill_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out);

// Same contract as ops::attention; the layout is on the host (not a captured step).
void flash_prefill(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionLayout& layout,
                   float scale, Tensor& out);
// The same on the mma.sync kernel (flash_prefill.cu) with blocks of `block_rows` queries (64 or
// 128), which flash_prefill picks by the queries a sequence brings; tests and the bench run both.
void flash_prefill_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows);
// The Hopper kernel (flash_prefill_wgmma.cu, sm_90a): the same contract on warpgroup MMAs,
// blocks of 64 or 128 rows. flash_prefill takes it on a Hopper where it is supported (queries
// 16-byte aligned too), unless MOESERVE_FLASH_WGMMA=0 (read per call). 128-row blocks run one
// of several variants (flash_prefill_wgmma_variants(), the default first): `variant`, or when
// empty MOESERVE_FLASH_WGMMA_VARIANT (read per call), or the default; 64-row blocks have one.
bool flash_prefill_wgmma_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out);
std::vector<std::string> flash_prefill_wgmma_variants();
void flash_prefill_wgmma_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows,
                              std::string_view variant = {});

bool flash_mla_supported(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const Tensor& out);

// Same contract as ops::mla_attention; the layout is on the host.
void flash_mla_prefill(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                       const ops::AttentionLayout& layout, float scale, Tensor& out);

// MLA prefill in the expanded form (flash_mla_expanded.cu): cuda::mla_prefill_expanded with its
// attention on the Hopper kernel (flash_mla_expanded_wgmma.cu, sm_90a; q 16-byte aligned) or on
// mma.sync. The op takes wgmma on a Hopper where q allows it, unless MOESERVE_MLA_WGMMA=0 (read
// per call); tests and the bench run both.
void mla_prefill_expanded_on(const Tensor& q, const Tensor& kv_cache, const ops::AttentionLayout& layout,
                             const ops::Weight& kv_b, int nope, int v, float scale, Tensor& out, bool wgmma);
// Its attention alone, at DeepSeek's 128 / 64 / 128: q [T, H, 192] over keys whose per-head
// K_nope | V rows are kv [K, H * 256] and whose shared k_rope rows are rope [K, 64] (key j of
// sequence s is row kv_start[s] + j); out [T, H, 128].
void mla_expanded_attention(const Tensor& q, const Tensor& kv, const Tensor& rope, const ops::AttentionLayout& layout,
                            float scale, Tensor& out, bool wgmma);

// Decode's launch of the MLA kernel over device arrays (split-KV): query t sees keys
// slots[kv_begin[t] + j], j < visible[t]; split z of `splits` takes j in [z * len, (z + 1) * len)
// with len = split_len, or (split_len 0) visible[t] / splits rounded up to 32. One split writes
// out; more write f32 partials part_acc [splits, T, H, 512] and part_ml [splits, T, H, 2]
// (max in natural-log units, sum; an empty split: -inf, 0 and zeros). With `counters` (zeroed,
// one per query and group of 16 heads: arrival_counters) the last split block of a group to
// finish merges them into out (split_arrive_last); without, attention.cu's merge kernel does.
struct MlaLaunch {
  const bf16* ql; int64_t ql_s0, ql_s1;
  const bf16* qr; int64_t qr_s0, qr_s1;
  const bf16* kv; int64_t kv_s0;
  bf16* out; int64_t o_s0, o_s1;
  const int32_t* slots; const int32_t* kv_begin; const int32_t* visible;
  float* part_acc; float* part_ml;
  unsigned* counters;
  int T, H, splits, split_len;
  float scale;
};
void flash_mla(const MlaLaunch& l);
// Splits of the keys for decode: enough blocks for one a multiprocessor, at least 64 keys each.
int flash_mla_decode_splits(int64_t T, int64_t H, int max_visible);

// GQA decode (flash_decode.cu), one block of warps per query, KV head and split; the same split
// and partial conventions as MlaLaunch (partials [splits, T, Hq, 128]; counters one per query
// and KV head).
struct GqaDecodeLaunch {
  const bf16* q; int64_t q_s0, q_s1;
  const bf16* k; int64_t k_s0, k_s1;
  const bf16* v; int64_t v_s0, v_s1;
  bf16* out; int64_t o_s0, o_s1;
  const int32_t* slots; const int32_t* kv_begin; const int32_t* visible;
  float* part_acc; float* part_ml;
  unsigned* counters;
  int T, Hq, Hkv, splits, split_len;
  float scale;
};
bool flash_decode_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache);
// Splits of the keys for T queries: two blocks a multiprocessor, at least 64 keys each.
int flash_decode_splits(int64_t T, int64_t Hkv, int max_visible);
void flash_decode(const GqaDecodeLaunch& l);

}  // namespace ms::cuda

#ifdef __CUDACC__
namespace ms::cuda {

// The launch of a GQA prefill kernel (flash_prefill.cu, flash_prefill_wgmma.cu).
struct FlashParams {
  const bf16* q; int64_t q_s0, q_s1;
  const bf16* k; int64_t k_s0, k_s1;
  const bf16* v; int64_t v_s0, v_s1;
  bf16* out; int64_t o_s0, o_s1;
  const int32_t* slots;
  const int4* tiles;  // {first query, rows, first kv index, keys seen by the first row}
  int heads, group;   // block b takes tile b / heads and query head b % heads
  float scale_log2;
};
// The launch of the expanded MLA prefill kernels (flash_mla_expanded.cu, mma.sync;
// flash_mla_expanded_wgmma.cu). Keys are contiguous rows, no slot indirection.
struct MlaExpandedParams {
  const bf16* q; int64_t q_s0, q_s1;  // [T, H, 192]
  const bf16* kv; int64_t kv_s0;      // [K, H * 256]: per head K_nope then V
  const bf16* rope; int64_t rope_s0;  // [K, 64] (the gathered latent rows' roped part)
  bf16* out; int64_t o_s0, o_s1;      // [T, H, 128]
  const int4* tiles;                  // {first query, rows, first key index, keys seen by the first row}
  int heads;                          // block b takes tile b / heads and head b % heads
  float scale_log2;
};
// The wgmma kernel over `blocks` = tiles x heads blocks of block_rows (64 or 128) queries.
void mla_expanded_wgmma(const MlaExpandedParams& p, unsigned blocks, int block_rows);

// The warp-specialized 128-row kernels (flash_prefill_wgmma_ws.cu): a producer warpgroup and
// two consumers, the consumers' products in ping-pong or not; variants of flash_prefill_wgmma.cu.
void flash_prefill_wgmma_ws(const FlashParams& p, unsigned blocks);
void flash_prefill_wgmma_pingpong(const FlashParams& p, unsigned blocks);
// The tiles of block_rows queries of every sequence (longest first, heads fastest) and the
// slots, uploaded, with the params over them; blocks 0 when there are no queries.
struct FlashPlan {
  Tensor tiles, slots;
  FlashParams p{};
  unsigned blocks = 0;
};
FlashPlan flash_prefill_plan(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows);

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

// The fused split-KV merge. A block that has written its split's partial counts itself in at
// `counter` (one per query and head group); the block that arrives last, whose count finds every
// other split's partial written, merges them and sets the counter back to 0, so the next launch
// (or graph replay) finds it zeroed without a memset. The fences make the partials visible
// GPU-wide before the count (release) and order the last block's reads after it (acquire).
// Every thread calls it; the result is the block's.
__device__ __forceinline__ bool split_arrive_last(unsigned* counter, int splits) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(counter, 1u) == unsigned(splits - 1);
    if (last) *counter = 0;  // every split has counted in: no block of this launch touches it again
    __threadfence();
  }
  __syncthreads();
  return last;
}

// The last block's merge of `n` (query, head) rows of DV dims, rows row0 .. row0 + n - 1 of the
// partials (part_acc [splits][rows][DV], part_ml [splits][rows] (m, l); an empty split, m = -inf,
// weighs nothing), row r written at out + r * out_s: out = sum_z e^(m_z - M) acc_z / sum_z
// e^(m_z - M) l_z. Every (m, l) comes into shared memory at once; a warp a row turns them into
// weights e^(m_z - M) / L (max and sum over shuffles); then each thread takes float4 pieces of
// PB rows at a time and 16 / PB splits of each, 16 loads in flight. A fixed order throughout, so
// the result does not depend on which block merges. The loads bypass L1 (__ldcg): other blocks
// of this grid wrote the partials. `smem`: 3 n splits floats.
template <int DV, int PB>
__device__ __forceinline__ void merge_split_rows(const float* part_acc, const float* part_ml, int splits, int64_t rows,
                                                 int64_t row0, int n, bf16* out, int64_t out_s, float* smem) {
  constexpr int kSplits = 16 / PB, kPieces = DV / 4;  // splits a load batch, float4 pieces a row
  float2* ml_s = reinterpret_cast<float2*>(smem);     // [n][splits]
  float* w_s = smem + 2 * n * splits;                 // [n][splits]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll 4
  for (int i = threadIdx.x; i < n * splits; i += blockDim.x)
    ml_s[i] = __ldcg(reinterpret_cast<const float2*>(part_ml) + (i % splits) * rows + row0 + i / splits);
  __syncthreads();
  for (int r = warp; r < n; r += blockDim.x / 32) {
    const float2* ml = ml_s + r * splits;
    float M = -INFINITY, L = 0.f;
    for (int z = lane; z < splits; z += 32) M = fmaxf(M, ml[z].x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    for (int z = lane; z < splits; z += 32) {
      const float w = ml[z].x == -INFINITY ? 0.f : expf(ml[z].x - M);
      w_s[r * splits + z] = w, L += w * ml[z].y;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    const float inv = L > 0.f ? 1.0f / L : 0.f;
    for (int z = lane; z < splits; z += 32) w_s[r * splits + z] *= inv;  // this lane's own weights
  }
  __syncthreads();
  const int pieces = n * kPieces;
  for (int p0 = threadIdx.x; p0 < pieces; p0 += PB * blockDim.x) {
    float acc[PB][4] = {};
    for (int z0 = 0; z0 < splits; z0 += kSplits) {
      float4 a[PB][kSplits];
#pragma unroll
      for (int j = 0; j < PB; ++j)
#pragma unroll
        for (int b = 0; b < kSplits; ++b) {
          const int pc = p0 + j * blockDim.x, z = z0 + b;
          a[j][b] = pc < pieces && z < splits
                        ? __ldcg(reinterpret_cast<const float4*>(part_acc + (z * rows + row0 + pc / kPieces) * DV) +
                                 pc % kPieces)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
      for (int j = 0; j < PB; ++j)
#pragma unroll
        for (int b = 0; b < kSplits; ++b) {
          const int pc = p0 + j * blockDim.x, z = z0 + b;
          const float w = pc < pieces && z < splits ? w_s[(pc / kPieces) * splits + z] : 0.f;
          acc[j][0] += w * a[j][b].x, acc[j][1] += w * a[j][b].y, acc[j][2] += w * a[j][b].z, acc[j][3] += w * a[j][b].w;
        }
    }
#pragma unroll
    for (int j = 0; j < PB; ++j) {
      const int pc = p0 + j * blockDim.x;
      if (pc >= pieces) continue;
      auto* dst = reinterpret_cast<__nv_bfloat162*>(out + (pc / kPieces) * out_s + 4 * (pc % kPieces));
      dst[0] = __floats2bfloat162_rn(acc[j][0], acc[j][1]);
      dst[1] = __floats2bfloat162_rn(acc[j][2], acc[j][3]);
    }
  }
}

}  // namespace ms::cuda
#endif
