#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "kernels/ops.h"

namespace ms {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Repetition penalty over prompt and output tokens (HF/vLLM: divide positive logits, multiply
// negative ones); frequency and presence penalties over output tokens (OpenAI semantics).
void apply_penalties(std::vector<float>& x, const SampleInput& in) {
  const SamplingParams& p = *in.params;
  const int64_t V = int64_t(x.size());
  if (p.repetition_penalty != 1.0f) {
    std::vector<uint8_t> seen(size_t(V), 0);
    for (auto ids : {in.prompt_ids, in.output_ids})
      for (int32_t t : ids) seen[size_t(t)] = 1;
    for (int64_t t = 0; t < V; ++t)
      if (seen[size_t(t)]) x[size_t(t)] = x[size_t(t)] > 0 ? x[size_t(t)] / p.repetition_penalty
                                                           : x[size_t(t)] * p.repetition_penalty;
  }
  if (p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f) return;
  std::vector<int32_t> ids(in.output_ids.begin(), in.output_ids.end());
  std::sort(ids.begin(), ids.end());
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    x[size_t(ids[i])] -= p.frequency_penalty * float(j - i) + p.presence_penalty;
    i = j;
  }
}

struct Candidates {
  std::vector<int32_t> ids;  // by decreasing probability
  std::vector<double> probs;
};

// The tokens that survive top_k, top_p and min_p, with renormalised probabilities.
Candidates filter(std::span<const float> x, const SamplingParams& p) {
  const int64_t V = int64_t(x.size());
  const int64_t k = p.top_k > 0 ? std::min<int64_t>(p.top_k, V) : V;
  Candidates c;
  c.ids.resize(size_t(V));
  std::iota(c.ids.begin(), c.ids.end(), 0);
  auto higher = [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b); };
  std::partial_sort(c.ids.begin(), c.ids.begin() + k, c.ids.end(), higher);
  c.ids.resize(size_t(k));
  const double inv_t = 1.0 / double(p.temperature), top = x[size_t(c.ids[0])];
  double sum = 0;
  for (int32_t t : c.ids) sum += c.probs.emplace_back(std::exp((double(x[size_t(t)]) - top) * inv_t));
  size_t keep = 0;
  double cum = 0;
  while (keep < c.probs.size() && (keep == 0 || cum < double(p.top_p) * sum)) cum += c.probs[keep++];
  const double floor = double(p.min_p) * c.probs[0];
  while (keep > 1 && c.probs[keep - 1] < floor) --keep;
  c.ids.resize(keep);
  c.probs.resize(keep);
  const double kept = std::accumulate(c.probs.begin(), c.probs.end(), 0.0);
  for (double& q : c.probs) q /= kept;
  return c;
}

void fill_logprobs(const std::vector<float>& x, const SamplingParams& p, SampleResult& out) {
  const float mx = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(double(v - mx));
  const double lse = double(mx) + std::log(sum);
  out.logprob = float(double(x[size_t(out.token)]) - lse);
  if (p.top_logprobs_num <= 0) return;
  std::vector<int32_t> ids(x.size());
  std::iota(ids.begin(), ids.end(), 0);
  const auto n = std::ptrdiff_t(std::min<size_t>(size_t(p.top_logprobs_num), x.size()));
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
    return x[size_t(a)] > x[size_t(b)] || (x[size_t(a)] == x[size_t(b)] && a < b);
  });
  for (std::ptrdiff_t i = 0; i < n; ++i) out.top.push_back({ids[size_t(i)], float(double(x[size_t(ids[size_t(i)])]) - lse)});
}

}  // namespace

double uniform_draw(uint64_t seed, uint64_t step) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ (step * 0xD1B54A32D192ED03ull));
  return double(bits >> 11) * 0x1.0p-53;
}

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  std::vector<double> out(logits.size(), 0.0);
  if (p.greedy()) {
    out[size_t(std::max_element(logits.begin(), logits.end()) - logits.begin())] = 1.0;
    return out;
  }
  Candidates c = filter(logits, p);
  for (size_t i = 0; i < c.ids.size(); ++i) out[size_t(c.ids[i])] = c.probs[i];
  return out;
}

SampleResult sample_token(const SampleInput& in) {
  MS_ASSERT(in.params && !in.logits.empty());
  const SamplingParams& p = *in.params;
  std::vector<float> x(in.logits.begin(), in.logits.end());
  apply_penalties(x, in);
  SampleResult out;
  if (p.greedy()) {
    out.token = int32_t(std::max_element(x.begin(), x.end()) - x.begin());
  } else {
    Candidates c = filter(x, p);
    const double u = uniform_draw(in.seed, in.step);
    double cum = 0;
    out.token = c.ids.back();  // rounding can leave the sum a hair under u
    for (size_t i = 0; i < c.ids.size(); ++i)
      if ((cum += c.probs[i]) > u) {
        out.token = c.ids[i];
        break;
      }
  }
  if (p.return_logprob || p.top_logprobs_num > 0) fill_logprobs(x, p, out);
  return out;
}

std::vector<float> penalized_logits(const SampleInput& in) {
  MS_ASSERT(in.params && !in.logits.empty());
  std::vector<float> x(in.logits.begin(), in.logits.end());
  apply_penalties(x, in);
  return x;
}

SampleResult chosen_token(const std::vector<float>& penalized, const SamplingParams& p, int32_t token) {
  MS_ASSERT(token >= 0 && size_t(token) < penalized.size());
  SampleResult out;
  out.token = token;
  if (p.return_logprob || p.top_logprobs_num > 0) fill_logprobs(penalized, p, out);
  return out;
}

SampleResult sample_next(std::span<const float> logits, const Request& r) {
  return sample_token({logits, &r.sampling, r.input_ids, r.output_ids, r.rng_seed, r.output_ids.size()});
}

Tensor take_rows(const Tensor& logits, std::span<const int32_t> rows) {
  bool all = int64_t(rows.size()) == logits.size(0);
  for (size_t i = 0; all && i < rows.size(); ++i) all = rows[i] == int32_t(i);
  if (all) return logits;
  Tensor out = Tensor::empty(logits.dtype(), {int64_t(rows.size()), logits.size(1)}, logits.device());
  if (!rows.empty()) ops::gather_rows(logits, rows, out);
  return out;
}

std::vector<SampleResult> sample_rows(const Tensor& logits, std::span<const Request* const> reqs) {
  MS_CHECK(logits.dim() == 2 && logits.size(0) == int64_t(reqs.size()), "sample_rows: ", logits.describe(), " for ",
           reqs.size(), " rows");
  std::vector<int32_t> argmax, full;
  for (size_t i = 0; i < reqs.size(); ++i)
    if (reqs[i]) (reqs[i]->sampling.argmax_only() ? argmax : full).push_back(int32_t(i));
  std::vector<SampleResult> out(reqs.size());
  if (!argmax.empty()) {
    const std::vector<int32_t> ids = ops::argmax_rows(take_rows(logits, argmax));
    for (size_t j = 0; j < argmax.size(); ++j) out[size_t(argmax[j])].token = ids[j];
  }
  if (!full.empty()) {
    const Tensor host = take_rows(logits, full).to_f32();
    const int64_t V = host.size(1);
    for (size_t j = 0; j < full.size(); ++j)
      out[size_t(full[j])] = sample_next(std::span<const float>(host.data<float>() + int64_t(j) * V, size_t(V)),
                                         *reqs[size_t(full[j])]);
  }
  return out;
}

}  // namespace ms
