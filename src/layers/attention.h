// Attention layers over the slot KV cache: GQA (Qwen: optional qkv bias and per-head q/k
// RMSNorm, NeoX rope) and MLA (DeepSeek: low-rank q and kv, latent cache; absorbed form, prefills
// expanded).
#pragma once
#include <utility>

#include "layers/forward.h"
#include "layers/linear.h"
#include "layers/rope.h"

namespace ms {

struct GqaWeights {
  Linear q_proj, k_proj, v_proj, o_proj;
  RmsNorm q_norm, k_norm;  // Qwen3 only
  bool qk_norm = false;
  Linear qkv_proj;  // q, k and v rows in one, made by GqaAttention (then the three are empty)
};

class GqaAttention {
 public:
  GqaAttention(GqaWeights w, int num_heads, int num_kv_heads, int head_dim, const RopeTable* rope);
  // x [T, hidden] -> [T, hidden]; writes this layer's keys/values to kv buffers (0: K, 1: V).
  Tensor forward(const Tensor& x, int layer, const ForwardContext& ctx) const;
  // forward, then the decoder layer's post-attention norm: residual += forward(x), out =
  // norm(residual). One op (ops::rope_store_kv_attention_o_add_norm), which lets a GPU decode
  // step merge the attention's splits inside o's product.
  void forward_add_norm(const Tensor& x, int layer, const ForwardContext& ctx, Tensor& residual, const RmsNorm& norm,
                        Tensor& out) const;
  static std::vector<Shape> kv_shapes(int num_kv_heads, int head_dim) { return {{num_kv_heads, head_dim}, {num_kv_heads, head_dim}}; }
  bool fused_projection() const { return w_.qkv_proj.defined(); }

 private:
  struct Heads {
    Tensor q, k, v;  // [T, heads, D] each
  };
  Heads project(const Tensor& x, const ForwardContext& ctx) const;  // q, k and v, rounded
  GqaWeights w_;
  int heads_, kv_heads_, head_dim_;
  const RopeTable* rope_;
};

struct MlaWeights {
  Linear q_a_proj, q_b_proj;  // q_lora_rank > 0
  RmsNorm q_a_norm;
  Linear q_proj;              // q_lora_rank == 0 (V2-Lite)
  Linear kv_a_proj;           // [kv_lora + rope, hidden]
  Linear q_kv_a_proj;         // q_a_proj (or q_proj) and kv_a_proj in one, made by MlaAttention (both then empty)
  RmsNorm kv_a_norm;
  Linear kv_b_proj;           // [heads * (nope + v), kv_lora]
  Linear o_proj;
};

struct MlaDims {
  int heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
  float softmax_scale;
};

class MlaAttention {
 public:
  MlaAttention(MlaWeights w, MlaDims d, const RopeTable* rope);
  // x [T, hidden] -> [T, hidden]; caches the normalised latent and the roped key (buffer 0).
  Tensor forward(const Tensor& x, int layer, const ForwardContext& ctx) const;
  static std::vector<Shape> kv_shapes(const MlaDims& d) { return {{d.kv_lora_rank + d.qk_rope_head_dim}}; }
  bool fused_projection() const { return w_.q_kv_a_proj.defined(); }
  // Whether a step runs MLA in the expanded form (ops::mla_prefill_expanded): when it brings at
  // least kExpandedMinTokens queries and expanding its keys (its cached prefix included) costs
  // fewer flops than the absorbed form's wider (query, key) pairs save. Decode and verify steps,
  // few queries over long prefixes, stay absorbed. The fixtures' 33- and 300-token prompts take it.
  // The expanded keys are scratch of K x H x (nope + v) values: at most kExpandedMaxValues (1 GiB
  // of bf16, 16k keys of V3's 128 heads); longer contexts stay absorbed.
  static constexpr int kExpandedMinTokens = 32;
  static constexpr int64_t kExpandedMaxValues = int64_t(1) << 29;
  static bool expanded_pays(const ops::AttentionLayout& layout, const MlaDims& d);

 private:
  // x's two projections, rounded: q_a's (or q_proj's without q_lora) and kv_a's.
  std::pair<Tensor, Tensor> project_x(const Tensor& x, const ForwardContext& ctx) const;
  // q [T, H * (nope + R)] from the first of them (normalised in place on the way).
  Tensor project_q(Tensor& first, const ForwardContext& ctx) const;
  MlaWeights w_;
  MlaDims d_;
  const RopeTable* rope_;
};

}  // namespace ms
