// Batch sampling (sample_rows) gives what the per-request sampler gives on every row, whether a
// row is decided by the argmax alone or needs the whole distribution (penalties, temperature,
// logprobs); and argmax verification of drafts equals the greedy verification on the logits.
#include <gtest/gtest.h>

#include <random>

#include "runtime/sampler.h"
#include "runtime/spec_verify.h"

namespace ms {
namespace {

Tensor random_logits(int64_t rows, int64_t vocab, uint32_t seed) {
  Tensor t = Tensor::empty(DType::F32, {rows, vocab});
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 2.f);
  for (float& v : t.span<float>()) v = d(rng);
  return t;
}

Request request(std::vector<int32_t> prompt, std::vector<int32_t> outputs, SamplingParams p, uint64_t seed) {
  Request r;
  r.input_ids = std::move(prompt);
  r.output_ids = std::move(outputs);
  r.sampling = std::move(p);
  r.rng_seed = seed;
  return r;
}

TEST(SampleRows, EveryRowAsTheRequestSamplerGivesIt) {
  const int64_t V = 64;
  Tensor logits = random_logits(6, V, 7);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams penalised = greedy;
  penalised.repetition_penalty = 1.8f;
  penalised.frequency_penalty = 0.5f;
  SamplingParams sampled;
  sampled.temperature = 0.7f, sampled.top_k = 8, sampled.top_p = 0.9f;
  SamplingParams logprobs = greedy;
  logprobs.top_logprobs_num = 3;
  std::vector<Request> reqs;
  reqs.push_back(request({1, 2}, {3}, greedy, 11));
  reqs.push_back(request({4, 5, 6}, {7, 7}, penalised, 12));
  reqs.push_back(request({8}, {}, sampled, 13));
  reqs.push_back(request({9}, {}, greedy, 14));  // row 3 is not sampled
  reqs.push_back(request({10}, {2}, logprobs, 15));
  reqs.push_back(request({11}, {}, greedy, 16));
  EXPECT_TRUE(reqs[0].sampling.argmax_only());
  EXPECT_FALSE(reqs[1].sampling.argmax_only());
  EXPECT_FALSE(reqs[2].sampling.argmax_only());
  EXPECT_FALSE(reqs[4].sampling.argmax_only());
  // Make the penalty matter: token 7 leads row 1 before the penalties only.
  logits.data<float>()[1 * V + 7] = 6.0f;
  std::vector<const Request*> rows;
  for (size_t i = 0; i < reqs.size(); ++i) rows.push_back(i == 3 ? nullptr : &reqs[i]);
  const std::vector<SampleResult> got = sample_rows(logits, rows);
  ASSERT_EQ(got.size(), reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i == 3) continue;
    const SampleResult want = sample_next(std::span<const float>(logits.data<float>() + int64_t(i) * V, size_t(V)), reqs[i]);
    EXPECT_EQ(got[i].token, want.token) << "row " << i;
    EXPECT_FLOAT_EQ(got[i].logprob, want.logprob) << "row " << i;
    ASSERT_EQ(got[i].top.size(), want.top.size()) << "row " << i;
    for (size_t k = 0; k < want.top.size(); ++k) EXPECT_EQ(got[i].top[k].token, want.top[k].token) << "row " << i;
  }
  EXPECT_NE(got[1].token, 7) << "the penalties were not applied";
  EXPECT_EQ(got[4].top.size(), 3u);
}

TEST(SampleRows, SelectingEveryRowInOrderIsTheTensorItself) {
  Tensor logits = random_logits(3, 10, 1);
  const std::vector<int32_t> all = {0, 1, 2}, some = {2, 0};
  EXPECT_EQ(take_rows(logits, all).raw(), logits.raw());
  Tensor picked = take_rows(logits, some);
  ASSERT_EQ(picked.size(0), 2);
  EXPECT_EQ(picked.data<float>()[0], logits.data<float>()[20]);
  EXPECT_EQ(picked.data<float>()[10], logits.data<float>()[0]);
}

TEST(VerifyArgmax, EqualsGreedyVerificationOfTheLogits) {
  const int64_t V = 32;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const Request r = request({1, 2, 3}, {4}, greedy, 5);
  for (uint32_t seed = 0; seed < 20; ++seed) {
    Tensor logits = random_logits(4, V, seed);
    std::vector<int32_t> target(4);
    for (int j = 0; j < 4; ++j) {
      const float* row = logits.data<float>() + j * V;
      target[size_t(j)] = int32_t(std::max_element(row, row + V) - row);
    }
    // Drafts right up to position seed % 4, then wrong.
    std::vector<int32_t> drafts(target.begin(), target.begin() + 3);
    if (seed % 4 < 3) drafts[seed % 4] = (drafts[seed % 4] + 1) % int32_t(V);
    const VerifyResult a = verify_argmax(target, drafts);
    const VerifyResult b = verify_drafts(logits.span<float>(), V, r, drafts);
    EXPECT_EQ(a.accepted, b.accepted) << "seed " << seed;
    EXPECT_EQ(a.accepted, int(std::min<uint32_t>(seed % 4, 3)));
    ASSERT_EQ(a.tokens.size(), b.tokens.size()) << "seed " << seed;
    for (size_t j = 0; j < a.tokens.size(); ++j) EXPECT_EQ(a.tokens[j].token, b.tokens[j].token) << "seed " << seed;
  }
}

}  // namespace
}  // namespace ms
