// The verify loop against a draft whose guesses are known: ReplayDraft proposes the target's
// own greedy continuation with each token made wrong with probability e. Whatever e, the output
// is the continuation; each verify accepts exactly the drafts before the first wrong one; with
// e = 0 every verify accepts all N drafts (N + 1 tokens per target forward), with e = 1 none;
// in between the mean accept length is sum_{i=0..N} (1 - e)^i within a statistical tolerance,
// and so is the number of target forwards.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "io/safetensors.h"
#include "runtime/engine.h"
#include "runtime/spec_replay_draft.h"
#include "test_support.h"

namespace ms {
namespace {

constexpr int kPrompts = 4;
constexpr int kNewTokens = 121;  // 120 after the prefill's token: divisible by N + 1 for N = 1..4

using Continuations = std::map<std::vector<int32_t>, std::vector<int32_t>>;

class ReplayDraftTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A model without an MTP layer: the draft is pluggable, any target can verify.
    const std::string dir = test::fixture_dir("qwen3-moe-tiny");
    model_ = load_model(dir).release();
    auto ref = WeightStore::open_file(dir + "/reference.safetensors");
    for (int i = 0; i < kPrompts; ++i)
      prompts_.push_back(test::to_ids(ref.get("prompt." + std::to_string(i) + ".input_ids")));
    EngineOptions o;
    o.max_total_tokens = 4096;
    Engine plain(*model_, o);
    std::vector<GenerateResult> results = plain.generate(requests());
    for (int i = 0; i < kPrompts; ++i) continuations_[prompts_[size_t(i)]] = results[size_t(i)].output_ids;
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }

  static std::vector<GenerateRequest> requests() { return test::greedy_requests(prompts_, kNewTokens); }

  struct Run {
    EngineStats stats;
    std::vector<ReplayDraft::Proposal> proposals;
  };
  // Decodes all prompts with the replay draft; checks the output is the continuation and that
  // the engine accepted exactly what the draft's errors allow.
  static Run run(int steps, double error_rate, uint64_t seed) {
    EngineOptions o;
    o.max_total_tokens = 4096;
    o.speculative.algorithm = "EAGLE";
    o.speculative.num_steps = steps;
    auto draft = std::make_unique<ReplayDraft>(continuations_, error_rate, seed, model_->config.vocab_size);
    ReplayDraft* replay = draft.get();
    Engine engine(*model_, o, {}, std::move(draft));
    std::vector<GenerateResult> results = engine.generate(requests());
    for (int i = 0; i < kPrompts; ++i)
      EXPECT_EQ(results[size_t(i)].output_ids, continuations_.at(prompts_[size_t(i)])) << "prompt " << i;
    Run r{engine.stats(), replay->proposals()};
    std::vector<int64_t> expected(size_t(steps) + 1, 0);
    for (const auto& p : r.proposals) ++expected[size_t(p.expected_accept)];
    std::vector<int64_t> got = r.stats.spec.accept_histogram;
    got.resize(expected.size(), 0);
    EXPECT_EQ(got, expected) << "accepted drafts per verify differ from the draft's first errors";
    EXPECT_EQ(r.stats.spec.verified_seqs, int64_t(r.proposals.size()));
    EXPECT_EQ(r.stats.spec.emitted_tokens, int64_t(kPrompts) * (kNewTokens - 1));
    EXPECT_EQ(r.stats.pool_used, r.stats.cached_slots);
    return r;
  }

  static CausalLM* model_;
  static std::vector<std::vector<int32_t>> prompts_;
  static Continuations continuations_;
};

CausalLM* ReplayDraftTest::model_ = nullptr;
std::vector<std::vector<int32_t>> ReplayDraftTest::prompts_;
Continuations ReplayDraftTest::continuations_;

TEST_F(ReplayDraftTest, PerfectDraftAcceptsEverything) {
  for (int steps = 1; steps <= 4; ++steps) {
    const Run r = run(steps, 0.0, 1);
    const SpeculativeStats& s = r.stats.spec;
    const int64_t per_request = (kNewTokens - 1) / (steps + 1);
    EXPECT_EQ(s.verified_seqs, kPrompts * per_request) << steps;
    EXPECT_EQ(s.verify_forwards, per_request) << steps << ": the four requests verify together";
    EXPECT_EQ(r.stats.scheduler.decode_batches, per_request) << steps;
    EXPECT_EQ(s.drafted_tokens, s.verified_seqs * steps) << steps;
    EXPECT_EQ(s.accepted_tokens, s.drafted_tokens) << steps;
    EXPECT_DOUBLE_EQ(s.mean_accept_length(), steps + 1.0) << steps;
    EXPECT_EQ(s.draft_forwards, 0) << "replaying costs no forward";
  }
}

