// Sampling: seeded draws are reproducible, top_k = 1 is greedy, temperature and top_p give
// the distribution they promise (chi-square against probabilities computed here by hand),
// penalties and logprobs follow their definitions, stop conditions end requests.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <set>

#include "core/check.h"
#include "runtime/sampler.h"

namespace ms {
namespace {

const std::vector<float> kLogits = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};

std::vector<float> random_logits(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

SampleResult draw(const std::vector<float>& logits, const SamplingParams& p, uint64_t seed, uint64_t step,
                  std::span<const int32_t> prompt = {}, std::span<const int32_t> output = {}) {
  return sample_token({logits, &p, prompt, output, seed, step});
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferentTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  auto logits = random_logits(500, 1);
  std::vector<int32_t> a, b, c;
  for (uint64_t step = 0; step < 64; ++step) {
    a.push_back(draw(logits, p, 42, step).token);
    b.push_back(draw(logits, p, 42, step).token);
    c.push_back(draw(logits, p, 43, step).token);
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 8u) << "draws should vary from step to step";
}

TEST(Sampler, TopKOneAndZeroTemperatureAreGreedy) {
  for (uint32_t s = 0; s < 20; ++s) {
    auto logits = random_logits(300, s);
    const int32_t argmax = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    SamplingParams k1;
    k1.temperature = 1.5f;
    k1.top_k = 1;
    SamplingParams t0;
    t0.temperature = 0.0f;
    EXPECT_EQ(draw(logits, k1, s, s).token, argmax);
    EXPECT_EQ(draw(logits, t0, s, s).token, argmax);
  }
}

// Expected probabilities of kLogits at temperature t, then the smallest top set reaching top_p.
std::vector<double> expected(double t, double top_p) {
  std::vector<double> p(kLogits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += (p[i] = std::exp(kLogits[i] / t));
  for (auto& x : p) x /= sum;
  double cum = 0;
  size_t keep = 0;  // kLogits is sorted, so the top set is a prefix
  while (keep < p.size() && cum < top_p) cum += p[keep++];
  for (size_t i = keep; i < p.size(); ++i) p[i] = 0;
  for (auto& x : p) x /= cum;
  return p;
}

TEST(Sampler, TemperatureAndTopPMatchTheirDistribution) {
  struct Case {
    float t, top_p;
  };
  for (Case c : {Case{1.0f, 1.0f}, Case{0.5f, 1.0f}, Case{2.0f, 1.0f}, Case{1.0f, 0.8f}, Case{2.0f, 0.6f}}) {
    SamplingParams p;
    p.temperature = c.t;
    p.top_p = c.top_p;
    const auto want = expected(c.t, c.top_p);
    const auto dist = sampling_distribution(kLogits, p);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(dist[i], want[i], 1e-9) << "t " << c.t << " top_p " << c.top_p;
    const int n = 40000;
    std::vector<int> counts(kLogits.size(), 0);
    for (int i = 0; i < n; ++i) ++counts[size_t(draw(kLogits, p, 7, uint64_t(i)).token)];
    double chi2 = 0;
    int dof = -1;
    for (size_t i = 0; i < want.size(); ++i) {
      if (want[i] == 0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " is outside top_p " << c.top_p;
        continue;
      }
      const double e = want[i] * n;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++dof;
    }
    // 99.99th percentile of chi-square with <= 5 degrees of freedom is about 25.7.
    EXPECT_LT(chi2, 25.7) << "t " << c.t << " top_p " << c.top_p << " dof " << dof;
  }
}

TEST(Sampler, TopKAndMinPCutTheTail) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  auto d = sampling_distribution(kLogits, p);
  EXPECT_NEAR(d[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-9);
  EXPECT_EQ(d[2], 0.0);
  p.top_k = -1;
  p.min_p = 0.2f;  // keeps tokens with p >= 0.2 p(top): logits within ln 5 of the top
  d = sampling_distribution(kLogits, p);
  for (size_t i = 0; i < kLogits.size(); ++i) EXPECT_EQ(d[i] > 0, kLogits[0] - kLogits[i] <= std::log(5.0)) << i;
  EXPECT_NEAR(std::accumulate(d.begin(), d.end(), 0.0), 1.0, 1e-12);
}

// The sampler ranks only as much of the vocabulary as a draw reaches. Against the plain rule —
// sort every token by logit (ties: lower id), keep top_k, then the shortest prefix reaching top_p
// of the mass, then drop the tail under min_p times the best, draw the first token whose
// cumulative probability passes u — on vocabularies with ties, -inf and flat or peaked logits.
TEST(Sampler, DrawsAsTheWholeSortedVocabularyWould) {
  std::mt19937 gen(11);
  int compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int V = trial % 3 == 0 ? 50 : 6000;
    std::normal_distribution<float> n(0.0f, trial % 2 ? 1.0f : 6.0f);
    std::vector<float> logits(static_cast<size_t>(V));
    for (float& x : logits) x = std::round(n(gen) * 8.0f) / 8.0f;  // coarse: many ties
    if (trial % 5 == 0) logits[size_t(trial) % size_t(V)] = -INFINITY;
    SamplingParams p;
    p.temperature = trial % 4 == 0 ? 0.3f : 1.0f + float(trial % 3) * 0.4f;
    p.top_k = trial % 7 == 0 ? 1 + trial % 40 : -1;
    p.top_p = trial % 3 == 1 ? 0.5f + 0.1f * float(trial % 5) : 1.0f;
    p.min_p = trial % 4 == 2 ? 0.02f * float(1 + trial % 3) : 0.0f;
    if (p.greedy()) continue;
    // The plain rule.
    std::vector<int32_t> ids(static_cast<size_t>(V));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    const size_t k = p.top_k > 0 ? size_t(p.top_k) : size_t(V);
    ids.resize(k);
    std::vector<double> w;
    for (int32_t t : ids) w.push_back(std::exp((double(logits[size_t(t)]) - logits[size_t(ids[0])]) / p.temperature));
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    size_t keep = k;  // top_p 1 keeps all (a cumulative sum can reach the total before the tail)
    if (p.top_p < 1.0f)
      for (double cum = keep = 0; keep < k && (keep == 0 || cum < p.top_p * sum);) cum += w[keep++];
    while (keep > 1 && w[keep - 1] < p.min_p) --keep;
    const double kept = std::accumulate(w.begin(), w.begin() + std::ptrdiff_t(keep), 0.0);
    const std::vector<double> dist = sampling_distribution(logits, p);
    for (size_t i = 0; i < keep; ++i) EXPECT_NEAR(dist[size_t(ids[i])], w[i] / kept, 1e-12) << "trial " << trial;
    double rest = 0;
    for (size_t i = keep; i < size_t(V) && i < ids.size(); ++i) rest += dist[size_t(ids[i])];
    EXPECT_EQ(rest, 0.0) << "trial " << trial << ": cut tokens have no probability";
    for (uint64_t step = 0; step < 4; ++step) {
      const double u = uniform_draw(uint64_t(trial), step) * kept;
      size_t pick = keep - 1;
      double cum = 0;
      for (size_t i = 0; i < keep; ++i)
        if ((cum += w[i]) > u) {
          pick = i;
          break;
        }
      EXPECT_EQ(sample_token({logits, &p, {}, {}, uint64_t(trial), step}).token, ids[pick])
          << "trial " << trial << " step " << step;
      ++compared;
    }
  }
  EXPECT_GT(compared, 600);
}

TEST(Sampler, PenaltiesFollowTheirDefinitions) {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  const std::vector<int32_t> out0 = {0};
  EXPECT_EQ(draw(kLogits, greedy, 0, 0).token, 0);
  SamplingParams presence = greedy;
  presence.presence_penalty = 1.5f;  // 2.0 - 1.5 < 1.0
  EXPECT_EQ(draw(kLogits, presence, 0, 0, {}, out0).token, 1);
  SamplingParams frequency = greedy;
  frequency.frequency_penalty = 0.4f;  // seen twice: 2.0 - 0.8 > 1.0, three times: 0.8 < 1.0
  const std::vector<int32_t> twice = {0, 0}, thrice = {0, 0, 0};
  EXPECT_EQ(draw(kLogits, frequency, 0, 0, {}, twice).token, 0);
  EXPECT_EQ(draw(kLogits, frequency, 0, 0, {}, thrice).token, 1);
  SamplingParams repetition = greedy;
  repetition.repetition_penalty = 2.5f;  // prompt tokens count too: 2.0 / 2.5 < 1.0
  const std::vector<int32_t> prompt0 = {0};
  EXPECT_EQ(draw(kLogits, repetition, 0, 0, prompt0).token, 1);
  // A negative logit is multiplied: -1 * 2.5 falls below the unseen -2.
  std::vector<float> neg = {-1.0f, -2.0f};
  const std::vector<int32_t> seen0 = {0};
  EXPECT_EQ(draw(neg, repetition, 0, 0, seen0).token, 1);
}

TEST(Sampler, LogprobsOfChosenAndTopTokens) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.return_logprob = true;
  p.top_logprobs_num = 3;
  SampleResult r = draw(kLogits, p, 0, 0);
  double lse = 0;
  for (float x : kLogits) lse += std::exp(double(x));
  lse = std::log(lse);
  EXPECT_NEAR(r.logprob, kLogits[0] - lse, 1e-5);
  ASSERT_EQ(r.top.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.top[size_t(i)].token, i);
    EXPECT_NEAR(r.top[size_t(i)].logprob, kLogits[size_t(i)] - lse, 1e-5);
  }
}

