// Qwen2-MoE and Qwen3-MoE (Qwen2MoeForCausalLM, Qwen3MoeForCausalLM): GQA with NeoX rope
// (Qwen2: qkv bias; Qwen3: per-head q/k RMSNorm), softmax top-k experts, dense layers through
// mlp_only_layers / decoder_sparse_step, Qwen2's sigmoid-gated shared expert.
#include "core/check.h"
#include "models/causal_lm.h"
#include "models/weight_loader.h"

namespace ms {
namespace {

GatedMlp load_mlp(WeightLoader& w, const std::string& p, int64_t hidden, int64_t inter) {
  return GatedMlp(w.linear(p + "gate_proj", inter, hidden), w.linear(p + "up_proj", inter, hidden),
                  w.linear(p + "down_proj", hidden, inter));
}

GqaAttention load_attention(WeightLoader& w, const std::string& p, const ModelConfig& c, const RopeTable* rope) {
  const int64_t hidden = c.hidden_size, D = c.head_dim;
  const bool qwen3 = c.model_type == "qwen3_moe", bias = c.attention_bias;
  GqaWeights g;
  g.q_proj = w.linear(p + "q_proj", c.num_attention_heads * D, hidden, bias);
  g.k_proj = w.linear(p + "k_proj", c.num_key_value_heads * D, hidden, bias);
  g.v_proj = w.linear(p + "v_proj", c.num_key_value_heads * D, hidden, bias);
  g.o_proj = w.linear(p + "o_proj", hidden, c.num_attention_heads * D);
  if (qwen3) {
    g.qk_norm = true;
    g.q_norm = RmsNorm(w.tensor(p + "q_norm.weight", {D}), float(c.rms_norm_eps));
    g.k_norm = RmsNorm(w.tensor(p + "k_norm.weight", {D}), float(c.rms_norm_eps));
  }
  return GqaAttention(std::move(g), c.num_attention_heads, c.num_key_value_heads, int(D), rope);
}

SparseMoe load_moe(WeightLoader& w, const std::string& p, const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  MoeWeights m;
  m.gate = w.linear(p + "gate", c.n_routed_experts, hidden);
  for (int e = 0; e < c.n_routed_experts; ++e) {
    std::string ep = p + "experts." + std::to_string(e) + ".";
    m.experts.gate.push_back(w.linear(ep + "gate_proj", inter, hidden).weight());
    m.experts.up.push_back(w.linear(ep + "up_proj", inter, hidden).weight());
    m.experts.down.push_back(w.linear(ep + "down_proj", hidden, inter).weight());
  }
  if (c.shared_expert_intermediate_size > 0) {
    m.shared = load_mlp(w, p + "shared_expert.", hidden, c.shared_expert_intermediate_size);
    m.shared_gate = w.linear(p + "shared_expert_gate", 1, hidden);
  }
  auto router = make_router_params("softmax", "greedy", c.num_experts_per_tok, 1, 1, c.norm_topk_prob, 1.0);
  return SparseMoe(std::move(m), router);
}

}  // namespace

void build_qwen_moe(CausalLM& m, WeightLoader& w) {
  const ModelConfig& c = m.config;
  MS_CHECK(c.rope_scaling.type.empty(), "rope_scaling \"", c.rope_scaling.type, "\" is not supported for ",
           c.architecture);
  m.rope = std::make_unique<RopeTable>(RopeTable::build(c.head_dim, c.rope_theta, c.max_position_embeddings, false));
  m.embed = w.tensor("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const float eps = float(c.rms_norm_eps);
    auto ffn = c.is_moe_layer(i)
                   ? std::variant<GatedMlp, SparseMoe>(load_moe(w, p + "mlp.", c))
                   : std::variant<GatedMlp, SparseMoe>(load_mlp(w, p + "mlp.", c.hidden_size, c.intermediate_size));
    m.layers.push_back(DecoderLayer{RmsNorm(w.tensor(p + "input_layernorm.weight", {c.hidden_size}), eps),
                                    RmsNorm(w.tensor(p + "post_attention_layernorm.weight", {c.hidden_size}), eps),
                                    load_attention(w, p + "self_attn.", c, m.rope.get()), std::move(ffn)});
  }
  m.final_norm = RmsNorm(w.tensor("model.norm.weight", {c.hidden_size}), float(c.rms_norm_eps));
  m.lm_head = load_lm_head(w, c, m.embed);
  m.kv_shapes = GqaAttention::kv_shapes(c.num_key_value_heads, c.head_dim);
}

}  // namespace ms
