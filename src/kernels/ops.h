// The op interface: free functions over tensors that every layer is written in. Each op
// dispatches on the device of its tensors to kernels/cpu/ or kernels/cuda/; a layer never
// branches on the device itself. Activations are F32 [tokens, features] unless stated.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ms::ops {

// Makes `device` usable (registers its memory with core, creates its streams and handles).
// `gpu` >= 0 binds the calling thread to that GPU (rank threads each drive their own); -1 keeps
// the thread's current one. Idempotent; throws when this build has no backend for it.
void init_backend(Device device, int gpu = -1);

// Where a stretch of GPU work loses its time (kernels/cuda/op_trace.h): op_trace_start, the
// ops, then op_trace_report waits for them and returns each op's GPU time and the GPU's idle
// time before it. CUDA only.
void op_trace_start(Device device);
std::string op_trace_report(Device device);

// A weight as the checkpoint stores it: [out, in] in F32/BF16/F16, or F8_E4M3 with one
// `scale_inv` per block_n x block_k block ([ceil(out/bn), ceil(in/bk)], F32; edge blocks may
// be partial). Value = fp8 * scale_inv.
struct Weight {
  Tensor w;
  Tensor scale_inv;
  int block_n = 128, block_k = 128;
  // A hint for the GPU's decode products: the kernel before this weight's product reads little
  // from memory, so the product may start loading the weight before that kernel ends (set by the
  // attention layers on o_proj and MLA's fused q|kv_a; gemv.cu's early_fetch).
  bool fetch_early = false;
  int64_t out_features() const { return w.size(0); }
  int64_t in_features() const { return w.size(1); }
  bool is_fp8() const { return w.dtype() == DType::F8_E4M3; }
};

// The FP8 block scales every backend takes: finite and of magnitude below kFp8ScaleBound, as
// the CUDA products multiply f32 sums by scale x 2^120 (cuda_common.h's e4m3x4_bf16 converts
// codes as code x 2^-120), which overflows from 2^8. Published scales are amax / 448 of weights far
// smaller than 448 x 256. Fails naming `name` and the element otherwise (the weight loader's check).
constexpr float kFp8ScaleBound = 256.f;
void check_fp8_scales(const Tensor& scale_inv, const std::string& name);

// Whether an op's GPU work must wait for the kernel launched before it (AfterLast), or may run
// beside it (BesideLast): the caller promises that the op's inputs were written before the op
// that launched that kernel, whose kernels let the next one start only once they have waited for
// the work before them (moe_route's and moe_expert_rows' do), and that the op's outputs were
// allocated before that op ran (so none is a buffer it freed while its kernel still uses it). The
// kernel after still follows both. Ops run in order on the CPU. MOESERVE_BESIDE=0: never beside.
enum class Overlap { AfterLast, BesideLast };

// out[T, N] = x[T, K] . w^T (+ bias[N]). x and out are F32, contiguous in the last dim. The
// GPU's streaming product (decode rows) honours `overlap`.
void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out, Overlap overlap = Overlap::AfterLast);

// out = x * rsqrt(mean(x^2) + eps) * weight, row by row. out may be x.
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
// x += y (same shape).
void add_inplace(Tensor& x, const Tensor& y);
// The residual add fused with the next norm: residual += y, then out = rms_norm(residual), with
// the sum stored in residual's dtype before it is normalised (as add_inplace then rms_norm).
// out may be y; residual, y and out are 2-D rows of one width.
void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, Tensor& out);
// out[T, I] = silu(gate_up[T, :I]) * gate_up[T, I:].
void silu_and_mul(const Tensor& gate_up, Tensor& out);
// A gated MLP's first half: act[T, I] = silu(x gate^T) * (x up^T), as two linears into [T, 2I]
// (rounded to bf16 when `round_bf16`, as their storage would be) and silu_and_mul. The GPU
// streams both weights in one product at decode batches and applies the SiLU to its f32 sums;
// that product honours `overlap`.
void gated_linear(const Tensor& x, const Weight& gate, const Weight& up, bool round_bf16, Tensor& act,
                  Overlap overlap = Overlap::AfterLast);
// out[t] = table[ids[t]] (table in its stored dtype). With `earlier` (I32 on out's device), an
// id -(j + 1) stands for earlier[j]: a token an earlier step sampled that the host has not seen
// yet (overlap scheduling).
void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out, const Tensor* earlier = nullptr);
// x[t] += sigmoid(gate[t]) * y[t]; gate is [T, 1] (Qwen2-MoE's shared-expert gate).
void add_sigmoid_gated(Tensor& x, const Tensor& gate, const Tensor& y);
// Emulates bf16 storage of activations: rounds every element to the nearest bf16.
void round_to_bf16(Tensor& x);
// out[i] = src[rows[i]] for 2-D src and out.
void gather_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& out);
// dst[rows[i]] += src[i] for 2-D dst and src (combining expert outputs sent back to their tokens).
void index_add_rows(Tensor& dst, std::span<const int32_t> rows, const Tensor& src);
// Copies rows of src [T, W] into dst [slots, W] at rows slots[t] (KV cache writes).
void scatter_rows(const Tensor& src, std::span<const int32_t> slots, Tensor& dst);

