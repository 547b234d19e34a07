// One pre-norm transformer block: x += attn(norm(x)); x += ffn(norm(x)). The attention is
// GQA or MLA, the feed-forward a dense gated MLP or a sparse MoE. With several ranks, the
// attention output is summed over the attention-TP group, and a sharded feed-forward runs over
// the tokens of every DP rank (gathered first) and is summed over all ranks.
#pragma once
#include <variant>

#include "layers/attention.h"
#include "layers/mlp.h"
#include "layers/moe.h"

namespace ms {

// How the feed-forward's work is spread over ranks.
enum class FfnMode {
  Local,          // whole on every rank, on its own tokens (or a single rank)
  TensorParallel, // sharded over all ranks (TP and/or EP): gather DP tokens, sum partials
  AllToAll,       // MoE with all-to-all dispatch of routed tokens (ep == tp)
};

struct DecoderLayer {
  RmsNorm input_norm, post_attention_norm;
  std::variant<GqaAttention, MlaAttention> attention;
  std::variant<GatedMlp, SparseMoe> ffn;
  FfnMode ffn_mode = FfnMode::Local;

  // hidden [T, H] is updated in place; `layer` picks this layer's KV buffers.
  void forward(Tensor& hidden, int layer, const ForwardContext& ctx) const;

 private:
  Tensor feed_forward(const Tensor& h, const ForwardContext& ctx) const;
  Tensor sharded_feed_forward(const Tensor& h, const ForwardContext& ctx) const;
};

}  // namespace ms
