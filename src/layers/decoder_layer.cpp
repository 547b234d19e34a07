#include "layers/decoder_layer.h"

namespace ms {

void DecoderLayer::forward(Tensor& hidden, int layer, const ForwardContext& ctx) const {
  Tensor h = input_norm(hidden);
  ctx.round(h);
  Tensor a = std::visit([&](const auto& attn) { return attn.forward(h, layer, ctx); }, attention);
  ops::add_inplace(hidden, a);
  h = post_attention_norm(hidden);
  ctx.round(h);
  Tensor f = std::visit([&](const auto& m) { return m.forward(h, ctx); }, ffn);
  ops::add_inplace(hidden, f);
}

}  // namespace ms
