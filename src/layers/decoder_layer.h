// One pre-norm transformer block: x += attn(norm(x)); x += ffn(norm(x)). The attention is
// GQA or MLA, the feed-forward a dense gated MLP or a sparse MoE. With several ranks, the
// attention output is summed over the attention-TP group, and a sharded feed-forward runs over
// the tokens of every DP rank (gathered first) and is summed over all ranks. Each residual add
// is fused with the norm that reads its result (ops::add_rms_norm): the add after attention with
// post_attention_norm, the add after the feed-forward with the next block's input_norm, or the
// model's final norm after the last block; forward_layers drives a stack that way. A MoE block
// whose output goes straight into that add (no reduction over ranks) goes further and has its
// experts' rows summed inside the norm (SparseMoe::forward_add_norm).
#pragma once
#include <span>
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

  // hidden [T, H] is the residual stream, updated in place; h = input_norm(hidden) on entry,
  // next_norm(hidden) on return (a new tensor). `layer` picks this layer's KV buffers.
  void forward(Tensor& hidden, Tensor& h, int layer, const ForwardContext& ctx, const RmsNorm& next_norm) const;

 private:
  Tensor feed_forward(const Tensor& h, const ForwardContext& ctx) const;
  Tensor sharded_feed_forward(const Tensor& h, const ForwardContext& ctx) const;
};

// Runs `layers` (KV buffers 0, 1, ...) over the residual stream hidden [T, H], updated in
// place, and returns final_norm of its result (rounded as bf16 storage would be, ctx.round).
Tensor forward_layers(std::span<const DecoderLayer> layers, Tensor& hidden, const RmsNorm& final_norm,
                      const ForwardContext& ctx);

}  // namespace ms
