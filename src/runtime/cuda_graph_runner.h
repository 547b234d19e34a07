// Decode steps replayed from CUDA graphs, one per padded batch size (1, 2, 4, 8, then multiples
// of 8 up to --cuda-graph-max-bs), captured on first use: a warm-up step at that size, then the
// capture. A batch is padded to the next captured size with dummy sequences that read and write
// one reserved KV slot; its logits are the first rows of the graph's output.
#pragma once
#include <map>
#include <memory>
#include <optional>

#include "kernels/step_graph.h"
#include "layers/forward.h"
#include "models/causal_lm.h"

namespace ms {

struct CudaGraphOptions {
  int max_bs = 160;          // --cuda-graph-max-bs
  int32_t pad_slot = -1;     // a KV slot no sequence uses (padding writes there)
  int max_context = 4096;    // sizes split-KV attention and the kv-slot arena per sequence
  bool bf16_activations = false;
};

class CudaGraphRunner {
 public:
  CudaGraphRunner(const CausalLM& model, KvCache& kv, CudaGraphOptions options);

  // Device logits [sequences, vocab] of a decode batch (one new token per sequence, last-token
  // logits), or nullopt when no graph serves it (not a decode batch, too many sequences, or
  // contexts beyond max_context).
  std::optional<Tensor> decode(const ForwardBatch& batch);

  static std::vector<int> capture_sizes(int max_bs);

 private:
  struct Captured {
    ForwardBatch batch;  // the dummy step captured (its arrays were the staged ones)
    std::unique_ptr<ops::StepGraph> graph;
    Tensor logits;
  };
  Captured& captured(int bs);
  ForwardBatch padded(const ForwardBatch& b, int bs) const;
  void check_ranges(const ForwardBatch& b) const;
  Tensor run_eager(const ForwardBatch& b) const;

  const CausalLM& model_;
  KvCache& kv_;
  CudaGraphOptions options_;
  std::vector<int> sizes_;
  std::map<int, Captured> graphs_;
};

}  // namespace ms