TEST_F(ReplayDraftTest, AlwaysWrongDraftAcceptsNothing) {
  const Run r = run(3, 1.0, 2);
  const SpeculativeStats& s = r.stats.spec;
  EXPECT_EQ(s.accepted_tokens, 0);
  EXPECT_EQ(s.verified_seqs, int64_t(kPrompts) * (kNewTokens - 1));
  EXPECT_DOUBLE_EQ(s.mean_accept_length(), 1.0);
}

// Accept length A + 1 of a verify with N drafts, each wrong with probability e:
// P(A = k) = (1 - e)^k e for k < N, (1 - e)^N for k = N.
struct AcceptModel {
  double mean = 0, variance = 0;
  AcceptModel(int n, double e) {
    double m2 = 0;
    for (int k = 0; k <= n; ++k) {
      const double p = k < n ? std::pow(1 - e, k) * e : std::pow(1 - e, n);
      mean += p * (k + 1);
      m2 += p * (k + 1) * (k + 1);
    }
    variance = m2 - mean * mean;
  }
};

TEST_F(ReplayDraftTest, AcceptLengthFollowsTheErrorRate) {
  const int steps = 3;
  for (double e : {0.1, 0.3, 0.6}) {
    const Run r = run(steps, e, 7);
    const AcceptModel model(steps, e);
    double closed_form = 0;
    for (int i = 0; i <= steps; ++i) closed_form += std::pow(1 - e, i);
    ASSERT_NEAR(model.mean, closed_form, 1e-12);
    // Verifies with all N drafts (the last ones of a request draft fewer, near max_new_tokens).
    double sum = 0;
    int64_t n = 0;
    for (const auto& p : r.proposals)
      if (p.drafted == steps) {
        sum += p.expected_accept + 1;
        ++n;
      }
    ASSERT_GT(n, 100) << e;
    const double tolerance = 4 * std::sqrt(model.variance / double(n));
    EXPECT_NEAR(sum / double(n), model.mean, tolerance) << "error rate " << e;
    // Target forwards: each request needs about (tokens after prefill) / (mean accept length)
    // verifies, give or take the short verifies at its end.
    const double predicted = kPrompts * (kNewTokens - 1) / model.mean;
    const double spread = 4 * std::sqrt(model.variance / double(n)) / model.mean * predicted + kPrompts * steps;
    EXPECT_NEAR(double(r.stats.spec.verified_seqs), predicted, spread) << "error rate " << e;
    EXPECT_NEAR(r.stats.spec.mean_accept_length(), model.mean, tolerance + 0.1) << "error rate " << e;
  }
}

// Speculation in chunks, under the radix cache and under retraction gives the same tokens and
// the same accept bookkeeping.
TEST_F(ReplayDraftTest, WithChunkedPrefillRadixAndRetraction) {
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts_) prompt_tokens += int64_t(p.size());
  for (int mode = 0; mode < 2; ++mode) {
    EngineOptions o;
    o.speculative.algorithm = "NEXTN";
    o.speculative.num_steps = 4;
    o.scheduler.chunked_prefill_size = 16;
    o.max_total_tokens = mode == 0 ? 4096 : prompt_tokens + kNewTokens + 20;  // the longest fits alone
    o.scheduler.conservativeness = mode == 0 ? 1.0 : 0.0;
    auto draft = std::make_unique<ReplayDraft>(continuations_, 0.25, 11, model_->config.vocab_size);
    ReplayDraft* replay = draft.get();
    Engine engine(*model_, o, {}, std::move(draft));
    std::vector<GenerateResult> results = engine.generate(requests());
    for (int i = 0; i < kPrompts; ++i)
      EXPECT_EQ(results[size_t(i)].output_ids, continuations_.at(prompts_[size_t(i)])) << "mode " << mode;
    const EngineStats s = engine.stats();
    int64_t expected_accepted = 0;
    for (const auto& p : replay->proposals()) expected_accepted += p.expected_accept;
    EXPECT_EQ(s.spec.accepted_tokens, expected_accepted) << "mode " << mode;
    EXPECT_EQ(s.pool_used, s.cached_slots) << "mode " << mode;
    if (mode == 1) {
      EXPECT_GT(s.scheduler.retractions, 0);
    }
  }
}

}  // namespace
}  // namespace ms
