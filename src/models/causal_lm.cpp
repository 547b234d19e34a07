#include "models/causal_lm.h"

#include <cstring>

#include "core/check.h"
#include "models/weight_loader.h"

namespace ms {

Tensor CausalLM::forward_hidden(const ForwardContext& ctx) const {
  const auto& b = ctx.batch;
  MS_CHECK(b.positions.size() == b.input_ids.size() && b.out_cache_loc.size() == b.input_ids.size(),
           "forward: ids, positions and cache slots differ in length");
  Tensor hidden = ctx.empty({b.num_tokens(), config.hidden_size});
  ops::embedding(embed, b.input_ids, hidden, b.earlier_ids.defined() ? &b.earlier_ids : nullptr);
  return forward_layers(layers, hidden, final_norm, ctx);
}

// Rows whose logits are wanted: every token, or the last token of each sequence.
static Tensor select_rows(const Tensor& hidden, const ForwardContext& ctx) {
  const ForwardBatch& b = ctx.batch;
  if (b.all_logits) return hidden;
  std::vector<int32_t> last(static_cast<size_t>(b.num_seqs()));
  bool every_row = b.num_seqs() == hidden.size(0);
  for (int s = 0; s < b.num_seqs(); ++s) every_row &= (last[s] = b.attn.q_start[s + 1] - 1) == s;
  // A decode step's rows are all last rows: no gather (in a captured step, its row list would be
  // a host-to-device copy node of its own before the lm_head).
  if (every_row) return hidden;
  Tensor out = ctx.empty({b.num_seqs(), hidden.size(1)});
  ops::gather_rows(hidden, last, out);
  return out;
}

Tensor CausalLM::logits(const Tensor& hidden) const {
  Tensor local = lm_head(hidden);
  if (!groups || groups->attn_tp->size() == 1) return local;
  // Each rank scored its slice of the vocabulary: gather the slices side by side. The gather is
  // rank-major ([n, T, part]); token t's row is its n slices in rank order, so row t * n + r of
  // the result ([T * n, part]) is row r * T + t of the gather. Reordered on the logits' device:
  // through the host this was two copies of B x vocab values a step (30 ms at tp 2, batch 64).
  const int64_t T = local.size(0), part = local.size(1);
  const int n = groups->attn_tp->size();
  Tensor all = groups->attn_tp->all_gather_v(local.view({1, T * part}));
  std::vector<int32_t> order(size_t(T) * size_t(n));
  for (int64_t t = 0; t < T; ++t)
    for (int r = 0; r < n; ++r) order[size_t(t * n + r)] = int32_t(r * T + t);
  Tensor out = Tensor::uninit(local.dtype(), {T * n, part}, local.device());
  ops::gather_rows(all.view({n * T, part}), order, out);
  return out.view({T, n * part});
}

Tensor CausalLM::forward(const ForwardContext& ctx) const { return logits(select_rows(forward_hidden(ctx), ctx)); }

Tensor CausalLM::mtp_forward(const ForwardContext& ctx, const Tensor& hidden) const {
  Tensor h = mtp_hidden(ctx, hidden);  // checks that there is an MTP layer
  return mtp->head(h);
}

Tensor CausalLM::mtp_hidden(const ForwardContext& ctx, const Tensor& hidden) const {
  MS_CHECK(mtp != nullptr, "this model has no MTP (NextN) layer");
  const auto& b = ctx.batch;
  const int64_t T = b.num_tokens(), H = config.hidden_size;
  MS_CHECK(hidden.size(0) == T, "mtp_forward: ", T, " tokens but ", hidden.size(0), " hidden rows");
  Tensor e = ctx.empty({T, H});
  ops::embedding(mtp->embed, b.input_ids, e);
  Tensor cat = ctx.empty({T, 2 * H});
  Tensor left = cat.slice(1, 0, H), right = cat.slice(1, H, 2 * H);
  mtp->enorm.forward(e, left);
  mtp->hnorm.forward(hidden, right);
  ctx.round(cat);
  Tensor h = mtp->eh_proj(cat);
  ctx.round(h);
  return forward_layers({mtp->block.get(), 1}, h, mtp->final_norm, ctx);
}

Linear load_lm_head(WeightLoader& loader, const ModelConfig& c, const Tensor& embed, const Sharding& sharding) {
  Shard vocab = Shard::split(0, c.vocab_size, sharding.attn_rank(), sharding.attn_tp(),
                             "--enable-dp-attention --dp N, so that attention TP divides the vocabulary");
  if (!c.tie_word_embeddings) return loader.linear("lm_head", c.vocab_size, c.hidden_size, false, vocab);
  loader.ignore_prefix("lm_head.weight");  // some tied checkpoints store a copy anyway
  return Linear(ops::Weight{vocab.whole() ? embed : embed.slice(0, vocab.begin, vocab.begin + vocab.count).clone()});
}

DecoderLayer load_decoder_layer(WeightLoader& w, const ModelConfig& c, const Sharding& s, int layer,
                                const std::function<std::variant<GqaAttention, MlaAttention>(const std::string&)>& attention,
                                const std::function<SparseMoe(const std::string&)>& moe) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const float eps = float(c.rms_norm_eps);
  const bool sparse = c.is_moe_layer(layer);
  auto dense_shard = [&](int dim, int64_t full) { return s.dense(dim, full); };
  auto ffn = sparse ? std::variant<GatedMlp, SparseMoe>(moe(p + "mlp."))
                    : std::variant<GatedMlp, SparseMoe>(
                          load_gated_mlp(w, p + "mlp.", c.hidden_size, c.intermediate_size, dense_shard));
  return DecoderLayer{RmsNorm(w.tensor(p + "input_layernorm.weight", {c.hidden_size}), eps),
                      RmsNorm(w.tensor(p + "post_attention_layernorm.weight", {c.hidden_size}), eps),
                      attention(p + "self_attn."), std::move(ffn), sparse ? s.moe_mode() : s.dense_mode()};
}

