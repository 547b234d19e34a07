// DeepSeek's MTP (NextN) layer as the draft model. Its position p combines the token at p + 1
// with the target's final hidden state at p, so after the target computed positions [a, b) the
// MTP layer can compute the same positions (observe), and its logits at b - 1 guess the token
// after the request's last one. Further guesses chain (EAGLE): the MTP layer's own output
// hidden state stands in for the target's, which is not known yet.
//
// Its one-layer KV cache is indexed by the target's slots: slot s holds the MTP layer's keys
// for the position whose target keys are in s, so the scheduler's allocations, rollbacks and
// the radix cache cover both, and the pool budget pays for both (kv_bytes_per_slot). A slot
// reused from the radix cache carries MTP keys computed with the inserting request's next
// token; where a later request branches off right after it, that token differs, which only
// perturbs the draft, never the output.
//
// On the GPU its chain steps (one token per request) replay CUDA graphs captured at attach();
// the cache then has one slot beyond the pool's for the padding sequences.
//
// On a shard of the model (--tp/--dp/--ep) the layer's attention and MoE join the rank's
// collectives: its forwards run with the rank's groups, and in lockstep the ranks agree on the
// number of chain forwards of each propose (the most any rank needs; one world all-gather).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "layers/forward.h"
#include "models/causal_lm.h"
#include "runtime/cuda_graph_runner.h"
#include "runtime/spec_draft.h"

namespace ms {

class MtpDraft : public DraftModel {
 public:
  MtpDraft(const CausalLM& model, bool bf16_activations, CudaGraphSettings graphs = {});

  size_t kv_bytes_per_slot() const override;
  void attach(int64_t num_slots, int rows) override;
  void observe(std::span<const DraftSeq> seqs, const Tensor& hidden, const ReqToTokenTable& table) override;
  std::vector<std::vector<int32_t>> propose(std::span<const DraftSeq> seqs, const ReqToTokenTable& table) override;
  void enter_lockstep() override { lockstep_ = true; }
  int64_t forward_passes() const override { return forwards_; }
  int64_t graph_replays() const override { return graphs_ ? graphs_->replays() : 0; }

 private:
  ForwardContext context(const ForwardBatch& b);
  // The chain of propose(): fills `out`, returns the chain forwards it ran.
  int chain(std::span<const DraftSeq> seqs, const ReqToTokenTable& table, std::vector<std::vector<int32_t>>& out);
  // A forward of no tokens, so that this rank joins its peers' collectives.
  void idle_forward();
  // One chain step: each sequence's token `tokens[i]` at `positions[i]`, with `hidden` [B, H]
  // standing in for the target's; returns the MTP output hidden [B, H] and writes the guesses.
  Tensor chain_step(std::span<const DraftSeq> seqs, const std::vector<int32_t>& tokens,
                    const std::vector<int32_t>& positions, const Tensor& hidden, const ReqToTokenTable& table,
                    std::vector<int32_t>& guesses);

  const CausalLM& model_;
  bool bf16_;
  CudaGraphSettings graph_settings_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<CudaGraphRunner> graphs_;  // chain steps; null: op by op
  // Per req_to_token row: the MTP output hidden state at the request's last observed position
  // and the MTP's guess of the token after the request's last token.
  Tensor last_hidden_;
  std::vector<int32_t> next_guess_;
  int64_t forwards_ = 0;
  bool lockstep_ = false;  // enter_lockstep(): pad to the peers' forwards
};

}  // namespace ms
