// DeepSeek-V2 / V3 / R1 (DeepseekV2ForCausalLM, DeepseekV3ForCausalLM): MLA attention with
// interleaved YaRN rope, dense first layers, sparse MoE with shared experts (or the shared
// expert fused into the routed ones), the NextN (MTP) layer stored as layer
// `num_hidden_layers`, and FP8 128x128 block weights.
#include <cmath>

#include "core/check.h"
#include "models/causal_lm.h"
#include "models/weight_loader.h"

namespace ms {
namespace {

struct Builder {
  const ModelConfig& c;
  WeightLoader& w;
  const Sharding& s;
  const RopeTable* rope;

  MlaDims mla_dims() const {
    MS_CHECK(c.num_attention_heads % s.attn_tp() == 0, c.num_attention_heads, " attention heads do not split over ",
             s.attn_tp(), " attention-TP ranks (use --enable-dp-attention --dp N)");
    MlaDims d{c.num_attention_heads / s.attn_tp(), c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim,
              c.v_head_dim, 0.f};
    double scale = 1.0 / std::sqrt(double(c.qk_nope_head_dim + c.qk_rope_head_dim));
    if (c.rope_scaling.type == "yarn" && c.rope_scaling.mscale_all_dim != 0) {
      double m = yarn_get_mscale(c.rope_scaling.factor, c.rope_scaling.mscale_all_dim);
      scale *= m * m;  // YaRN's softmax correction
    }
    d.softmax_scale = float(scale);
    return d;
  }

  // Heads are split over the attention-TP group; the latent projections are replicated.
  MlaAttention mla(const std::string& p) const {
    const int64_t H = c.num_attention_heads, hidden = c.hidden_size, qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
    const float eps = float(c.rms_norm_eps);
    MlaWeights m;
    if (c.q_lora_rank > 0) {
      m.q_a_proj = w.linear(p + "q_a_proj", c.q_lora_rank, hidden);
      m.q_a_norm = RmsNorm(w.tensor(p + "q_a_layernorm.weight", {c.q_lora_rank}), eps);
      m.q_b_proj = w.linear(p + "q_b_proj", H * qk, c.q_lora_rank, false, s.attn(0, H * qk));
    } else {
      m.q_proj = w.linear(p + "q_proj", H * qk, hidden, false, s.attn(0, H * qk));
    }
    m.kv_a_proj = w.linear(p + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, hidden);
    m.kv_a_norm = RmsNorm(w.tensor(p + "kv_a_layernorm.weight", {c.kv_lora_rank}), eps);
    const int64_t kvb = H * (c.qk_nope_head_dim + c.v_head_dim);
    m.kv_b_proj = w.linear(p + "kv_b_proj", kvb, c.kv_lora_rank, false, s.attn(0, kvb));
    m.o_proj = w.linear(p + "o_proj", hidden, H * c.v_head_dim, false, s.attn(1, H * c.v_head_dim));
    return MlaAttention(std::move(m), mla_dims(), rope);
  }

  // Routed experts (this rank's), then the shared expert (n_shared_experts routed experts wide)
  // fused as `replicas` copies of n_shared_experts extra experts each, or kept as its own MLP.
  // Fused by default only where it is one expert wide (V3/R1): V2-Lite's two pieces made batch-1
  // decode 3 % faster but batch 64 13 % slower on the H200 (session 12); --n-share-experts-fusion
  // asks for them.
  SparseMoe moe(const std::string& p) const {
    const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
    const int replicas = s.fused_shared_replicas(c.n_shared_experts > 0, c.n_shared_experts == 1);
    const FusedShared fused{replicas, c.n_shared_experts, p + "shared_experts."};
    MoeWeights m;
    m.gate = w.linear(p + "gate", c.n_routed_experts, hidden);
    if (c.topk_method == "noaux_tc") m.correction_bias = w.tensor(p + "gate.e_score_correction_bias", {c.n_routed_experts});
    m.experts = load_experts(w, s, p, c.n_routed_experts, fused, hidden, inter);
    if (fused.replicas > 0) {
      w.ignore_prefix(fused.source);  // loaded above, or by the ranks holding a replica
    } else if (c.n_shared_experts > 0) {
      auto shared_shard = [&](int dim, int64_t full) { return s.shared_expert(dim, full); };
      m.shared = load_gated_mlp(w, fused.source, hidden, inter * c.n_shared_experts, shared_shard);
    }
    auto router = make_router_params(c.scoring_func, c.topk_method, c.num_experts_per_tok, c.n_group, c.topk_group,
                                     c.norm_topk_prob, c.routed_scaling_factor);
    router.fused_shared_replicas = fused.replicas, router.fused_shared_pieces = fused.pieces;
    return SparseMoe(std::move(m), router);
  }

  DecoderLayer layer(int i) const {
    return load_decoder_layer(w, c, s, i, [&](const std::string& p) { return mla(p); },
                              [&](const std::string& p) { return moe(p); });
  }

  std::unique_ptr<MtpLayer> mtp() const {
    const int i = c.num_hidden_layers;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int64_t H = c.hidden_size;
    const float eps = float(c.rms_norm_eps);
    auto m = std::make_unique<MtpLayer>();
    m->embed = w.tensor(p + "embed_tokens.weight", {c.vocab_size, H});
    m->enorm = RmsNorm(w.tensor(p + "enorm.weight", {H}), eps);
    m->hnorm = RmsNorm(w.tensor(p + "hnorm.weight", {H}), eps);
    m->eh_proj = w.linear(p + "eh_proj", H, 2 * H);
    m->final_norm = RmsNorm(w.tensor(p + "shared_head.norm.weight", {H}), eps);
    m->head = w.linear(p + "shared_head.head", c.vocab_size, H);
    m->block = std::make_unique<DecoderLayer>(layer(i));
    return m;
  }
};

std::unique_ptr<RopeTable> deepseek_rope(const ModelConfig& c) {
  if (c.rope_scaling.type != "yarn")
    return std::make_unique<RopeTable>(RopeTable::build(c.qk_rope_head_dim, c.rope_theta, c.max_position_embeddings, true));
  const auto& r = c.rope_scaling;
  YarnParams y{r.factor, r.original_max_position_embeddings, r.beta_fast, r.beta_slow, r.mscale, r.mscale_all_dim};
  return std::make_unique<RopeTable>(RopeTable::build(c.qk_rope_head_dim, c.rope_theta, c.max_position_embeddings, true, &y));
}

}  // namespace

void build_deepseek_v2(CausalLM& m, WeightLoader& w, const Sharding& s, const LoadOptions& options) {
  const ModelConfig& c = m.config;
  m.rope = deepseek_rope(c);
  Builder b{c, w, s, m.rope.get()};
  m.embed = w.tensor("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  for (int i = 0; i < c.num_hidden_layers; ++i) m.layers.push_back(b.layer(i));
  m.final_norm = RmsNorm(w.tensor("model.norm.weight", {c.hidden_size}), float(c.rms_norm_eps));
  m.lm_head = load_lm_head(w, c, m.embed, s);
  m.kv_shapes = MlaAttention::kv_shapes(b.mla_dims());
  const std::string mtp_prefix = "model.layers." + std::to_string(c.num_hidden_layers) + ".";
  if (c.num_nextn_predict_layers > 0 && w.has(mtp_prefix + "eh_proj.weight")) {
    if (options.load_mtp) m.mtp = b.mtp();
    else w.ignore_prefix(mtp_prefix);
  }
}

}  // namespace ms
