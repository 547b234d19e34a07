// DeepSeek-V2 / V3 / R1 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): MLA attention with
// interleaved YaRN rope, dense first layers, sparse MoE with shared experts, the NextN (MTP)
// layer stored as layer `num_hidden_layers`, and FP8 128x128 block weights.
#include <cmath>

#include "core/check.h"
#include "models/causal_lm.h"
#include "models/weight_loader.h"

namespace ms {
namespace {

MlaDims mla_dims(const ModelConfig& c) {
  MlaDims d{c.num_attention_heads, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, 0.f};
  double scale = 1.0 / std::sqrt(double(c.qk_nope_head_dim + c.qk_rope_head_dim));
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.mscale_all_dim != 0) {
    double m = yarn_get_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
    scale *= m * m;  // YaRN's softmax correction
  }
  d.softmax_scale = float(scale);
  return d;
}

MlaAttention load_mla(WeightLoader& w, const std::string& p, const ModelConfig& c, const RopeTable* rope) {
  const int64_t H = c.num_attention_heads, hidden = c.hidden_size, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  const float eps = float(c.rms_norm_eps);
  MlaWeights m;
  if (c.q_lora_rank > 0) {
    m.q_a_proj = w.linear(p + "q_a_proj", c.q_lora_rank, hidden);
    m.q_a_norm = RmsNorm(w.tensor(p + "q_a_layernorm.weight", {c.q_lora_rank}), eps);
    m.q_b_proj = w.linear(p + "q_b_proj", H * qk, c.q_lora_rank);
  } else {
    m.q_proj = w.linear(p + "q_proj", H * qk, hidden);
  }
  m.kv_a_proj = w.linear(p + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, hidden);
  m.kv_a_norm = RmsNorm(w.tensor(p + "kv_a_layernorm.weight", {c.kv_lora_rank}), eps);
  m.kv_b_proj = w.linear(p + "kv_b_proj", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  m.o_proj = w.linear(p + "o_proj", hidden, H * c.v_head_dim);
  return MlaAttention(std::move(m), mla_dims(c), rope);
}

GatedMlp load_mlp(WeightLoader& w, const std::string& p, int64_t hidden, int64_t inter) {
  return GatedMlp(w.linear(p + "gate_proj", inter, hidden), w.linear(p + "up_proj", inter, hidden),
                  w.linear(p + "down_proj", hidden, inter));
}

SparseMoe load_moe(WeightLoader& w, const std::string& p, const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
  MoeWeights m;
  m.gate = w.linear(p + "gate", c.n_routed_experts, hidden);
  if (c.topk_method == "noaux_tc") m.correction_bias = w.tensor(p + "gate.e_score_correction_bias", {c.n_routed_experts});
  for (int e = 0; e < c.n_routed_experts; ++e) {
    std::string ep = p + "experts." + std::to_string(e) + ".";
    m.experts.gate.push_back(w.linear(ep + "gate_proj", inter, hidden).weight());
    m.experts.up.push_back(w.linear(ep + "up_proj", inter, hidden).weight());
    m.experts.down.push_back(w.linear(ep + "down_proj", hidden, inter).weight());
  }
  if (c.n_shared_experts > 0) m.shared = load_mlp(w, p + "shared_experts.", hidden, inter * c.n_shared_experts);
  auto router = make_router_params(c.scoring_func, c.topk_method, c.num_experts_per_tok, c.n_group, c.topk_group,
                                   c.norm_topk_prob, c.routed_scaling_factor);
  return SparseMoe(std::move(m), router);
}

std::unique_ptr<DecoderLayer> load_layer(WeightLoader& w, int i, const ModelConfig& c, const RopeTable* rope) {
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const float eps = float(c.rms_norm_eps);
  auto ffn = c.is_moe_layer(i) ? std::variant<GatedMlp, SparseMoe>(load_moe(w, p + "mlp.", c))
                               : std::variant<GatedMlp, SparseMoe>(load_mlp(w, p + "mlp.", c.hidden_size, c.intermediate_size));
  return std::make_unique<DecoderLayer>(DecoderLayer{RmsNorm(w.tensor(p + "input_layernorm.weight", {c.hidden_size}), eps),
                                                     RmsNorm(w.tensor(p + "post_attention_layernorm.weight", {c.hidden_size}), eps),
                                                     load_mla(w, p + "self_attn.", c, rope), std::move(ffn)});
}

std::unique_ptr<MtpLayer> load_mtp(WeightLoader& w, const ModelConfig& c, const RopeTable* rope) {
  const int i = c.num_hidden_layers;
  const std::string p = "model.layers." + std::to_string(i) + ".";
  const int64_t H = c.hidden_size;
  const float eps = float(c.rms_norm_eps);
  auto mtp = std::make_unique<MtpLayer>();
  mtp->embed = w.tensor(p + "embed_tokens.weight", {c.vocab_size, H});
  mtp->enorm = RmsNorm(w.tensor(p + "enorm.weight", {H}), eps);
  mtp->hnorm = RmsNorm(w.tensor(p + "hnorm.weight", {H}), eps);
  mtp->eh_proj = w.linear(p + "eh_proj", H, 2 * H);
  mtp->final_norm = RmsNorm(w.tensor(p + "shared_head.norm.weight", {H}), eps);
  mtp->head = w.linear(p + "shared_head.head", c.vocab_size, H);
  mtp->block = load_layer(w, i, c, rope);
  return mtp;
}

}  // namespace

void build_deepseek_v2(CausalLM& m, WeightLoader& w, const LoadOptions& options) {
  const ModelConfig& c = m.config;
  if (c.rope_scaling.type == "yarn") {
    const auto& r = c.rope_scaling;
    YarnParams y{r.factor, r.original_max_position_embeddings, r.beta_fast, r.beta_slow, r.mscale, r.mscale_all_dim};
    m.rope = std::make_unique<RopeTable>(
        RopeTable::build(c.qk_rope_head_dim, c.rope_theta, c.max_position_embeddings, true, &y));
  } else {
    m.rope = std::make_unique<RopeTable>(RopeTable::build(c.qk_rope_head_dim, c.rope_theta, c.max_position_embeddings, true));
  }
  m.embed = w.tensor("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  for (int i = 0; i < c.num_hidden_layers; ++i) m.layers.push_back(std::move(*load_layer(w, i, c, m.rope.get())));
  m.final_norm = RmsNorm(w.tensor("model.norm.weight", {c.hidden_size}), float(c.rms_norm_eps));
  m.lm_head = load_lm_head(w, c, m.embed);
  m.kv_shapes = MlaAttention::kv_shapes(mla_dims(c));
  const std::string mtp_prefix = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  if (c.num_nextn_predict_layers > 0 && w.has(mtp_prefix + "eh_proj.weight")) {
    if (options.load_mtp) m.mtp = load_mtp(w, c, m.rope.get());
    else w.ignore_prefix(mtp_prefix);
  }
}

}  // namespace ms
