// Attention on the tensor cores (flash-attention style), for GQA heads of 128 dims and for
// absorbed MLA over DeepSeek's 512 + 64 latent cache: prefill kernels used by attention() /
// mla_attention() when the step's sequences bring many queries each (prefill, extend), and
// split-KV decode kernels whose partial softmaxes attention.cu merges. Other shapes keep
// attention.cu's CUDA-core kernel.
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
// attention on the Hopper kernels (flash_mla_expanded_wgmma.cu, sm_90a; q 16-byte aligned) or on
// mma.sync. The op takes wgmma on a Hopper where q allows it, unless MOESERVE_MLA_WGMMA=0 (read
// per call); tests and the bench run both. The wgmma kernels' 128-row blocks run one of several
// variants (mla_expanded_wgmma_variants(), the default first): `variant`, or when empty
// MOESERVE_MLA_EXPANDED_VARIANT (read per call), or the default; 64-row blocks have one.
void mla_prefill_expanded_on(const Tensor& q, const Tensor& kv_cache, const ops::AttentionLayout& layout,
                             const ops::Weight& kv_b, int nope, int v, float scale, Tensor& out, bool wgmma,
                             std::string_view variant = {});
std::vector<std::string> mla_expanded_wgmma_variants();
// Its attention alone, at DeepSeek's 128 / 64 / 128: q [T, H, 192] over keys whose per-head
// K_nope | V rows are kv [K, H * 256] and whose shared k_rope rows are rope [K, 64] (key j of
// sequence s is row kv_start[s] + j); out [T, H, 128].
void mla_expanded_attention(const Tensor& q, const Tensor& kv, const Tensor& rope, const ops::AttentionLayout& layout,
                            float scale, Tensor& out, bool wgmma, std::string_view variant = {});

// Decode's launch of the MLA kernel over device arrays (split-KV): query t sees keys
// slots[kv_begin[t] + j], j < visible[t]; split z of `splits` takes j in [z * len, (z + 1) * len)
// with len = split_len, or (split_len 0) visible[t] / splits rounded up to 32. One split writes
// out; more write f32 partials part_acc [splits, T, H, 512] and part_ml [splits, T, H, 2]
// (max in natural-log units, sum; an empty split: -inf, 0 and zeros) for attention.cu's merge.
struct MlaLaunch {
  const bf16* ql; int64_t ql_s0, ql_s1;
  const bf16* qr; int64_t qr_s0, qr_s1;
  const bf16* kv; int64_t kv_s0;
  bf16* out; int64_t o_s0, o_s1;
  const int32_t* slots; const int32_t* kv_begin; const int32_t* visible;
  float* part_acc; float* part_ml;
  int T, H, splits, split_len;
  float scale;
  int fresh;  // as GqaDecodeLaunch::fresh (flash_mla only; the wgmma kernel waits for every key)
};
void flash_mla(const MlaLaunch& l);
// Splits of the keys for decode: enough blocks for one a multiprocessor, at least 64 keys each.
int flash_mla_decode_splits(int64_t T, int64_t H, int max_visible);
// The Hopper decode kernel (flash_mla_wgmma.cu, sm_90a): the same launch contract, 64 heads a
// block on warpgroup MMAs. Whether decode takes it: a Hopper, heads a multiple of 64, queries
// 16-byte aligned, unless MOESERVE_MLA_DECODE_WGMMA=0 (read per call).
bool use_flash_mla_wgmma(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const Tensor& out);
void flash_mla_wgmma(const MlaLaunch& l);
// Its splits: one block a multiprocessor, at least 128 keys each.
int flash_mla_wgmma_decode_splits(int64_t T, int64_t H, int max_visible);

// The rope of a decode step done inside the attention kernel (rope_store_kv_attention): the
// query heads are the projection's, not yet normed nor roped, and each query's new key and value
// heads (rows t of k_new / v_new) go into the caches at new_slots[t] from the kernel. NeoX rope
// over all 128 dims of a head; q_norm / k_norm: Qwen3's per-head RMSNorm weights, or null.
struct GqaDecodeRope {
  const bf16* k_new; int64_t kn_s0, kn_s1;
  const bf16* v_new; int64_t vn_s0, vn_s1;
  const int32_t* positions; const int32_t* new_slots;
  const float* cos; const float* sin;  // [positions, 64]
  const bf16* q_norm; const bf16* k_norm;
  float eps;
};

