#include "runtime/spec_verify.h"

#include "core/check.h"
#include "runtime/sampler.h"

namespace ms {
namespace {

// The acceptance draws use their own stream, so that the draw that picks a resampled or a
// bonus token is the one the sampler would use at that output index.
constexpr uint64_t kAcceptStream = 0xA5C3D1E7F0B29468ull;

}  // namespace

int32_t speculative_sample(std::span<const double> p, int32_t draft, double u_accept, double u_resample,
                           bool& accepted) {
  MS_ASSERT(draft >= 0 && size_t(draft) < p.size());
  accepted = u_accept < p[size_t(draft)];
  if (accepted) return draft;
  // Residual norm(max(0, p - onehot(draft))): p with the draft removed, renormalised.
  const double rest = 1.0 - p[size_t(draft)];
  double cum = 0;
  int32_t last = -1;
  for (size_t t = 0; t < p.size(); ++t) {
    if (int32_t(t) == draft || p[t] <= 0) continue;
    last = int32_t(t);
    if ((cum += p[t] / rest) > u_resample) return last;
  }
  // Rounding can leave the sum a hair under u; p[draft] == 1 leaves no residual at all (then
  // u_accept < 1 accepted already, so this is unreachable with a proper distribution).
  MS_CHECK(last >= 0, "speculative sampling: empty residual distribution");
  return last;
}

VerifyResult verify_drafts(std::span<const float> logits, int64_t vocab, const Request& r,
                           std::span<const int32_t> drafts) {
  const size_t n = drafts.size();
  MS_CHECK(int64_t(logits.size()) == int64_t(n + 1) * vocab, "verify: ", logits.size(), " logits for ", n,
           " drafts of vocabulary ", vocab);
  const SamplingParams& p = r.sampling;
  std::vector<int32_t> outputs = r.output_ids;  // grows by each accepted draft (penalties see it)
  VerifyResult v;
  for (size_t j = 0; j <= n; ++j) {
    const uint64_t step = outputs.size();
    SampleInput in{logits.subspan(j * size_t(vocab), size_t(vocab)), &p, r.input_ids, outputs, r.rng_seed, step};
    if (j == n || p.greedy()) {
      // Greedy: the target's choice, compared with the draft. The last row: the target's own token.
      v.tokens.push_back(sample_token(in));
      if (j == n || v.tokens.back().token != drafts[j]) break;
    } else {
      const std::vector<float> x = penalized_logits(in);
      const std::vector<double> dist = sampling_distribution(x, p);
      bool accepted = false;
      const int32_t t = speculative_sample(dist, drafts[j], uniform_draw(r.rng_seed ^ kAcceptStream, step),
                                           uniform_draw(r.rng_seed, step), accepted);
      v.tokens.push_back(chosen_token(x, p, t));
      if (!accepted) break;
    }
    ++v.accepted;
    outputs.push_back(drafts[j]);
  }
  return v;
}

VerifyResult verify_argmax(std::span<const int32_t> target_ids, std::span<const int32_t> drafts) {
  MS_CHECK(target_ids.size() == drafts.size() + 1, "verify: ", target_ids.size(), " target tokens for ", drafts.size(),
           " drafts");
  VerifyResult v;
  for (size_t j = 0; j < target_ids.size(); ++j) {
    v.tokens.push_back(SampleResult{target_ids[j]});
    if (j == drafts.size() || target_ids[j] != drafts[j]) break;
    ++v.accepted;
  }
  return v;
}

}  // namespace ms
