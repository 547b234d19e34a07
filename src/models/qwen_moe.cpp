// Qwen2-MoE and Qwen3-MoE (Qwen2MoeForCausalLM, Qwen3MoeForCausalLM): GQA with NeoX rope
// (Qwen2: qkv bias; Qwen3: per-head q/k RMSNorm), softmax top-k experts, dense layers through
// mlp_only_layers / decoder_sparse_step, Qwen2's sigmoid-gated shared expert.
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

  // Query heads split over the attention-TP group; with fewer KV heads than ranks, each KV
  // head is replicated on the ranks whose query heads use it.
  int local_kv_heads() const { return std::max(1, c.num_key_value_heads / s.attn_tp()); }
  Shard kv_rows() const {
    const int A = s.attn_tp(), KV = c.num_key_value_heads, D = c.head_dim;
    if (KV >= A) return s.attn(0, int64_t(KV) * D);
    MS_CHECK(A % KV == 0, KV, " KV heads cannot be shared evenly by ", A, " attention-TP ranks");
    return Shard::range(0, int64_t(s.attn_rank() / (A / KV)) * D, D, "--enable-dp-attention --dp N");
  }

  GqaAttention attention(const std::string& p) const {
    const int64_t hidden = c.hidden_size, D = c.head_dim, Hq = int64_t(c.num_attention_heads) * D;
    const int64_t Hkv = int64_t(c.num_key_value_heads) * D;
    MS_CHECK(c.num_attention_heads % s.attn_tp() == 0, c.num_attention_heads, " attention heads do not split over ",
             s.attn_tp(), " attention-TP ranks");
    const bool bias = c.attention_bias;
    GqaWeights g;
    g.q_proj = w.linear(p + "q_proj", Hq, hidden, bias, s.attn(0, Hq));
    g.k_proj = w.linear(p + "k_proj", Hkv, hidden, bias, kv_rows());
    g.v_proj = w.linear(p + "v_proj", Hkv, hidden, bias, kv_rows());
    g.o_proj = w.linear(p + "o_proj", hidden, Hq, false, s.attn(1, Hq));
    if (c.model_type == "qwen3_moe") {
      g.qk_norm = true;
      g.q_norm = RmsNorm(w.tensor(p + "q_norm.weight", {D}), float(c.rms_norm_eps));
      g.k_norm = RmsNorm(w.tensor(p + "k_norm.weight", {D}), float(c.rms_norm_eps));
    }
    return GqaAttention(std::move(g), c.num_attention_heads / s.attn_tp(), local_kv_heads(), int(D), rope);
  }

  SparseMoe moe(const std::string& p) const {
    const int64_t hidden = c.hidden_size, inter = c.moe_intermediate_size;
    MoeWeights m;
    m.gate = w.linear(p + "gate", c.n_routed_experts, hidden);
    m.experts = load_experts(w, s, p, c.n_routed_experts, {}, hidden, inter);
    if (c.shared_expert_intermediate_size > 0) {  // gated by a per-token sigmoid: cannot be fused
      auto shared_shard = [&](int dim, int64_t full) { return s.shared_expert(dim, full); };
      m.shared = load_gated_mlp(w, p + "shared_expert.", hidden, c.shared_expert_intermediate_size, shared_shard);
      m.shared_gate = w.linear(p + "shared_expert_gate", 1, hidden);
    }
    auto router = make_router_params("softmax", "greedy", c.num_experts_per_tok, 1, 1, c.norm_topk_prob, 1.0);
    return SparseMoe(std::move(m), router);
  }

  DecoderLayer layer(int i) const {
    return load_decoder_layer(w, c, s, i, [&](const std::string& p) { return attention(p); },
                              [&](const std::string& p) { return moe(p); });
  }
};

}  // namespace

void build_qwen_moe(CausalLM& m, WeightLoader& w, const Sharding& s) {
  const ModelConfig& c = m.config;
  MS_CHECK(c.rope_scaling.type.empty(), "rope_scaling \"", c.rope_scaling.type, "\" is not supported for ",
           c.architecture);
  m.rope = std::make_unique<RopeTable>(RopeTable::build(c.head_dim, c.rope_theta, c.max_position_embeddings, false));
  Builder b{c, w, s, m.rope.get()};
  m.embed = w.tensor("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  for (int i = 0; i < c.num_hidden_layers; ++i) m.layers.push_back(b.layer(i));
  m.final_norm = RmsNorm(w.tensor("model.norm.weight", {c.hidden_size}), float(c.rms_norm_eps));
  m.lm_head = load_lm_head(w, c, m.embed, s);
  m.kv_shapes = GqaAttention::kv_shapes(b.local_kv_heads(), c.head_dim);
}

}  // namespace ms
