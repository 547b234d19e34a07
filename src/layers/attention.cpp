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
}

Tensor GqaAttention::forward(const Tensor& x, int layer, const ForwardContext& ctx) const {
  const auto& b = ctx.batch;
  const int64_t T = x.size(0);
  Tensor q = w_.q_proj(x), k = w_.k_proj(x), v = w_.v_proj(x);
  ctx.round(q), ctx.round(k), ctx.round(v);
  if (w_.qk_norm) {
    w_.q_norm.inplace(q);
    w_.k_norm.inplace(k);
    ctx.round(q), ctx.round(k);
  }
  Tensor q3 = q.view({T, heads_, head_dim_}), k3 = k.view({T, kv_heads_, head_dim_});
  ops::rope(q3, 0, rope_->rot_dim, b.positions, rope_->cos, rope_->sin, rope_->interleaved);
  ops::rope(k3, 0, rope_->rot_dim, b.positions, rope_->cos, rope_->sin, rope_->interleaved);
  ctx.round(q3), ctx.round(k3);
  ops::scatter_rows(k3, b.out_cache_loc, ctx.kv.buffer(layer, 0));
  ops::scatter_rows(v.view({T, kv_heads_, head_dim_}), b.out_cache_loc, ctx.kv.buffer(layer, 1));
  Tensor o = ctx.empty({T, heads_, head_dim_});
  ops::attention(q3, ctx.kv.buffer(layer, 0), ctx.kv.buffer(layer, 1), b.attn, 1.0f / std::sqrt(float(head_dim_)), o);
  ctx.round(o);
  Tensor out = w_.o_proj(o.view({T, int64_t(heads_) * head_dim_}));
  ctx.round(out);
  return out;
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
}

Tensor MlaAttention::project_q(const Tensor& x, const ForwardContext& ctx) const {
  if (!w_.q_a_proj.defined()) {
    Tensor q = w_.q_proj(x);
    ctx.round(q);
    return q;
  }
  Tensor qa = w_.q_a_proj(x);
  ctx.round(qa);
  w_.q_a_norm.inplace(qa);
  ctx.round(qa);
  Tensor q = w_.q_b_proj(qa);
  ctx.round(q);
  return q;
}

Tensor MlaAttention::forward(const Tensor& x, int layer, const ForwardContext& ctx) const {
  const auto& b = ctx.batch;
  const int64_t T = x.size(0), H = d_.heads, L = d_.kv_lora_rank, R = d_.qk_rope_head_dim;
  const int nope = d_.qk_nope_head_dim, vdim = d_.v_head_dim;
  Tensor q = project_q(x, ctx).view({T, H, nope + R});
  // Latent: normalise the first L columns in place, rope the last R; that row is what we cache.
  Tensor kv = w_.kv_a_proj(x);
  ctx.round(kv);
  Tensor latent = kv.slice(1, 0, L);
  w_.kv_a_norm.inplace(latent);
  Tensor kv3 = kv.view({T, 1, L + R});
  ops::rope(kv3, int(L), int(R), b.positions, rope_->cos, rope_->sin, rope_->interleaved);
  ops::rope(q, nope, int(R), b.positions, rope_->cos, rope_->sin, rope_->interleaved);
  ctx.round(kv), ctx.round(q);
  ops::scatter_rows(kv, b.out_cache_loc, ctx.kv.buffer(layer, 0));

  Tensor q_latent = ctx.empty({T, H, L});
  ops::mla_absorb_q(q.slice(2, 0, nope), w_.kv_b_proj.weight(), nope, vdim, q_latent);
  Tensor o_latent = ctx.empty({T, H, L});
  ops::mla_attention(q_latent, q.slice(2, nope, nope + R), ctx.kv.buffer(layer, 0), b.attn, d_.softmax_scale,
                     o_latent);
  Tensor o = ctx.empty({T, H, vdim});
  ops::mla_expand_v(o_latent, w_.kv_b_proj.weight(), nope, vdim, o);
  ctx.round(o);
  Tensor out = w_.o_proj(o.view({T, H * vdim}));
  ctx.round(out);
  return out;
}

}  // namespace ms
