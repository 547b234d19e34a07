#include "runtime/spec_replay_draft.h"

#include "core/check.h"

namespace ms {

ReplayDraft::ReplayDraft(std::map<std::vector<int32_t>, std::vector<int32_t>> continuations, double error_rate,
                         uint64_t seed, int vocab_size)
    : continuations_(std::move(continuations)), error_rate_(error_rate), vocab_size_(vocab_size), rng_(seed) {
  MS_CHECK(error_rate >= 0 && error_rate <= 1, "replay draft: error rate ", error_rate, " is not in [0, 1]");
  MS_CHECK(vocab_size >= 2, "replay draft: a wrong token needs a vocabulary of at least 2");
}

std::vector<std::vector<int32_t>> ReplayDraft::propose(std::span<const DraftSeq> seqs, const ReqToTokenTable&) {
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::vector<int32_t>> out(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Request& r = *seqs[i].req;
    auto it = continuations_.find(r.input_ids);
    MS_CHECK(it != continuations_.end(), "replay draft: request ", r.id, " has a prompt with no known continuation");
    const std::vector<int32_t>& truth = it->second;
    Proposal p{seqs[i].count, -1};
    for (int j = 0; j < seqs[i].count; ++j) {
      // The draft after the request's last token is output index output_ids.size() + j.
      const size_t at = r.output_ids.size() + size_t(j);
      MS_CHECK(at < truth.size(), "replay draft: request ", r.id, " asks for token ", at, " of a continuation of ",
               truth.size());
      int32_t t = truth[at];
      if (uniform(rng_) < error_rate_) {
        t = (t + 1) % vocab_size_;  // wrong by construction
        if (p.expected_accept < 0) p.expected_accept = j;
      }
      out[i].push_back(t);
    }
    if (p.expected_accept < 0) p.expected_accept = seqs[i].count;
    proposals_.push_back(p);
  }
  return out;
}

}  // namespace ms
