// Decode steps replayed from CUDA graphs, one per padded batch size (1, 2, 4, 8, then multiples
// of 8 up to --cuda-graph-max-bs), each captured once: a warm-up step at that size, then the
// capture. Every sequence of a step brings the same number of new tokens: one in a decode step,
// the verified token and its drafts in a speculative verify. A batch is padded to the next
// captured size with dummy sequences that read and write one reserved KV slot; its outputs are
// the first rows of the graph's outputs (as many per sequence as the body gives).
//
// What a graph computes is its body: by default the model's logits of each sequence's last
// token; a speculative target passes the hidden states and logits of every token, and a draft
// model its own (the MTP layer: its hidden state and logits, from one input row per sequence
// that the runner copies into the graph's input buffer before each replay).
//
// The runner's graphs allocate from a graph pool of their own (kernels/step_graph.h), so nothing
// else the program allocates lies in memory that a replay rewrites. The outputs live in that
// pool and hold until the runner's next replay (one size's outputs may share memory with
// another size's intermediates).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "kernels/step_graph.h"
#include "layers/forward.h"
#include "models/causal_lm.h"

namespace ms {

// The flags, with SGLang's names.
struct CudaGraphSettings {
  int max_bs = 160;      // --cuda-graph-max-bs: the largest decode batch replayed from a graph
  bool disable = false;  // --disable-cuda-graph: every step op by op
  bool enabled_on(Device device) const { return device == Device::CUDA && !disable && max_bs > 0; }
};

struct CudaGraphOptions {
  int max_bs = 160;          // --cuda-graph-max-bs
  int32_t pad_slot = -1;     // a KV slot no sequence uses (padding writes there)
  int max_context = 4096;    // keys one sequence may have; sizes split-KV attention
  bool bf16_activations = false;
  int input_width = 0;       // columns of the body's per-sequence input rows; 0: it takes none
  int tokens_per_seq = 1;    // new tokens of every sequence in a step
  Tensor earlier_ids;        // what token placeholders read (ForwardBatch::earlier_ids), fixed for all replays
};

// The step a graph records: outputs with one row per sequence of ctx.batch, computed from the
// batch and `input` ([sequences, input_width] in the model's activation dtype; undefined when
// the runner takes no input).
using GraphBody = std::function<std::vector<Tensor>(const ForwardContext& ctx, const Tensor& input)>;

class CudaGraphRunner {
 public:
  // The model's decode step: body = its logits.
  CudaGraphRunner(const CausalLM& model, KvCache& kv, CudaGraphOptions options);
  CudaGraphRunner(const CausalLM& model, KvCache& kv, CudaGraphOptions options, GraphBody body);

  // The body's outputs (rows of this batch's sequences, on the device) for a batch of
  // tokens_per_seq new tokens per sequence, or nullopt when no graph serves it (a sequence with
  // another count, too many sequences, or more keys than max_context or the captured capacity).
  std::optional<std::vector<Tensor>> run(const ForwardBatch& batch, const Tensor* input = nullptr);
  // run's first output: device logits [sequences, vocab] with the default body.
  std::optional<Tensor> decode(const ForwardBatch& batch);

  // Captures every size up front (as SGLang does at start-up), so that no step pays for it.
  void capture_all();
  int64_t replays() const { return replays_; }

  static std::vector<int> capture_sizes(int max_bs);

 private:
  struct Captured {
    ForwardBatch batch;  // the dummy step captured (its arrays were the staged ones)
    std::unique_ptr<ops::StepGraph> graph;
    Tensor input;        // [bs, input_width], made before the capture
    std::vector<Tensor> outputs;
    int64_t kv_capacity = 0;
  };
  Captured& captured(int bs);
  ForwardBatch padded(const ForwardBatch& b, int bs) const;
  void check_ranges(const ForwardBatch& b) const;
  std::vector<Tensor> run_eager(const ForwardBatch& b, const Tensor& input) const;

  const CausalLM& model_;
  KvCache& kv_;
  CudaGraphOptions options_;
  GraphBody body_;
  std::vector<int> sizes_;
  std::shared_ptr<ops::GraphPool> pool_;  // declared before the graphs: outlives them
  std::map<int, Captured> graphs_;
  int64_t replays_ = 0;
};

}  // namespace ms
