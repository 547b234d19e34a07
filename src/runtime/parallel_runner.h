// Runs a model over the ranks of this process — one thread per rank, each with its own shard of
// the weights and its own KV cache, joined by shared-memory communicators (or, with --nnodes,
// by TCP through node 0, this process holding its node's ranks); on CUDA each rank thread
// drives GPU base_gpu_id + local rank and the ranks are joined by NCCL — for the
// simple one-sequence-per-DP-group jobs of `moeserve logits` / `generate` and the parallelism
// tests. With DP attention each DP group runs its own prompt; a group without one runs IDLE
// batches so that it joins every collective.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "models/causal_lm.h"
#include "parallel/groups.h"

namespace ms {

// Wall time of each step of a static batch, and global rank 0's time inside collectives during
// it (measured on the device where the backend can, else 0), in seconds.
struct StaticBatchTimes {
  double prefill = 0, prefill_comm = 0;
  std::vector<double> decode, decode_comm;
};

class ParallelRunner {
 public:
  ParallelRunner(const std::string& model_dir, const ParallelConfig& config, const LoadOptions& base = {});
  int dp_size() const { return config_.enable_dp_attention ? config_.dp_size : 1; }
  const CausalLM& model(int local_rank) const { return *models_.at(size_t(local_rank)); }
  const ParallelGroups& groups(int local_rank) const { return groups_->rank(local_rank); }
  int num_local_ranks() const { return groups_->size(); }
  const ParallelConfig& config() const { return config_; }

  // One forward per DP group over prompts[g] (empty: IDLE); host logits [n_g, vocab] per group
  // (for the groups whose first attention-TP rank lives in this process; others undefined).
  // `routing`, when given, receives global rank 0's routing trace (the expert ids [rows, k] of
  // each MoE layer; with DP attention and all-gather dispatch the rows are every group's tokens).
  std::vector<Tensor> prompt_logits(const std::vector<std::vector<int32_t>>& prompts,
                                    std::vector<Tensor>* routing = nullptr);
  // Greedy decoding per DP group; groups that finish early (EOS) idle until all are done.
  std::vector<std::vector<int32_t>> generate(const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens,
                                             bool ignore_eos);
  // SGLang's bench_one_batch over the ranks: the prompts (all of one length) dealt round robin
  // to the DP groups, one prefill of all of them, then output_len - 1 greedy decode steps. Every
  // step starts and ends with all ranks together. On CUDA one untimed prefill warms up first.
  StaticBatchTimes static_batch(const std::vector<std::vector<int32_t>>& prompts, int output_len);

  // Runs fn(rank) on every rank's thread (bound to its GPU on CUDA); rethrows the first failure.
  void on_all_ranks(const std::function<void(int)>& fn);

 private:
  void check_prompts(const std::vector<std::vector<int32_t>>& prompts, int max_new_tokens) const;

  ParallelConfig config_;
  Device device_;
  std::unique_ptr<LocalGroups> groups_;
  std::vector<std::unique_ptr<CausalLM>> models_;
};

}  // namespace ms