// Rotary embedding of token t at positions[t] over rot_dim dims of a head (which dims: the op
// says). cos/sin: F32 [max_pos, rot_dim / 2]. Interleaved rotates pairs (2i, 2i+1) and writes
// them de-interleaved to (i, i + rot_dim/2) as the reference does (DeepSeek); otherwise it rotates
// (i, i + rot_dim/2) (NeoX, Qwen).
struct RopeArgs {
  const Tensor& cos;
  const Tensor& sin;
  int rot_dim;
  bool interleaved;
  std::span<const int32_t> positions;
};

// Per-head RMSNorm of q and k before their rope (Qwen3): weights [D].
struct HeadNorm {
  const Tensor& q;
  const Tensor& k;
  float eps;
};

// Rope and the KV-cache write of a GQA layer, rope on dims [0, rot_dim) of each head: q
// [T, Hq, D] is roped in place; k [T, Hkv, D] is roped into k_cache [slots, Hkv, D] at row
// slots[t] and v [T, Hkv, Dv] copied into v_cache [slots, Hkv, Dv]; k and v are left as they
// are. q, k and v may be head slices of one fused projection (strided tokens). With qk_norm,
// every q and k head is normalised first (its result stored, then roped). round_bf16: F32
// activations emulate bf16 storage, so normalised and roped q and k are rounded to bf16 (BF16
// tensors are rounded by their storage).
void rope_store_kv(Tensor& q, const Tensor& k, const Tensor& v, const RopeArgs& rope, std::span<const int32_t> slots,
                   bool round_bf16, Tensor& k_cache, Tensor& v_cache, const HeadNorm* qk_norm = nullptr);
// The same for MLA: kv [T, L + R] (the kv_a projection) becomes cache row slots[t] of [slots,
// L + R]: its latent [0, L) normalised by kv_norm (weight [L], eps) and its last R = rot_dim
// columns roped; q [T, H, nope + R] has its last R dims of each head roped in place. kv is left
// as it is; round_bf16 as above, for the whole cached row and q.
void mla_rope_store(Tensor& q, const Tensor& kv, const Tensor& kv_norm, float eps, const RopeArgs& rope,
                    std::span<const int32_t> slots, bool round_bf16, Tensor& cache);

// Which keys each query sees. Sequence s owns queries [q_start[s], q_start[s+1]) and keys
// kv_slots[kv_start[s] .. kv_start[s+1]); its queries are the last ones of its keys, and each
// sees the keys up to and including its own position (causal).
struct AttentionLayout {
  std::vector<int32_t> q_start, kv_start, kv_slots;
  int num_seqs() const { return int(q_start.size()) - 1; }
};

// GQA over a slot cache: q [T, Hq, D], k_cache [slots, Hkv, D], v_cache [slots, Hkv, Dv],
// out [T, Hq, Dv].
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout,
               float scale, Tensor& out);

// rope_store_kv, then attention over the caches it wrote, as one op: on the GPU a decode step
// (a query a sequence, whose new key is its last) of 128-dim BF16 heads roped whole (Qwen3)
// runs both in the attention kernel. q is scratch afterwards (roped, or as it was).
void rope_store_kv_attention(Tensor& q, const Tensor& k, const Tensor& v, const RopeArgs& rope,
                             std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                             const HeadNorm* qk_norm, const AttentionLayout& layout, float scale, Tensor& out);

// What follows a GQA layer's attention in a decoder layer: o's product, added to the residual
// and normed (the post-attention norm): residual += attn . o^T, out = rms_norm(residual) * norm_weight.
struct PostAttention {
  const Weight& o;  // [hidden, Hq * Dv]
  Tensor& residual;  // [T, hidden]
  const Tensor& norm_weight;
  float eps;
  Tensor& out;  // [T, hidden]
};

// rope_store_kv_attention into attn [T, Hq, Dv], then `post`; round_bf16 also rounds attn and
// the product's output, as their storage would. On the GPU a decode step of one query whose
// attention kernel ropes (rope_store_kv_attention's case) merges the attention's splits inside
// o's product, each block those of its head (merge_project.h), and the norm sums the heads'
// products: one kernel fewer, and o's weight streams during the attention. attn is then left
// unwritten.
void rope_store_kv_attention_o_add_norm(Tensor& q, const Tensor& k, const Tensor& v, const RopeArgs& rope,
                                        std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache,
                                        Tensor& v_cache, const HeadNorm* qk_norm, const AttentionLayout& layout,
                                        float scale, Tensor& attn, const PostAttention& post);

