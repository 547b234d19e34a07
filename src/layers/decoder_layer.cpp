#include "layers/decoder_layer.h"

#include "core/check.h"

namespace ms {

void DecoderLayer::forward(Tensor& hidden, Tensor& h, int layer, const ForwardContext& ctx,
                           const RmsNorm& next_norm) const {
  const Tensor in = h;
  h = ctx.empty(hidden.shape());
  const bool reduce_attn = ctx.parallel && ctx.parallel->attn_tp->size() > 1;
  const auto* gqa = std::get_if<GqaAttention>(&attention);
  if (gqa && !reduce_attn) {
    gqa->forward_add_norm(in, layer, ctx, hidden, post_attention_norm, h);  // nothing between them to reduce
  } else {
    Tensor a = std::visit([&](const auto& attn) { return attn.forward(in, layer, ctx); }, attention);
    if (reduce_attn) ctx.parallel->attn_tp->all_reduce(a);
    post_attention_norm.add_forward(hidden, a, h);
  }
  ctx.round(h);
  const Tensor x = h;
  h = ctx.empty(hidden.shape());
  const bool local = !ctx.parallel || ffn_mode == FfnMode::Local;
  if (const auto* moe = std::get_if<SparseMoe>(&ffn); moe && local) {
    // Nothing comes between the block's output and the residual add (no reduction), so the
    // experts' rows are summed inside the next norm's kernel: one launch fewer a layer.
    moe->forward_add_norm(x, ctx, hidden, next_norm, h);
  } else {
    Tensor f;
    if (local) {
      f = feed_forward(x, ctx);
    } else if (ffn_mode == FfnMode::TensorParallel) {
      f = sharded_feed_forward(x, ctx);
    } else {
      f = std::get<SparseMoe>(ffn).forward_all_to_all(x, ctx);
      if (ctx.parallel->attn_tp->size() > 1) ctx.parallel->attn_tp->all_reduce(f);
    }
    next_norm.add_forward(hidden, f, h);
  }
  ctx.round(h);
}

Tensor forward_layers(std::span<const DecoderLayer> layers, Tensor& hidden, const RmsNorm& final_norm,
                      const ForwardContext& ctx) {
  MS_CHECK(!layers.empty(), "forward_layers: no layers");
  Tensor h = layers[0].input_norm(hidden);
  ctx.round(h);
  for (size_t i = 0; i < layers.size(); ++i)
    layers[i].forward(hidden, h, int(i), ctx, i + 1 < layers.size() ? layers[i + 1].input_norm : final_norm);
  return h;
}

Tensor DecoderLayer::feed_forward(const Tensor& h, const ForwardContext& ctx) const {
  return std::visit([&](const auto& m) { return m.forward(h, ctx); }, ffn);
}

// Every rank holds a shard of the weights, so every rank must see every token: under DP
// attention the DP ranks' tokens are gathered first, and each rank takes its own rows of the
// summed result back.
Tensor DecoderLayer::sharded_feed_forward(const Tensor& h, const ForwardContext& ctx) const {
  const ParallelGroups& p = *ctx.parallel;
  if (!p.config.dp_gather()) {
    Tensor f = feed_forward(h, ctx);
    p.world->all_reduce(f);
    return f;
  }
  std::vector<int64_t> dp_counts = p.dp->all_gather_values(h.size(0));
  Tensor all = p.dp->all_gather_v(h);
  Tensor f = feed_forward(all, ctx);
  if (p.config.attn_tp_size() == 1) return p.world->reduce_scatter_v(f, dp_counts);
  // Several ranks share each DP group's rows: sum everywhere, then keep this group's rows.
  p.world->all_reduce(f);
  int64_t first = 0;
  for (int g = 0; g < p.layout.attn_dp_rank; ++g) first += dp_counts[g];
  return f.slice(0, first, first + h.size(0)).clone();
}

}  // namespace ms
