#include "layers/attention.h"

#include <cmath>

#include "core/check.h"

namespace ms {

GqaAttention::GqaAttention(GqaWeights w, int num_heads, int num_kv_heads, int head_dim, const RopeTable* rope)
    : w_(std::move(w)), heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim), rope_(rope) {
  MS_CHECK(w_.q_proj.out_features() == int64_t(num_heads) * head_dim &&
               w_.k_proj.out_features() == int64_t(num_kv_heads) * head_dim,
           "attention: q_proj ", w_.q_proj.weight().w.describe(), " / k_proj ", w_.k_proj.weight().w.describe(),
           " do not match ", num_heads, " heads and ", num_kv_heads, " kv heads of ", head_dim);
  MS_CHECK(w_.v_proj.out_features() == w_.k_proj.out_features(), "attention: v_proj ",
           w_.v_proj.weight().w.describe(), " does not match k_proj");
  MS_CHECK(!w_.qk_norm || w_.q_norm.eps() == w_.k_norm.eps(), "attention: q_norm and k_norm differ in eps");
  // One GEMM for the three projections where their weights can be one; their outputs are then
  // head slices of one [T, heads + 2 kv heads, D] row.
  w_.qkv_proj = Linear::concat_rows({&w_.q_proj, &w_.k_proj, &w_.v_proj});
  if (w_.qkv_proj.defined()) w_.q_proj = w_.k_proj = w_.v_proj = Linear();
  // o's product may load its weight before the split merge before it ends (ops::Weight::fetch_early):
  // the merge reads little (Qwen3 at batch 1: o 3.8 us against 7.0, the merge +2; BENCHMARKS, session 22).
  w_.o_proj.mark_fetch_early();
}

GqaAttention::Heads GqaAttention::project(const Tensor& x, const ForwardContext& ctx) const {
  const int64_t T = x.size(0);
  if (w_.qkv_proj.defined()) {
    Tensor qkv = w_.qkv_proj(x);
    ctx.round(qkv);
    Tensor heads = qkv.view({T, heads_ + 2 * kv_heads_, head_dim_});
    return {heads.slice(1, 0, heads_), heads.slice(1, heads_, heads_ + kv_heads_),
            heads.slice(1, heads_ + kv_heads_, heads_ + 2 * kv_heads_)};
  }
  Tensor q = w_.q_proj(x), k = w_.k_proj(x), v = w_.v_proj(x);
  ctx.round(q), ctx.round(k), ctx.round(v);
  return {q.view({T, heads_, head_dim_}), k.view({T, kv_heads_, head_dim_}), v.view({T, kv_heads_, head_dim_})};
}

Tensor GqaAttention::forward(const Tensor& x, int layer, const ForwardContext& ctx) const {
  const auto& b = ctx.batch;
  const int64_t T = x.size(0);
  Heads h = project(x, ctx);
  const ops::HeadNorm qk_norm{w_.q_norm.weight(), w_.k_norm.weight(), w_.q_norm.eps()};
  Tensor o = ctx.empty({T, heads_, head_dim_});
  ops::rope_store_kv_attention(h.q, h.k, h.v, rope_->at(b.positions), b.out_cache_loc, ctx.bf16_activations,
                               ctx.kv.buffer(layer, 0), ctx.kv.buffer(layer, 1), w_.qk_norm ? &qk_norm : nullptr,
                               b.attn, 1.0f / std::sqrt(float(head_dim_)), o);
  ctx.round(o);
  Tensor out = w_.o_proj(o.view({T, int64_t(heads_) * head_dim_}));
  ctx.round(out);
  return out;
}

void GqaAttention::forward_add_norm(const Tensor& x, int layer, const ForwardContext& ctx, Tensor& residual,
                                    const RmsNorm& norm, Tensor& out) const {
  if (w_.o_proj.bias().defined()) {  // the op's product has no bias
    norm.add_forward(residual, forward(x, layer, ctx), out);
    return;
  }
  const auto& b = ctx.batch;
  Heads h = project(x, ctx);
  const ops::HeadNorm qk_norm{w_.q_norm.weight(), w_.k_norm.weight(), w_.q_norm.eps()};
  Tensor o = ctx.empty({x.size(0), heads_, head_dim_});
  ops::rope_store_kv_attention_o_add_norm(
      h.q, h.k, h.v, rope_->at(b.positions), b.out_cache_loc, ctx.bf16_activations, ctx.kv.buffer(layer, 0),
      ctx.kv.buffer(layer, 1), w_.qk_norm ? &qk_norm : nullptr, b.attn, 1.0f / std::sqrt(float(head_dim_)), o,
      ops::PostAttention{w_.o_proj.weight(), residual, norm.weight(), norm.eps(), out});
}