// MLA in the absorbed form over the latent cache [slots, L + R] (L = kv_lora_rank, the
// normalised latent; R = roped key part). q_latent [T, H, L], q_rope [T, H, R]; out [T, H, L]
// is the attention-weighted latent (the caller applies W_uv).
void mla_attention(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const AttentionLayout& layout,
                   float scale, Tensor& out);

// mla_attention, then mla_expand_v of its latent by kv_b into out [T, H, v] (latent [T, H, L]:
// scratch for the weighted latent). On the GPU a decode step's split merge expands the latent
// itself (one kernel for the merge and W_uv, the same bits); the latent is then left unwritten.
void mla_attention_expand(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                          const AttentionLayout& layout, float scale, const Weight& kv_b, int nope, int v,
                          Tensor& latent, Tensor& out);

// The MLA absorption, through kv_b [H * (nope + v), L] as stored (no f32 copy): per head,
// q_latent[t, h] = q_nope[t, h] . W_uk[h] and out[t, h] = W_uv[h] . latent[t, h], where W_uk[h] is
// kv_b's rows [h(nope+v), h(nope+v)+nope) and W_uv[h] the v rows after them.
void mla_absorb_q(const Tensor& q_nope, const Weight& kv_b, int nope, int v, Tensor& q_latent);
void mla_expand_v(const Tensor& latent, const Weight& kv_b, int nope, int v, Tensor& out);

// The whole MLA attention of a prefill from the roped q [T, H, nope + R] (R = the cache's roped
// part) to out [T, H, v]: what mla_absorb_q, mla_attention and mla_expand_v compute together, in
// whichever form the backend runs fastest. The GPU expands every key the layout names (its
// latent row times kv_b: K_nope and V per head) and runs attention over 192-dim keys, 2H(nope +
// R + v) flops a (query, key) pair against the absorbed form's 2H(2L + R), for 2LH(nope + v) a
// key; the CPU composes the absorbed ops (its results are the absorbed form's to the bit).
void mla_prefill_expanded(const Tensor& q, const Tensor& kv_cache, const AttentionLayout& layout, const Weight& kv_b,
                          int nope, int v, float scale, Tensor& out);

// Router top-k. Scores are softmax or sigmoid of logits [T, E]; `choice` = score (+ bias
// when given). Grouped selection keeps `topk_group` of `n_group` groups, ranked by the max
// (group_limited_greedy) or the sum of the top two (noaux_tc) of `choice`; experts outside them
// are set to 0 (as the reference does), then top_k by `choice`. Weights are the chosen scores,
// renormalised if asked, times `scale`.
enum class Scoring { Softmax, Sigmoid };
enum class GroupRank { None, Max, SumTop2 };
struct RouterParams {
  int top_k = 1;
  Scoring scoring = Scoring::Softmax;
  GroupRank group_rank = GroupRank::None;
  int n_group = 1, topk_group = 1;
  bool renormalize = false;
  float scale = 1.0f;
  // Shared-experts fusion: when replicas > 0, the shared expert (pieces times a routed
  // expert's width) is `pieces` experts of the routed shape a replica, ids
  // n_routed + r * pieces + p, and ids/weights get `pieces` more columns naming token t's
  // replica r = t % replicas, each with weight 1 (not scaled: the routed weights alone are), so
  // the shared expert is summed like routed ones.
  int fused_shared_replicas = 0;
  int fused_shared_pieces = 1;
  int fused_shared_experts() const { return fused_shared_replicas * fused_shared_pieces; }
  int columns() const { return top_k + (fused_shared_replicas > 0 ? fused_shared_pieces : 0); }
};
void moe_topk(const Tensor& logits, const Tensor* bias, const RouterParams& p, Tensor& ids, Tensor& weights);
// The whole routing of x [T, hidden]: F32 logits = linear(x, gate, gate_bias), then moe_topk with
// the correction `bias`; ids and weights exactly as that composition gives them. (On the GPU a
// decode batch runs the top-k inside the router product's kernel.)
void moe_route(const Tensor& x, const Weight& gate, const Tensor* gate_bias, const Tensor* bias, const RouterParams& p,
               Tensor& ids, Tensor& weights);