// GQA decode (flash_decode.cu), one block of warps per query, KV head and split; the same split
// and partial conventions as MlaLaunch (partials [splits, T, Hq, 128]).
struct GqaDecodeLaunch {
  const bf16* q; int64_t q_s0, q_s1;
  const bf16* k; int64_t k_s0, k_s1;
  const bf16* v; int64_t v_s0, v_s1;
  bf16* out; int64_t o_s0, o_s1;
  const int32_t* slots; const int32_t* kv_begin; const int32_t* visible;
  float* part_acc; float* part_ml;
  int T, Hq, Hkv, splits, split_len;
  float scale;
  // At most how many of a query's last visible keys this step wrote (its sequence's queries);
  // the keys before them are read before the kernel waits for the one before it.
  int fresh;
  // With the rope (fresh is then 1: a query a sequence, whose last key is its new one).
  bool with_rope;
  GqaDecodeRope rope;
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
  const int32_t* runs;  // runs[j]: how many kv indices from j on have consecutive slots (slots[j] + i)
  const int4* tiles;    // {first query, rows, first kv index, keys seen by the first row}
  int heads, group;     // block b takes tile b / heads and query head b % heads
  float scale_log2;
  int64_t pool_slots;   // the caches' first extent (tensor maps)
};
// The launch of the expanded MLA prefill kernels (flash_mla_expanded.cu, mma.sync;
// flash_mla_expanded_wgmma.cu, flash_mla_expanded_wgmma_ws.cu). Keys are contiguous rows, no
// slot indirection.
struct MlaExpandedParams {
  const bf16* q; int64_t q_s0, q_s1;  // [T, H, 192]
  const bf16* kv; int64_t kv_s0;      // [K, H * 256]: per head K_nope then V
  const bf16* rope; int64_t rope_s0;  // [K, 64] (the gathered latent rows' roped part)
  bf16* out; int64_t o_s0, o_s1;      // [T, H, 128]
  const int4* tiles;                  // {first query, rows, first key index, keys seen by the first row}
  int heads;                          // block b takes tile b / heads and head b % heads
  float scale_log2;
  int64_t q_rows, kv_rows;            // T and K: the extents of q and of kv / rope (tensor maps)
};
// The wgmma kernels over `blocks` = tiles x heads blocks of block_rows (64 or 128) queries; the
// 128-row blocks in `variant` (mla_expanded_wgmma_variants; empty: the environment's or the default).
void mla_expanded_wgmma(const MlaExpandedParams& p, unsigned blocks, int block_rows, std::string_view variant);
// The warp-specialized kernels for 128-row blocks (flash_mla_expanded_wgmma_ws.cu): a producer
// warpgroup (its one thread issuing tensor copies) and two consumers, on 128-key tiles (the
// default) or 64-key tiles.
void mla_expanded_wgmma_ws128(const MlaExpandedParams& p, unsigned blocks);
void mla_expanded_wgmma_ws64(const MlaExpandedParams& p, unsigned blocks);

// The warp-specialized 128-row kernel (flash_prefill_wgmma_ws.cu): a producer warpgroup and two
// consumers on 128-key tiles; the default for flash_prefill_wgmma.cu's 128-row blocks.
void flash_prefill_wgmma_ws(const FlashParams& p, unsigned blocks);
// The same with every tile gathered by cp.async, none by tensor copies ("n128wscp").
void flash_prefill_wgmma_ws_gather(const FlashParams& p, unsigned blocks);
// The tiles of block_rows queries of every sequence (longest first, heads fastest) and the
// slots with their runs, uploaded, with the params over them; blocks 0 when there are no queries.
struct FlashPlan {
  Tensor tiles, slots;
  FlashParams p{};
  unsigned blocks = 0;
};
FlashPlan flash_prefill_plan(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows);

}  // namespace ms::cuda
#endif