Request request_with(SamplingParams p) {
  Request r;
  r.input_ids = {5, 6};
  r.sampling = std::move(p);
  return r;
}

TEST(FinishCheck, StopTokensEosStopStringsAndLength) {
  const std::vector<int> eos = {1};
  SamplingParams p;
  p.max_new_tokens = 3;
  Request r = request_with(p);
  r.output_ids = {1};
  check_finish(r, eos, {});
  EXPECT_EQ(r.finish, FinishReason::Stop);

  p.ignore_eos = true;
  r = request_with(p);
  r.output_ids = {1};
  check_finish(r, eos, {});
  EXPECT_EQ(r.finish, FinishReason::None);
  r.output_ids = {1, 2, 3};
  check_finish(r, eos, {});
  EXPECT_EQ(r.finish, FinishReason::Length);

  p.stop_token_ids = {9};
  r = request_with(p);
  r.output_ids = {9};
  check_finish(r, eos, {});
  EXPECT_EQ(r.finish, FinishReason::Stop);

  // Each id decodes to one letter; "cd" spans two tokens.
  Detokenizer letters = [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += char('a' + id % 26);
    return s;
  };
  p = SamplingParams{};
  p.max_new_tokens = 10;
  p.stop = {"cd"};
  r = request_with(p);
  const std::vector<int> no_eos;
  for (int32_t id : {0, 1, 2}) {
    r.output_ids.push_back(id);
    check_finish(r, no_eos, letters);
    EXPECT_EQ(r.finish, FinishReason::None);
  }
  r.output_ids.push_back(3);
  check_finish(r, no_eos, letters);
  EXPECT_EQ(r.finish, FinishReason::Stop);
  EXPECT_EQ(r.matched_stop, "cd");
}

TEST(SamplingParams, RejectsOutOfRangeValues) {
  auto bad = [](auto edit) {
    SamplingParams p;
    edit(p);
    EXPECT_THROW(p.validate(100), Error);
  };
  bad([](SamplingParams& p) { p.temperature = -1; });
  bad([](SamplingParams& p) { p.top_p = 0; });
  bad([](SamplingParams& p) { p.min_p = 2; });
  bad([](SamplingParams& p) { p.max_new_tokens = -1; });
  bad([](SamplingParams& p) { p.stop_token_ids = {100}; });
  bad([](SamplingParams& p) { p.repetition_penalty = 0; });
  SamplingParams ok;
  EXPECT_NO_THROW(ok.validate(100));
}

}  // namespace
}  // namespace ms
