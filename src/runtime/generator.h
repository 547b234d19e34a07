// Single-sequence generation over a contiguous slot range: the simple per-sequence KV cache
// used by `moeserve logits` / `generate` and the fixture tests. The batched, paged runtime
// (scheduler, radix cache) builds the same ForwardBatch for many requests at once.
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "models/causal_lm.h"

namespace ms {

struct GenerateOptions {
  int max_new_tokens = 16;
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool bf16_activations = false;
};

class Generator {
 public:
  explicit Generator(const CausalLM& model, bool bf16_activations = false)
      : model_(model), bf16_(bf16_activations) {}

  // Logits [n, vocab] at every position of one forward over `ids`; `routing_trace` receives
  // each MoE layer's expert ids when given.
  Tensor prompt_logits(const std::vector<int32_t>& ids, std::vector<Tensor>* routing_trace = nullptr);
  // Final-normalised hidden states [n, hidden] of one forward over `ids` (for the MTP layer).
  Tensor prompt_hidden(const std::vector<int32_t>& ids);
  // The MTP layer's logits [n - 1, vocab] for a prompt (position j predicts from token j + 1).
  Tensor mtp_logits(const std::vector<int32_t>& ids);
  // Prefill then decode one token at a time with the KV cache; stops at EOS unless ignored.
  std::vector<int32_t> generate(const std::vector<int32_t>& prompt, const GenerateOptions& options);

  // One forward of `ids` at positions [start, start + ids.size()) of a single sequence whose
  // position p lives in KV slot p; empty `ids` make an IDLE batch (a DP rank with no work).
  static ForwardBatch single_sequence_batch(const std::vector<int32_t>& ids, int start, bool all_logits);
  // One forward of a static batch: sequence b (owning KV slots [b * cap, (b + 1) * cap)) has
  // cached[b] tokens and appends step_ids[b]; logits of each sequence's last token. No
  // sequences make an IDLE batch.
  static ForwardBatch static_batch(const std::vector<std::vector<int32_t>>& step_ids, const std::vector<int>& cached,
                                   int cap);
  // The context for one forward of this generator's model (device, dtype, parallel groups).
  ForwardContext context(const ForwardBatch& b, KvCache& kv, std::vector<Tensor>* trace = nullptr) const;

 private:
  void check_ids(const std::vector<int32_t>& ids) const;

  const CausalLM& model_;
  bool bf16_;
};

}  // namespace ms
