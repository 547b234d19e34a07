// A draft whose guesses are known: it replays the target's own continuation of each prompt
// (computed beforehand, e.g. by greedy decoding without speculation) and replaces each token
// by a wrong one with probability `error_rate` (seeded). A greedy verify then accepts exactly
// the drafts before the first replaced one, so acceptance is set by the rate: with N drafts per
// verify the mean accept length is sum_{i=0..N} (1 - e)^i. For tests of the verify loop and for
// benchmarks of speculation at a chosen acceptance; it costs no forward.
#pragma once
#include <map>
#include <random>
#include <vector>

#include "runtime/spec_draft.h"

namespace ms {

class ReplayDraft : public DraftModel {
 public:
  // continuations[prompt] = the tokens the target produces after `prompt`.
  ReplayDraft(std::map<std::vector<int32_t>, std::vector<int32_t>> continuations, double error_rate, uint64_t seed,
              int vocab_size);

  void observe(std::span<const DraftSeq>, const Tensor&, const ReqToTokenTable&) override {}
  std::vector<std::vector<int32_t>> propose(std::span<const DraftSeq> seqs, const ReqToTokenTable& table) override;

  struct Proposal {
    int drafted = 0;
    int expected_accept = 0;  // drafts before the first replaced one
  };
  // Every proposal so far, in order.
  const std::vector<Proposal>& proposals() const { return proposals_; }

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> continuations_;
  double error_rate_;
  int vocab_size_;
  std::mt19937_64 rng_;
  std::vector<Proposal> proposals_;
};

}  // namespace ms
