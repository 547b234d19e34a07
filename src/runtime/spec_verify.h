// Verification of a chain of draft tokens against the target's logits: which drafts a request
// keeps and which token the target adds. Greedy requests keep the drafts equal to the target's
// own choice (so the output is exactly what decoding without speculation gives). Sampling
// requests use speculative sampling (Leviathan et al., Chen et al.): draft d is accepted with
// probability min(1, p(d) / q(d)), and on rejection a token is drawn from norm(max(0, p - q)).
// The drafts here are the draft model's argmax (top-k 1), so q is one-hot on d: acceptance
// with probability p(d), and the residual is p without d. Either way every emitted token is
// distributed as the target's sampling distribution.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/request.h"

namespace ms {

struct VerifyResult {
  std::vector<SampleResult> tokens;  // the accepted drafts, then the target's own token
  int accepted = 0;                  // drafts accepted (tokens.size() - 1)
};

// `logits` [drafts.size() + 1, vocab] (host, F32): row j is the target's prediction after the
// request's tokens and drafts[0, j). Draws are pure functions of (request seed, output index),
// as the sampler's are. The caller appends the tokens in order and stops at the first that
// finishes the request.
VerifyResult verify_drafts(std::span<const float> logits, int64_t vocab, const Request& r,
                           std::span<const int32_t> drafts);

// verify_drafts for a request whose sampling is argmax_only, from the target's argmax of each
// of the drafts.size() + 1 rows (picked on the device): the drafts equal to it, then its token.
VerifyResult verify_argmax(std::span<const int32_t> target_ids, std::span<const int32_t> drafts);

// One step of speculative sampling on a target distribution `p` (sums to 1) for a one-hot
// draft on `draft`: accepts with probability p[draft] (decided by u_accept), else draws from
// the residual with u_resample. Returns the token; `accepted` says which case it was.
int32_t speculative_sample(std::span<const double> p, int32_t draft, double u_accept, double u_resample,
                           bool& accepted);

}  // namespace ms