// Routed experts: out[t] = sum_j weights[t, j] * down_e(silu(gate_e(x)) * up_e(x)), e = ids[t, j].
// Under expert parallelism a rank holds experts [first_expert, first_expert + num_experts()) of
// `total_experts`; ids of other ranks' experts are skipped (they contribute there).
struct ExpertWeights {
  std::vector<Weight> gate, up, down;
  int first_expert = 0;
  int total_experts = 0;  // 0: num_experts()
  int num_experts() const { return int(gate.size()); }
  int total() const { return total_experts > 0 ? total_experts : num_experts(); }
};
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts, Tensor& out);
// The routed experts' outputs before their weighted sum, which is out[t] = sum_j weights[t, j] *
// rows[row_of[t, j]] over j = 0..K-1 in order (row -1: skipped), summed in f32 and rounded once
// to out's dtype: what moe_experts writes, bit for bit. A backend that sums inside its experts
// (the CPU's, in expert order) hands its sum back as one row a token of weight 1, which that
// formula reproduces exactly.
// With slabs > 0 (the CUDA backend's one-token experts, for moe_combine_add_rms_norm) a row is
// not yet summed: rows [T * K * slabs, hidden] (F32) holds slot (t, j)'s row as the slabs rows
// from (t * K + j) * slabs on, added in that order from 0 (written only where row_of >= 0).
struct ExpertRows {
  Tensor rows;     // [R, hidden], BF16 or F32
  Tensor row_of;   // I32 [T, K]
  Tensor weights;  // F32 [T, K]
  int slabs = 0;
};
ExpertRows moe_expert_rows(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts);
// A MoE block's output added to the residual stream, fused with the norm after it: f = the
// weighted sum of `routed` in residual's dtype; with a shared expert's output, f += shared
// (f += sigmoid(shared_gate[t]) * shared[t] with Qwen2-MoE's gate [T, 1]), rounded again; then
// add_rms_norm(residual, f, weight, eps, out). round_bf16: F32 activations emulate bf16 storage,
// so f is rounded to bf16 after the sum and after the shared add. Bit for bit the unfused ops in
// that order (on the GPU one kernel where the rows are BF16 and 16-byte aligned).
void moe_combine_add_rms_norm(const ExpertRows& routed, const Tensor* shared, const Tensor* shared_gate,
                              bool round_bf16, Tensor& residual, const Tensor& weight, float eps, Tensor& out);

// Index of the largest value in each row of logits [T, V] (ties: the lower index). On the GPU only
// the indices are copied to the host.
std::vector<int32_t> argmax_rows(const Tensor& logits);
// The same indices into ids [rows] (I32 on the logits' device), left there: nothing waits.
void argmax_rows_into(const Tensor& logits, Tensor& ids);

// How one row of logits is sampled: the host sampler's rule after its penalties
// (runtime/sampler.h). The candidates, in rank order (decreasing logit, ties to the lower id),
// are the top_k best (all when top_k <= 0) weighing exp((l - max) / temperature) in double;
// top_p keeps the shortest prefix whose weight reaches top_p of theirs, then min_p drops the
// ranks weighing less than min_p (the best weighs 1). The token is the first rank whose
// cumulative weight exceeds u times the kept weight, u = uniform_draw(seed, step). Greedy
// rows (temperature <= 0 or top_k 1) take the argmax.
struct RowSampling {
  float temperature = 1.0f;
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  uint64_t step = 0;  // index of the token being chosen
  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
};
// Uniform in [0, 1) from (seed, step): splitmix64 of the pair (the GPU draws the same bits).
double uniform_draw(uint64_t seed, uint64_t step);
// The rule on one host row of F32 logits (what the CPU op does on each row).
int32_t sample_row(std::span<const float> logits, const RowSampling& p);
// Probabilities after temperature, top_k, top_p and min_p (zeros for excluded tokens).
std::vector<double> sampling_distribution(std::span<const float> logits, const RowSampling& p);
// ids[i] (I32 [rows] on the logits' device) = the token row i of logits [rows, vocab] draws
// under rows[i]; on the GPU nothing waits and only the ids are written.
void sample_rows_into(const Tensor& logits, std::span<const RowSampling> rows, Tensor& ids);

// A copy of a device I32 array to the host that the host collects later, so that it can prepare
// the next step while the device still computes this one (a step's sampled ids). One copy in
// flight per object; on the CPU the copy is done at start.
class HostReadback {
 public:
  virtual ~HostReadback() = default;
  // Enqueues the copy of ids (at most the capacity) after the work already issued that writes them.
  virtual void start(const Tensor& ids) = 0;
  // Blocks until the copy landed; the values stay valid until the next start.
  virtual std::span<const int32_t> wait() = 0;
};
std::unique_ptr<HostReadback> make_host_readback(Device device, int64_t capacity);

}  // namespace ms::ops