ops::ExpertWeights load_experts(WeightLoader& w, const Sharding& s, const std::string& prefix, int n_routed,
                                const FusedShared& fused, int64_t hidden, int64_t inter) {
  const int total = n_routed + fused.experts();
  auto [first, count] = s.local_experts(total);
  ops::ExpertWeights experts;
  experts.first_expert = first, experts.total_experts = total;
  for (int e = 0; e < n_routed; ++e)  // other ranks' experts are theirs to load
    if (e < first || e >= first + count) w.ignore_prefix(prefix + "experts." + std::to_string(e) + ".");
  for (int e = first; e < first + count; ++e) {
    GatedMlp mlp = [&] {
      if (e < n_routed) {
        auto shard = [&](int dim, int64_t full) { return s.expert(dim, full); };
        return load_gated_mlp(w, prefix + "experts." + std::to_string(e) + ".", hidden, inter, shard);
      }
      const int piece = (e - n_routed) % fused.pieces;  // of replica (e - n_routed) / pieces
      auto shard = [&](int dim, int64_t) { return s.expert_piece(dim, inter, piece); };
      return load_gated_mlp(w, fused.source, hidden, inter * fused.pieces, shard);
    }();
    experts.gate.push_back(mlp.gate().weight()), experts.up.push_back(mlp.up().weight());
    experts.down.push_back(mlp.down().weight());
  }
  return experts;
}

std::unique_ptr<CausalLM> load_model(const std::string& dir, const LoadOptions& options) {
  ops::init_backend(options.device);
  auto model = std::make_unique<CausalLM>();
  model->config = load_model_config(dir);
  model->weights = std::make_shared<WeightStore>(WeightStore::open_dir(dir));
  model->device = options.device;
  model->act_dtype = options.act_dtype;
  model->groups = options.groups;
  options.parallel.validate();
  Sharding sharding(options.parallel, options.groups ? options.groups->layout : RankLayout{});
  WeightLoader loader(*model->weights, model->config, options.device);
  const ModelConfig& c = model->config;
  if (c.is_deepseek()) build_deepseek_v2(*model, loader, sharding, options);
  else build_qwen_moe(*model, loader, sharding);
  loader.finish();
  *model->rope = model->rope->to(options.device);
  return model;
}

}  // namespace ms