MlaAttention::MlaAttention(MlaWeights w, MlaDims d, const RopeTable* rope) : w_(std::move(w)), d_(d), rope_(rope) {
  const int64_t qk = d.qk_nope_head_dim + d.qk_rope_head_dim;
  const Linear& q_out = w_.q_b_proj.defined() ? w_.q_b_proj : w_.q_proj;
  MS_CHECK(q_out.out_features() == d.heads * qk, "MLA: q projection ", q_out.weight().w.describe(), " is not ",
           d.heads, " heads of ", qk);
  MS_CHECK(w_.kv_a_proj.out_features() == d.kv_lora_rank + d.qk_rope_head_dim, "MLA: kv_a_proj_with_mqa ",
           w_.kv_a_proj.weight().w.describe(), " is not kv_lora_rank + qk_rope_head_dim rows");
  MS_CHECK(w_.kv_b_proj.out_features() == int64_t(d.heads) * (d.qk_nope_head_dim + d.v_head_dim) &&
               w_.kv_b_proj.in_features() == d.kv_lora_rank,
           "MLA: kv_b_proj ", w_.kv_b_proj.weight().w.describe(), " does not match the heads and kv_lora_rank");
  // q_a_proj (or q_proj, without q_lora) and kv_a_proj read the same x: one product where their
  // weights can be one (at batch 1 V2-Lite's kv_a alone was 36 blocks of 16 rows, a launch that
  // could not keep HBM busy).
  Linear& q_first = w_.q_a_proj.defined() ? w_.q_a_proj : w_.q_proj;
  w_.q_kv_a_proj = Linear::concat_rows({&q_first, &w_.kv_a_proj});
  if (w_.q_kv_a_proj.defined()) q_first = w_.kv_a_proj = Linear();
  // Their products may load weights before the kernel before them ends (ops::Weight::fetch_early):
  // o after the split merge and v's expansion (small reads); q|kv_a after the MoE combine + norm,
  // which q|kv_a's whole weight in flight barely slows (V2-Lite at batch 1: q|kv_a 2.6 us against
  // 6.8, the norm +0.3; BENCHMARKS, session 22). Qwen3's q|k|v, half its weight in its first
  // round, is not marked: there the norm lost more than the product gained.
  w_.o_proj.mark_fetch_early();
  if (w_.q_kv_a_proj.defined()) w_.q_kv_a_proj.mark_fetch_early();
}

std::pair<Tensor, Tensor> MlaAttention::project_x(const Tensor& x, const ForwardContext& ctx) const {
  if (w_.q_kv_a_proj.defined()) {
    Tensor both = w_.q_kv_a_proj(x);
    ctx.round(both);
    const int64_t first = both.size(1) - (d_.kv_lora_rank + d_.qk_rope_head_dim);
    return {both.slice(1, 0, first), both.slice(1, first, both.size(1))};
  }
  Tensor first = w_.q_a_proj.defined() ? w_.q_a_proj(x) : w_.q_proj(x), kv = w_.kv_a_proj(x);
  ctx.round(first), ctx.round(kv);
  return {first, kv};
}

Tensor MlaAttention::project_q(Tensor& first, const ForwardContext& ctx) const {
  if (!w_.q_b_proj.defined()) return first;
  w_.q_a_norm.inplace(first);
  ctx.round(first);
  Tensor q = w_.q_b_proj(first);
  ctx.round(q);
  return q;
}

bool MlaAttention::expanded_pays(const ops::AttentionLayout& layout, const MlaDims& d) {
  if (layout.num_seqs() < 1) return false;
  const int64_t T = layout.q_start.back(), K = layout.kv_start.back();
  if (T < kExpandedMinTokens || K * d.heads * (d.qk_nope_head_dim + d.v_head_dim) > kExpandedMaxValues) return false;
  double pairs = 0;  // (query, visible key) pairs
  for (int s = 0; s < layout.num_seqs(); ++s) {
    const double nq = layout.q_start[s + 1] - layout.q_start[s], nk = layout.kv_start[s + 1] - layout.kv_start[s];
    pairs += nq * (nk - nq) + nq * (nq + 1) / 2;
  }
  // Flops a head: expanding costs 2 L (nope + v) a key and the absorbed form the same a query;
  // a pair costs 2 (2L + R) absorbed and 2 (nope + R + v) expanded.
  const double L = d.kv_lora_rank, per_row = L * (d.qk_nope_head_dim + d.v_head_dim);
  return double(K - T) * per_row < pairs * (2 * L - d.qk_nope_head_dim - d.v_head_dim);
}

Tensor MlaAttention::forward(const Tensor& x, int layer, const ForwardContext& ctx) const {
  const auto& b = ctx.batch;
  const int64_t T = x.size(0), H = d_.heads, L = d_.kv_lora_rank, R = d_.qk_rope_head_dim;
  const int nope = d_.qk_nope_head_dim, vdim = d_.v_head_dim;
  auto [first, kv] = project_x(x, ctx);
  Tensor q = project_q(first, ctx).unflatten(1, {H, nope + R});  // a column slice of the fused product
  // The cached row is the kv_a output with its first L columns normalised and its last R roped.
  ops::mla_rope_store(q, kv, w_.kv_a_norm.weight(), w_.kv_a_norm.eps(), rope_->at(b.positions), b.out_cache_loc,
                      ctx.bf16_activations, ctx.kv.buffer(layer, 0));

  Tensor o = ctx.empty({T, H, vdim});
  if (expanded_pays(b.attn, d_)) {
    ops::mla_prefill_expanded(q, ctx.kv.buffer(layer, 0), b.attn, w_.kv_b_proj.weight(), nope, vdim, d_.softmax_scale,
                              o);
  } else {
    Tensor q_latent = ctx.empty({T, H, L});
    ops::mla_absorb_q(q.slice(2, 0, nope), w_.kv_b_proj.weight(), nope, vdim, q_latent);
    Tensor o_latent = ctx.empty({T, H, L});
    ops::mla_attention_expand(q_latent, q.slice(2, nope, nope + R), ctx.kv.buffer(layer, 0), b.attn,
                              d_.softmax_scale, w_.kv_b_proj.weight(), nope, vdim, o_latent, o);
  }
  ctx.round(o);
  Tensor out = w_.o_proj(o.view({T, H * vdim}));
  ctx.round(out);
  return out;
}

}  // namespace ms
