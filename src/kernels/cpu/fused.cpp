// CPU forms of the fused ops (residual add + RMSNorm, rope + KV-cache write). They are the
// separate CPU steps in the order the layers ran them, so a model's CPU numbers (and the fixture
// comparisons against the reference) do not depend on which form a layer calls.
#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms::cpu {

void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, Tensor& out) {
  MS_CHECK(residual.dim() == 2 && out.dim() == 2 && out.size(0) == residual.size(0) &&
               out.size(1) == residual.size(1),
           "add_rms_norm: ", residual.describe(), " -> ", out.describe());
  add_inplace(residual, y);
  rms_norm(residual, weight, eps, out);
}

void moe_combine_add_rms_norm(const ops::ExpertRows& routed, const Tensor* shared, const Tensor* shared_gate,
                              bool round_bf16, Tensor& residual, const Tensor& weight, float eps, Tensor& out) {
  const int64_t T = residual.size(0), H = residual.size(1), K = routed.weights.size(1);
  MS_CHECK(residual.dim() == 2 && routed.rows.dim() == 2 && routed.rows.size(1) == H && routed.rows.is_contiguous() &&
               routed.weights.size(0) == T && routed.row_of.numel() == T * K && routed.slabs == 0,
           "moe_combine_add_rms_norm: ", routed.rows.describe(), " by ", routed.row_of.describe(), " into ",
           residual.describe());
  Tensor f = Tensor::zeros(DType::F32, {T, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = routed.row_of.data<int32_t>()[t * K + j];
      if (r >= 0)
        axpy_f32(routed.weights.data<float>()[t * K + j], routed.rows.data<float>() + r * H, f.data<float>() + t * H, H);
    }
  if (round_bf16) round_to_bf16(f);
  if (shared) {
    if (shared_gate) add_sigmoid_gated(f, *shared_gate, *shared);
    else add_inplace(f, *shared);
    if (round_bf16) round_to_bf16(f);
  }
  add_rms_norm(residual, f, weight, eps, out);
}

void gated_linear(const Tensor& x, const Weight& gate, const Weight& up, bool round_bf16, Tensor& act,
                  ops::Overlap) {  // in order
  const int64_t T = x.size(0), I = gate.out_features();
  Tensor gu = Tensor::empty(act.dtype(), {T, 2 * I});
  Tensor g = gu.slice(1, 0, I), u = gu.slice(1, I, 2 * I);
  cpu::linear(x, gate, nullptr, g);
  cpu::linear(x, up, nullptr, u);
  if (round_bf16) round_to_bf16(gu);
  silu_and_mul(gu, act);
}

namespace {
void check_rope_rows(const Tensor& x, const ops::RopeArgs& r, std::span<const int32_t> slots, const char* op) {
  MS_CHECK(x.dim() == 3 && x.size(0) == int64_t(slots.size()) && r.rot_dim % 2 == 0 && r.rot_dim <= x.size(2), op,
           ": ", x.describe(), " with ", slots.size(), " slots and rot_dim ", r.rot_dim);
}
}  // namespace

void rope_store_kv(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& r,
                   std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                   const ops::HeadNorm* qk_norm) {
  check_rope_rows(q, r, slots, "rope_store_kv");
  check_rope_rows(k, r, slots, "rope_store_kv");
  Tensor kr = k.clone();  // k stays as the caller made it; the roped copy is what is cached
  if (qk_norm) {
    // A token's q heads are contiguous rows even when q is a slice of a fused projection.
    for (int64_t t = 0; t < q.size(0); ++t) {
      Tensor heads = q.select(t);
      rms_norm(heads, qk_norm->q, qk_norm->eps, heads);
    }
    Tensor k_heads = kr.view({-1, kr.size(2)});
    rms_norm(k_heads, qk_norm->k, qk_norm->eps, k_heads);
    if (round_bf16) round_to_bf16(q), round_to_bf16(kr);
  }
  rope(q, 0, r.rot_dim, r.positions, r.cos, r.sin, r.interleaved);
  rope(kr, 0, r.rot_dim, r.positions, r.cos, r.sin, r.interleaved);
  if (round_bf16) round_to_bf16(q), round_to_bf16(kr);
  scatter_rows(kr, slots, k_cache);
  scatter_rows(v, slots, v_cache);
}

void mla_rope_store(Tensor& q, const Tensor& kv, const Tensor& kv_norm, float eps, const ops::RopeArgs& r,
                    std::span<const int32_t> slots, bool round_bf16, Tensor& cache) {
  check_rope_rows(q, r, slots, "mla_rope_store");
  const int64_t T = kv.size(0), L = kv.size(1) - r.rot_dim;
  MS_CHECK(kv.dim() == 2 && L > 0 && kv_norm.numel() == L, "mla_rope_store: kv ", kv.describe(), " with rot_dim ",
           r.rot_dim, " and a norm of ", kv_norm.describe());
  Tensor row = kv.clone();
  Tensor latent = row.slice(1, 0, L);
  rms_norm(latent, kv_norm, eps, latent);
  Tensor row3 = row.view({T, 1, L + r.rot_dim});
  rope(row3, int(L), r.rot_dim, r.positions, r.cos, r.sin, r.interleaved);
  rope(q, int(q.size(2)) - r.rot_dim, r.rot_dim, r.positions, r.cos, r.sin, r.interleaved);
  if (round_bf16) round_to_bf16(row), round_to_bf16(q);
  scatter_rows(row, slots, cache);
}

// The two ops in turn: the CPU has no launch to save.
void rope_store_kv_attention(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                             std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                             const ops::HeadNorm* qk_norm, const ops::AttentionLayout& layout, float scale,
                             Tensor& out) {
  cpu::rope_store_kv(q, k, v, rope, slots, round_bf16, k_cache, v_cache, qk_norm);
  cpu::attention(q, k_cache, v_cache, layout, scale, out);
}

// The attention, then o's product and the post-attention norm, rounded where the layer rounded them.
void rope_store_kv_attention_o_add_norm(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                                        std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache,
                                        Tensor& v_cache, const ops::HeadNorm* qk_norm, const AttentionLayout& layout,
                                        float scale, Tensor& attn, const ops::PostAttention& post) {
  cpu::rope_store_kv_attention(q, k, v, rope, slots, round_bf16, k_cache, v_cache, qk_norm, layout, scale, attn);
  if (round_bf16) cpu::round_to_bf16(attn);
  Tensor y = Tensor::uninit(attn.dtype(), {q.size(0), post.o.out_features()}, Device::CPU);
  cpu::linear(attn.view({q.size(0), attn.size(1) * attn.size(2)}), post.o, nullptr, y);
  if (round_bf16) cpu::round_to_bf16(y);
  cpu::add_rms_norm(post.residual, y, post.norm_weight, post.eps, post.out);
}

}  // namespace ms::cpu
