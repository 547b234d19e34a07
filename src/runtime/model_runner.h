// Owns the KV cache of the token-slot pool and turns a ScheduleBatch into logits: it builds
// the ForwardBatch (flat ids, positions, out_cache_loc, and per sequence its slots read from
// req_to_token) and runs the model on its device. On the GPU, steps replay CUDA graphs
// (captured at construction): decode batches of one new token per sequence, or with speculative
// decoding the verify batches of its verified token plus its drafts per sequence. The KV cache
// then has one slot beyond the pool's, where padding sequences write.
#pragma once
#include <cstdint>
#include <memory>

#include "layers/forward.h"
#include "models/causal_lm.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/kv_pool.h"
#include "runtime/scheduler.h"

namespace ms {

class ModelRunner {
 public:
  // graphs: captured for batches up to graphs.max_bs sequences when enabled on the model's device;
  // verify_tokens > 0: for verify batches of that many tokens per sequence instead of decode.
  // sampled_rows > 0: keeps a device array of that many sampled ids (overlap scheduling).
  ModelRunner(const CausalLM& model, int64_t num_slots, bool bf16_activations, CudaGraphSettings graphs = {},
              int verify_tokens = 0, int sampled_rows = 0);

  // Logits [sequences, vocab] of the last token of each sequence of the batch, on the model's
  // device; a replayed graph's logits stay valid until the next forward. A token placeholder
  // -(j + 1) among the batch's ids reads row j of sampled_ids.
  Tensor forward(const ScheduleBatch& batch, const ReqToTokenTable& table);
  // The device array a step's sampled ids are written to (the first `rows`), which the next
  // step's placeholders read.
  Tensor sampled_ids(int64_t rows) const { return sampled_ids_.narrow_rows(0, rows); }
  // Final hidden states [T, H] of every token of a built batch, on the model's device (the
  // speculative path takes logits of chosen rows and hands the rest to its draft model).
  Tensor forward_hidden(const ForwardBatch& fb);
  // The final hidden states and logits of every token of a speculative verify batch (replayed
  // graphs' outputs stay valid until the next forward).
  struct HiddenAndLogits {
    Tensor hidden, logits;
  };
  HiddenAndLogits forward_verify(const ForwardBatch& fb);
  // A forward of no tokens: what a rank whose DP group has nothing to run does in a step, so
  // that it still joins the MoE and TP collectives of its peers.
  void idle_forward();

  static ForwardBatch build_forward_batch(const ScheduleBatch& batch, const ReqToTokenTable& table);
  // KV bytes of one token slot (all layers) for this model.
  static size_t bytes_per_slot(const CausalLM& model);

  const CausalLM& model() const { return model_; }
  int64_t num_slots() const { return num_slots_; }
  int64_t graph_replays() const { return graphs_ ? graphs_->replays() : 0; }

 private:
  ForwardContext context(const ForwardBatch& fb);

  const CausalLM& model_;
  int64_t num_slots_;
  KvCache kv_;
  bool bf16_;
  std::unique_ptr<CudaGraphRunner> graphs_;  // null: every step op by op
  bool verify_graphs_ = false;               // graphs_ serves verify batches, not decode
  Tensor sampled_ids_;                       // I32 [sampled_rows]; undefined without overlap
};

// Memory of `device` for sizing the pool from --mem-fraction-static.
MemoryInfo device_memory_info(Device device);

}  // namespace ms
