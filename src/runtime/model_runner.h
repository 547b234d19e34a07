// Owns the KV cache of the token-slot pool and turns a ScheduleBatch into logits: it builds
// the ForwardBatch (flat ids, positions, out_cache_loc, and per sequence its slots read from
// req_to_token) and runs the model on its device.
#pragma once
#include <cstdint>

#include "layers/forward.h"
#include "models/causal_lm.h"
#include "runtime/kv_pool.h"
#include "runtime/scheduler.h"

namespace ms {

class ModelRunner {
 public:
  ModelRunner(const CausalLM& model, int64_t num_slots, bool bf16_activations);

  // Host F32 logits [sequences, vocab]: the last token of each sequence of the batch.
  Tensor forward(const ScheduleBatch& batch, const ReqToTokenTable& table);
  // Final hidden states [T, H] of every token of a built batch, on the model's device (the
  // speculative path takes logits of chosen rows and hands the rest to its draft model).
  Tensor forward_hidden(const ForwardBatch& fb);

  static ForwardBatch build_forward_batch(const ScheduleBatch& batch, const ReqToTokenTable& table);
  // KV bytes of one token slot (all layers) for this model.
  static size_t bytes_per_slot(const CausalLM& model);

  const CausalLM& model() const { return model_; }
  int64_t num_slots() const { return kv_.num_slots(); }

 private:
  const CausalLM& model_;
  KvCache kv_;
  bool bf16_;
};

// Memory of `device` for sizing the pool from --mem-fraction-static.
MemoryInfo device_memory_info(Device device);

}  // namespace ms
