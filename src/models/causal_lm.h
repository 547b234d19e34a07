// A decoder-only MoE language model assembled by a family file (deepseek_v2.cpp,
// qwen_moe.cpp): embedding, decoder layers, final norm, lm head, and optionally DeepSeek's
// multi-token-prediction (NextN) layer.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "layers/decoder_layer.h"
#include "layers/rope.h"
#include "models/sharding.h"

namespace ms {

class WeightLoader;

// DeepSeek's NextN layer: eh_proj(cat(enorm(embed(next token)), hnorm(hidden))), one decoder
// layer, then its own norm and head.
struct MtpLayer {
  Tensor embed;  // the layer's own embed_tokens
  RmsNorm enorm, hnorm, final_norm;
  Linear eh_proj, head;
  std::unique_ptr<DecoderLayer> block;
};

class CausalLM {
 public:
  ModelConfig config;
  std::shared_ptr<const WeightStore> weights;  // keeps the mmapped checkpoint alive
  std::unique_ptr<RopeTable> rope;
  Tensor embed;
  std::vector<DecoderLayer> layers;
  RmsNorm final_norm;
  Linear lm_head;
  std::unique_ptr<MtpLayer> mtp;
  std::vector<Shape> kv_shapes;  // per token, per layer (same for every layer)
  Device device = Device::CPU;
  DType act_dtype = DType::F32;  // activation and KV dtype the kernels of `device` use
  const ParallelGroups* groups = nullptr;  // this rank's communicators; null when alone

  // Runs the decoder stack over ctx.batch; returns the final-normalised hidden states [T, H].
  Tensor forward_hidden(const ForwardContext& ctx) const;
  // Logits [rows, vocab] for every token (batch.all_logits) or the last token of each sequence.
  Tensor forward(const ForwardContext& ctx) const;
  // lm_head over hidden [T, H]; a vocabulary split over attention-TP ranks is gathered.
  Tensor logits(const Tensor& hidden) const;
  // The MTP layer over ctx.batch, whose input_ids are the *next* tokens and whose positions are
  // those of `hidden` [T, H] (the main model's final hidden states); ctx.kv is the MTP's own
  // one-layer cache. Returns logits for every token.
  Tensor mtp_forward(const ForwardContext& ctx, const Tensor& hidden) const;
  // mtp_forward without the head: the MTP layer's normalised output [T, H], which a chain
  // draft feeds back as the next step's `hidden` (EAGLE: the target's hidden is not known yet).
  Tensor mtp_hidden(const ForwardContext& ctx, const Tensor& hidden) const;

  KvCache make_kv_cache(int64_t slots) const {
    return KvCache(int(layers.size()), kv_shapes, slots, act_dtype, device);
  }
  KvCache make_mtp_kv_cache(int64_t slots) const { return KvCache(1, kv_shapes, slots, act_dtype, device); }
};

struct LoadOptions {
  bool load_mtp = true;  // load the NextN layer when the checkpoint has one
  Device device = Device::CPU;
  DType act_dtype = DType::F32;
  ParallelConfig parallel;                 // the flags (also fusion settings for one rank)
  const ParallelGroups* groups = nullptr;  // this rank's place and communicators; null: rank 0 of 1
};

// Reads config.json and the safetensors shards of `dir` and builds the model for its
// architecture. Throws with the file, tensor or field named on any malformed input.
std::unique_ptr<CausalLM> load_model(const std::string& dir, const LoadOptions& options = {});

// The lm head: `lm_head.weight`, or the embedding itself when tie_word_embeddings is set; its
// vocabulary rows split over the attention-TP group.
Linear load_lm_head(WeightLoader& loader, const ModelConfig& config, const Tensor& embed, const Sharding& sharding);
// The shared expert fused into the routed experts: `replicas` copies of the gated MLP under
// `source`, whose intermediate dimension is `pieces` routed experts wide; each copy is `pieces`
// experts of the routed shape (rows of gate / up and columns of down, piece by piece).
struct FusedShared {
  int replicas = 0, pieces = 1;
  std::string source;
  int experts() const { return replicas * pieces; }
};
// This rank's experts of an MoE block under `prefix` (".../mlp."): routed expert e reads
// `experts.e.`, the fused shared expert's pieces (ids n_routed + replica * pieces + piece) read
// theirs of `fused.source`; the experts other ranks hold are skipped.
ops::ExpertWeights load_experts(WeightLoader& w, const Sharding& s, const std::string& prefix, int n_routed,
                                const FusedShared& fused, int64_t hidden, int64_t inter);
// Layer `layer` of a family: its norms, the attention `attention(prefix)` builds, and a dense
// MLP (intermediate_size) or the MoE `moe(prefix)` builds, as the config's layer rule says.
DecoderLayer load_decoder_layer(WeightLoader& w, const ModelConfig& c, const Sharding& s, int layer,
                                const std::function<std::variant<GqaAttention, MlaAttention>(const std::string&)>& attention,
                                const std::function<SparseMoe(const std::string&)>& moe);
// gate/up split on the intermediate dimension and down on its input, by `shard(dim, full)`.
template <class ShardFn>
GatedMlp load_gated_mlp(WeightLoader& w, const std::string& p, int64_t hidden, int64_t inter, ShardFn shard) {
  return GatedMlp(w.linear(p + "gate_proj", inter, hidden, false, shard(0, inter)),
                  w.linear(p + "up_proj", inter, hidden, false, shard(0, inter)),
                  w.linear(p + "down_proj", hidden, inter, false, shard(1, inter)));
}

// Family builders (one file each), called by load_model.
void build_deepseek_v2(CausalLM& model, WeightLoader& loader, const Sharding& sharding, const LoadOptions& options);
void build_qwen_moe(CausalLM& model, WeightLoader& loader, const Sharding& sharding);

}  // namespace ms
