// Per-request sampling on one row of logits (host, F32): penalties, then the logprobs of the
// penalised distribution, then temperature, top_k, top_p and min_p, then a draw. The draw is a
// pure function of (seed, step), so a request gives the same tokens whatever batch it runs in,
// and after a retraction and recompute.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "kernels/ops.h"
#include "runtime/request.h"

namespace ms {

struct SampleInput {
  std::span<const float> logits;           // [vocab]
  const SamplingParams* params;
  std::span<const int32_t> prompt_ids;     // for the repetition penalty
  std::span<const int32_t> output_ids;     // for all three penalties
  uint64_t seed = 0;
  uint64_t step = 0;  // index of the token being chosen
};

SampleResult sample_token(const SampleInput& in);

// Shorthand for a request's next token.
SampleResult sample_next(std::span<const float> logits, const Request& r);

// The next tokens of a batch: row i of `logits` [rows, vocab] (on any device) for reqs[i] (null:
// row i is not sampled; its result stays empty). Rows whose request is device_sampleable are
// picked on the logits' device (argmax_rows, or sample_rows_into for the token of index
// output_ids + pending_ids) and only their ids cross to the host; the other rows (which never
// have tokens in flight) are copied to the host and go through sample_next. The result is what
// sample_next on every row would give once the tokens in flight are output_ids.
std::vector<SampleResult> sample_rows(const Tensor& logits, std::span<const Request* const> reqs);

// Rows `rows` of a 2-D tensor on its device (the tensor itself when that is every row in order).
Tensor take_rows(const Tensor& t, std::span<const int32_t> rows);

// The logits after the penalties of `in` (what the distribution and the logprobs come from).
std::vector<float> penalized_logits(const SampleInput& in);
// The result sample_token would report had it chosen `token` from these penalised logits
// (speculative verification chooses tokens itself): the token and, when asked, its logprobs.
SampleResult chosen_token(const std::vector<float>& penalized, const SamplingParams& p, int32_t token);

// Uniform in [0, 1) from (seed, step): splitmix64 of the pair (ops::uniform_draw).
double uniform_draw(uint64_t seed, uint64_t step);

// The part of a request's sampling that ops::sample_rows_into applies (all of it when
// p.device_sampleable()), for the token of index `step`.
ops::RowSampling row_sampling(const SamplingParams& p, uint64_t seed, uint64_t step);
// The same for a request's next token (index r.produced(): tokens still in flight count).
ops::RowSampling next_row_sampling(const Request& r);

// Probabilities after temperature, top_k, top_p and min_p (zeros for excluded tokens), from
// already penalised logits; exposed for tests of the distribution.
std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& p);

}  // namespace ms
