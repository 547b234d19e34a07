#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/ops.h"

namespace ms {
namespace {

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

double uniform_draw(uint64_t seed, uint64_t step) { return ops::uniform_draw(seed, step); }

ops::RowSampling row_sampling(const SamplingParams& p, uint64_t seed, uint64_t step) {
  return {p.temperature, p.top_k, p.top_p, p.min_p, seed, step};
}

ops::RowSampling next_row_sampling(const Request& r) {
  return row_sampling(r.sampling, r.rng_seed, uint64_t(r.produced()));
}

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& p) {
  return ops::sampling_distribution(logits, row_sampling(p, 0, 0));
}

SampleResult sample_token(const SampleInput& in) {
  MS_ASSERT(in.params && !in.logits.empty());
  const SamplingParams& p = *in.params;
  std::vector<float> x(in.logits.begin(), in.logits.end());
  apply_penalties(x, in);
  SampleResult out;
  out.token = ops::sample_row(x, row_sampling(p, in.seed, in.step));
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
  return sample_token({logits, &r.sampling, r.input_ids, r.output_ids, r.rng_seed, uint64_t(r.produced())});
}

Tensor take_rows(const Tensor& logits, std::span<const int32_t> rows) {
  bool all = int64_t(rows.size()) == logits.size(0);
  for (size_t i = 0; all && i < rows.size(); ++i) all = rows[i] == int32_t(i);
  if (all) return logits;
  Tensor out = Tensor::uninit(logits.dtype(), {int64_t(rows.size()), logits.size(1)}, logits.device());
  if (!rows.empty()) ops::gather_rows(logits, rows, out);
  return out;
}

std::vector<SampleResult> sample_rows(const Tensor& logits, std::span<const Request* const> reqs) {
  MS_CHECK(logits.dim() == 2 && logits.size(0) == int64_t(reqs.size()), "sample_rows: ", logits.describe(), " for ",
           reqs.size(), " rows");
  std::vector<int32_t> argmax, device, full;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!reqs[i]) continue;
    const SamplingParams& p = reqs[i]->sampling;
    (p.argmax_only() ? argmax : p.device_sampleable() ? device : full).push_back(int32_t(i));
  }
  std::vector<SampleResult> out(reqs.size());
  if (!argmax.empty()) {
    const std::vector<int32_t> ids = ops::argmax_rows(take_rows(logits, argmax));
    for (size_t j = 0; j < argmax.size(); ++j) out[size_t(argmax[j])].token = ids[j];
  }
  if (!device.empty()) {  // drawn where the logits are: only the ids cross
    std::vector<ops::RowSampling> rows;
    for (int32_t i : device) rows.push_back(next_row_sampling(*reqs[size_t(i)]));
    Tensor ids = Tensor::uninit(DType::I32, {int64_t(device.size())}, logits.device());
    ops::sample_rows_into(take_rows(logits, device), rows, ids);
    const Tensor host = ids.to(Device::CPU);
    for (size_t j = 0; j < device.size(); ++j) out[size_t(device[j])].token = host.data<int32_t>()[j];
  }
  if (!full.empty()) {
    const Tensor host = take_rows(logits, full).to_f32();
    const int64_t V = host.size(1);
    // Rows are independent (each draw is a function of its request's seed and step).
    ThreadPool::global().parallel_for(int64_t(full.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j)
        out[size_t(full[size_t(j)])] = sample_next(std::span<const float>(host.data<float>() + j * V, size_t(V)),
                                                   *reqs[size_t(full[size_t(j)])]);
    });
  }
  return out;
}

}  // namespace ms
