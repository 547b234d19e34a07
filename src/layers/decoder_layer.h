// One pre-norm transformer block: x += attn(norm(x)); x += ffn(norm(x)). The attention is
// GQA or MLA, the feed-forward a dense gated MLP or a sparse MoE.
#pragma once
#include <variant>

#include "layers/attention.h"
#include "layers/mlp.h"
#include "layers/moe.h"

namespace ms {

struct DecoderLayer {
  RmsNorm input_norm, post_attention_norm;
  std::variant<GqaAttention, MlaAttention> attention;
  std::variant<GatedMlp, SparseMoe> ffn;

  // hidden [T, H] is updated in place; `layer` picks this layer's KV buffers.
  void forward(Tensor& hidden, int layer, const ForwardContext& ctx) const;
};

}  // namespace ms
