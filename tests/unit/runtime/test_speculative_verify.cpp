// Verification rules on hand-made logits: greedy keeps the drafts equal to the target's argmax
// (penalties included, applied as if the accepted drafts were already output), and speculative
// sampling emits tokens distributed exactly as the target's sampling distribution, whatever the
// draft proposes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/sampler.h"
#include "runtime/spec_verify.h"

namespace ms {
namespace {

constexpr int64_t kVocab = 8;

// Rows of logits with one clear favourite each (logit 3 against 0 for the rest).
std::vector<float> favourites(const std::vector<int32_t>& tokens) {
  std::vector<float> out(tokens.size() * size_t(kVocab), 0.0f);
  for (size_t j = 0; j < tokens.size(); ++j) out[j * size_t(kVocab) + size_t(tokens[j])] = 3.0f;
  return out;
}

Request greedy_request() {
  Request r;
  r.input_ids = {1, 2};
  r.output_ids = {4};
  r.sampling.temperature = 0.0f;
  return r;
}

std::vector<int32_t> ids(const VerifyResult& v) {
  std::vector<int32_t> out;
  for (const SampleResult& s : v.tokens) out.push_back(s.token);
  return out;
}

TEST(VerifyGreedy, KeepsTheLongestAgreeingPrefixPlusTheTargetToken) {
  const Request r = greedy_request();
  const std::vector<float> logits = favourites({5, 6, 2, 7});
  VerifyResult v = verify_drafts(logits, kVocab, r, std::vector<int32_t>{5, 6, 3});
  EXPECT_EQ(ids(v), (std::vector<int32_t>{5, 6, 2}));
  EXPECT_EQ(v.accepted, 2);
  v = verify_drafts(logits, kVocab, r, std::vector<int32_t>{5, 6, 2});
  EXPECT_EQ(ids(v), (std::vector<int32_t>{5, 6, 2, 7})) << "all accepted: the last row adds its token";
  EXPECT_EQ(v.accepted, 3);
  v = verify_drafts(logits, kVocab, r, std::vector<int32_t>{0, 6, 2});
  EXPECT_EQ(ids(v), (std::vector<int32_t>{5}));
  EXPECT_EQ(v.accepted, 0);
  v = verify_drafts(std::span<const float>(logits.data(), size_t(kVocab)), kVocab, r, {});
  EXPECT_EQ(ids(v), (std::vector<int32_t>{5})) << "no drafts: plain decoding";
}

// Row 1 favours 5 only until the accepted draft 5 counts as output and is penalised.
TEST(VerifyGreedy, PenaltiesSeeTheAcceptedDrafts) {
  Request r = greedy_request();
  r.sampling.repetition_penalty = 2.0f;
  std::vector<float> logits(2 * size_t(kVocab), 0.0f);
  logits[5] = 2.0f;
  logits[6] = 1.9f;
  logits[size_t(kVocab) + 5] = 2.0f;
  logits[size_t(kVocab) + 6] = 1.5f;
  std::vector<float> three = logits;  // a third row for a second draft
  three.resize(3 * size_t(kVocab), 0.0f);
  VerifyResult v = verify_drafts(three, kVocab, r, std::vector<int32_t>{5, 5});
  EXPECT_EQ(ids(v), (std::vector<int32_t>{5, 6})) << "the second 5 is rejected once the first is penalised";
  EXPECT_EQ(v.accepted, 1);
  v = verify_drafts(logits, kVocab, r, std::vector<int32_t>{5});
  EXPECT_EQ(ids(v), (std::vector<int32_t>{5, 6})) << "the target's own token is penalised too";
}

TEST(VerifyGreedy, ReportsLogprobsAsTheSamplerWould) {
  Request r = greedy_request();
  r.sampling.return_logprob = true;
  r.sampling.top_logprobs_num = 2;
  const std::vector<float> logits = favourites({5, 6});
  VerifyResult v = verify_drafts(logits, kVocab, r, std::vector<int32_t>{5});
  ASSERT_EQ(v.tokens.size(), 2u);
  for (size_t j = 0; j < 2; ++j) {
    std::vector<int32_t> outputs = r.output_ids;
    if (j == 1) outputs.push_back(5);
    const SampleResult want = sample_token({std::span<const float>(logits.data() + j * size_t(kVocab), size_t(kVocab)),
                                            &r.sampling, r.input_ids, outputs, r.rng_seed, outputs.size()});
    EXPECT_EQ(v.tokens[j].token, want.token);
    EXPECT_FLOAT_EQ(v.tokens[j].logprob, want.logprob);
    ASSERT_EQ(v.tokens[j].top.size(), 2u);
    EXPECT_EQ(v.tokens[j].top[1].token, want.top[1].token);
  }
}

double total_variation(const std::vector<double>& a, const std::vector<double>& b) {
  double tv = 0;
  for (size_t i = 0; i < a.size(); ++i) tv += std::abs(a[i] - b[i]);
  return tv / 2;
}

// One step: token frequencies over many uniform pairs equal p, for a likely, an unlikely and an
// impossible draft; the draft is kept with probability p(draft).
TEST(SpeculativeSampling, EmitsTheTargetDistribution) {
  const std::vector<double> p = {0.05, 0.3, 0.0, 0.15, 0.4, 0.1};
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  constexpr int kDraws = 200000;
  for (int32_t draft : {4, 0, 2}) {
    std::vector<double> freq(p.size(), 0.0);
    int accepted_count = 0;
    for (int i = 0; i < kDraws; ++i) {
      bool accepted = false;
      const int32_t t = speculative_sample(p, draft, u(rng), u(rng), accepted);
      freq[size_t(t)] += 1.0 / kDraws;
      accepted_count += accepted;
      if (accepted) {
        EXPECT_EQ(t, draft);
      }
    }
    EXPECT_LT(total_variation(freq, p), 0.01) << "draft " << draft;
    EXPECT_NEAR(double(accepted_count) / kDraws, p[size_t(draft)], 0.005) << "draft " << draft;
    EXPECT_EQ(freq[2], 0.0) << "a token the target excludes is never emitted";
  }
}

// Through verify_drafts with temperature, top_p and the request's seed: over many seeds the first
// token follows row 0's distribution, and the second (after an accepted first draft) row 1's.
TEST(SpeculativeSampling, VerifyDraftsOverSeeds) {
  Request r;
  r.input_ids = {1};
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.95f;
  std::vector<float> logits = {0.5f, 1.0f, -1.0f, 2.0f, 0.0f, 1.5f, -2.0f, 0.2f,   // row 0
                               1.2f, 0.1f, 0.3f, -0.5f, 2.2f, 0.0f, 0.9f, 1.1f,   // row 1
                               0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};   // row 2 (bonus)
  const std::vector<float> row0(logits.begin(), logits.begin() + kVocab), row1(logits.begin() + kVocab, logits.begin() + 2 * kVocab);
  const std::vector<double> p0 = sampling_distribution(row0, r.sampling), p1 = sampling_distribution(row1, r.sampling);
  const std::vector<int32_t> drafts = {5, 4};  // row 1's favourite is 4
  std::vector<double> first(size_t(kVocab), 0.0), second(size_t(kVocab), 0.0);
  constexpr int kSeeds = 100000;
  int second_count = 0;
  for (int seed = 0; seed < kSeeds; ++seed) {
    r.rng_seed = uint64_t(seed) * 7919 + 1;
    const VerifyResult v = verify_drafts(logits, kVocab, r, drafts);
    first[size_t(v.tokens[0].token)] += 1.0 / kSeeds;
    if (v.accepted >= 1) {
      second[size_t(v.tokens[1].token)] += 1.0;
      ++second_count;
    }
  }
  EXPECT_LT(total_variation(first, p0), 0.01);
  ASSERT_GT(second_count, kSeeds / 10);
  for (double& f : second) f /= second_count;
  EXPECT_LT(total_variation(second, p1), 0.02);
}

}  // namespace
}  // namespace ms
