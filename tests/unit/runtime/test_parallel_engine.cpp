// ParallelEngine: the batching engine over the ranks of a parallel configuration (CPU ranks as
// threads). The same requests give the same tokens as one Engine on one rank — greedy ones equal
// the Hugging Face reference under the margin rule, sampled ones equal the one-rank engine's —
// for TP, DP attention, EP with both dispatches, dense layers replicated, and under chunked
// prefill with a pool too small for a group's requests at once (they queue); aborts reach the right group; the engine sleeps when idle and serves again.
// Speculative decoding with the MTP draft across ranks is lossless, also while the DP groups
// are in different phases (one extends or idles while another verifies).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <thread>

#include "io/safetensors.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/parallel_engine.h"
#include "runtime/spec_mtp_draft.h"
#include "test_support.h"

namespace ms {
namespace {

struct Case {
  std::string fixture;
  ParallelConfig config;
  int64_t pool = 512;
  int chunk = 0;  // chunked prefill size (0: default)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.fixture << " tp " << c.config.tp_size; }

std::string name_of(const ::testing::TestParamInfo<Case>& info) {
  const ParallelConfig& c = info.param.config;
  std::string n = test::FixtureName()(::testing::TestParamInfo<std::string>(info.param.fixture, 0));
  n += "_tp" + std::to_string(c.tp_size);
  if (c.enable_dp_attention) n += "_dp" + std::to_string(c.dp_size);
  if (c.ep_size > 1) n += "_ep" + std::to_string(c.ep_size);
  if (c.moe_a2a_backend == "all2all") n += "_a2a";
  if (c.moe_dense_tp_size == 1) n += "_dense1";
  if (info.param.chunk) n += "_chunk" + std::to_string(info.param.chunk) + "_pool" + std::to_string(info.param.pool);
  return n;
}

ParallelConfig config(int tp, int dp, int ep, const std::string& a2a = "none", int dense = 0) {
  return test::config_of({"", tp, dp, ep, dense == 1, a2a == "all2all"});
}

class ParallelEngineTest : public ::testing::TestWithParam<Case> {
 protected:
  // The fixture's reference prompts (greedy, with margins) and two sampled requests.
  void SetUp() override {
    dir_ = test::fixture_dir(GetParam().fixture);
    auto ref = WeightStore::open_file(dir_ + "/reference.safetensors");
    for (int i = 0; i < 4; ++i) {
      const std::string p = "prompt." + std::to_string(i);
      GenerateRequest g;
      g.input_ids = test::to_ids(ref.get(p + ".input_ids"));
      g.sampling.max_new_tokens = 12;
      g.sampling.temperature = 0;
      g.sampling.ignore_eos = true;
      requests_.push_back(g);
      greedy_.push_back(test::to_ids(ref.get(p + ".greedy_ids")));
      margins_.push_back(ref.get(p + ".greedy_margins").to_vector());
    }
    for (int i = 0; i < 2; ++i) {
      GenerateRequest g = requests_[size_t(i)];
      g.sampling.temperature = 0.9f;
      g.sampling.top_p = 0.9f;
      g.sampling.seed = 7 + i;
      g.sampling.max_new_tokens = 9 + i;
      requests_.push_back(g);
    }
  }
  EngineOptions options() const {
    EngineOptions o;
    o.max_total_tokens = GetParam().pool;
    if (GetParam().chunk) o.scheduler.chunked_prefill_size = GetParam().chunk;
    return o;
  }

  std::string dir_;
  std::vector<GenerateRequest> requests_;
  std::vector<std::vector<int32_t>> greedy_;
  std::vector<std::vector<float>> margins_;
};

TEST_P(ParallelEngineTest, SameTokensAsOneRank) {
  auto model = load_model(dir_);
  Engine one(*model, options());
  const std::vector<GenerateResult> expected = one.generate(requests_);

  LoadOptions lo;
  ParallelRunner ranks(dir_, GetParam().config, lo);
  ParallelEngine engine(ranks, options());
  engine.start();
  const std::vector<GenerateResult> got = engine.generate(requests_);
  ASSERT_EQ(got.size(), requests_.size());
  for (size_t i = 0; i < greedy_.size(); ++i) {
    ASSERT_EQ(got[i].output_ids.size(), 12u) << "request " << i;
    for (size_t s = 0; s < 12 && margins_[i][s] >= 1e-3f; ++s)
      ASSERT_EQ(got[i].output_ids[s], greedy_[i][s]) << "request " << i << " step " << s;
  }
  for (size_t i = greedy_.size(); i < requests_.size(); ++i)
    EXPECT_EQ(got[i].output_ids, expected[i].output_ids) << "sampled request " << i;

  // Idle now: the rank threads sleep; a later request is served the same.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const std::vector<GenerateResult> again = engine.generate({requests_[0]});
  EXPECT_EQ(again[0].output_ids, got[0].output_ids);
  const EngineStats s = engine.stats();
  EXPECT_EQ(s.running + s.waiting, 0);
  EXPECT_EQ(s.generated_tokens, 12 * 4 + 9 + 10 + 12);
  EXPECT_GT(s.overlapped_steps, 0) << "greedy steps overlap on every rank in lockstep";
  if (GetParam().chunk) EXPECT_GT(s.scheduler.extend_batches, 300 / GetParam().chunk);  // 300-token prompt in chunks
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ParallelEngineTest,
    ::testing::Values(Case{"qwen3-moe-tiny", config(2, 1, 1)}, Case{"qwen3-moe-tiny", config(4, 2, 4)},
                      Case{"qwen3-moe-tiny", config(2, 2, 1), 320, 4},  // chunked prefill, requests queue for slots
                      Case{"deepseek-v3-tiny", config(2, 2, 2)},
                      Case{"deepseek-v3-tiny", config(4, 4, 4, "none", 1)},
                      Case{"deepseek-v2-lite-tiny", config(2, 1, 2, "all2all")},
                      Case{"deepseek-v3-tiny", config(4, 2, 4, "all2all"), 320, 3}),
    name_of);

TEST(ParallelEngine, AbortEndsTheRequestAndTheOthersGoOn) {
  const std::string dir = test::fixture_dir("qwen3-moe-tiny");
  ParallelRunner ranks(dir, config(2, 2, 2), {});
  EngineOptions o;
  o.max_total_tokens = 1024;
  ParallelEngine engine(ranks, o);
  engine.start();
  std::atomic<int> done{0};
  std::atomic<int> reason{-1}, other_tokens{0};
  GenerateRequest g;
  g.input_ids = {5, 17, 3};
  g.sampling.max_new_tokens = 400;
  g.sampling.ignore_eos = true;
  std::atomic<int> first_tokens{0};
  const RequestId id = engine.submit(g, [&](const StreamOutput& out) {
    first_tokens += int(out.new_ids.size());
    if (out.finished) reason = int(out.finish_reason), ++done;
  });
  g.sampling.max_new_tokens = 20;
  engine.submit(g, [&](const StreamOutput& out) {
    other_tokens += int(out.new_ids.size());
    if (out.finished) ++done;
  });
  while (first_tokens < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.abort(id);
  for (int i = 0; i < 5000 && done < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(done, 2);
  EXPECT_EQ(reason, int(FinishReason::Abort));
  EXPECT_LT(first_tokens, 400);
  EXPECT_EQ(other_tokens, 20);
}

// Speculative decoding over the ranks: deepseek-v3-tiny's four reference prompts (1, 7, 33 and
// 300 tokens), greedy, 16 new tokens each, drafted by each rank's shard of the MTP layer. The
// tokens equal the reference under the margin rule and the same engine's without speculation.
// Under DP attention the prompts go 0, 2 | 1, 3 to the two groups; with chunked prefill the
// 300-token prompt keeps group 1 extending while group 0 verifies, and group 0, done first,
// idles while group 1 verifies: every rank must still run the same forwards in every step.
struct SpecCase {
  ParallelConfig config;
  int steps;
  int chunk = 0;
  int64_t pool = 1024;  // smaller: drafts shrink and requests are retracted (recomputed later)
};

void PrintTo(const SpecCase& c, std::ostream* os) { *os << "tp " << c.config.tp_size << " steps " << c.steps; }

std::string spec_name(const ::testing::TestParamInfo<SpecCase>& info) {
  Case c{"deepseek-v3-tiny", info.param.config, info.param.pool, info.param.chunk};
  return name_of(::testing::TestParamInfo<Case>(c, info.index)) + "_steps" + std::to_string(info.param.steps);
}

class ParallelSpeculativeTest : public ::testing::TestWithParam<SpecCase> {
 protected:
  static constexpr int kNewTokens = 16;
  void SetUp() override {
    dir_ = test::fixture_dir("deepseek-v3-tiny");
    auto ref = WeightStore::open_file(dir_ + "/reference.safetensors");
    for (int i = 0; i < 4; ++i) {
      const std::string p = "prompt." + std::to_string(i);
      GenerateRequest g;
      g.input_ids = test::to_ids(ref.get(p + ".input_ids"));
      g.sampling.max_new_tokens = kNewTokens;
      g.sampling.temperature = 0;
      g.sampling.ignore_eos = true;
      requests_.push_back(g);
      greedy_.push_back(test::to_ids(ref.get(p + ".greedy_ids")));
      margins_.push_back(ref.get(p + ".greedy_margins").to_vector());
    }
  }
  EngineOptions options(bool speculative) const {
    EngineOptions o;
    o.max_total_tokens = GetParam().pool;
    o.scheduler.conservativeness = 0.0;  // admit as soon as the prompt fits: decoding retracts
    if (GetParam().chunk) o.scheduler.chunked_prefill_size = GetParam().chunk;
    if (speculative) o.speculative.algorithm = "NEXTN", o.speculative.num_steps = GetParam().steps;
    return o;
  }

  std::string dir_;
  std::vector<GenerateRequest> requests_;
  std::vector<std::vector<int32_t>> greedy_;
  std::vector<std::vector<float>> margins_;
};

TEST_P(ParallelSpeculativeTest, LosslessAcrossRanks) {
  const int steps = GetParam().steps;
  ParallelRunner ranks(dir_, GetParam().config, {});
  std::vector<GenerateResult> plain;
  {
    ParallelEngine engine(ranks, options(false));
    engine.start();
    plain = engine.generate(requests_);
  }
  ParallelEngine engine(ranks, options(true));
  engine.start();
  const std::vector<GenerateResult> got = engine.generate(requests_);
  ASSERT_EQ(got.size(), requests_.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].output_ids.size(), size_t(kNewTokens)) << "request " << i;
    EXPECT_EQ(got[i].output_ids, plain[i].output_ids) << "request " << i;
    for (size_t s = 0; s < size_t(kNewTokens) && margins_[i][s] >= 1e-3f; ++s)
      ASSERT_EQ(got[i].output_ids[s], greedy_[i][s]) << "request " << i << " step " << s;
  }

  // The counters, summed over the DP groups, add up as on one rank: each request's first token
  // comes from its prefill, every other one from a verify (a retracted request's recompute
  // samples one more from its prefill); each decode batch is one verify.
  const EngineStats s = engine.stats();
  ASSERT_TRUE(s.speculative);
  EXPECT_GT(s.spec.verify_forwards, 0);
  EXPECT_EQ(s.scheduler.decode_batches, s.spec.verify_forwards);
  EXPECT_LE(s.spec.emitted_tokens, 4 * (kNewTokens - 1));
  EXPECT_GE(s.spec.emitted_tokens, 4 * (kNewTokens - 1) - s.scheduler.retractions);
  if (GetParam().pool < 1024) EXPECT_GT(s.scheduler.retractions, 0);
  EXPECT_EQ(s.spec.verified_seqs,
            std::accumulate(s.spec.accept_histogram.begin(), s.spec.accept_histogram.end(), int64_t(0)));
  EXPECT_LE(s.spec.drafted_tokens, s.spec.verified_seqs * steps);
  EXPECT_GT(s.spec.drafted_tokens, s.spec.verified_seqs * (steps - 1));
  // Real draft forwards only (the IDLE padding is not counted): one observe per extend and
  // verify, at most steps - 1 chain forwards per verify.
  EXPECT_GE(s.spec.draft_forwards, s.scheduler.extend_batches + s.spec.verify_forwards);
  EXPECT_LE(s.spec.draft_forwards, s.scheduler.extend_batches + s.spec.verify_forwards * steps);
  EXPECT_EQ(s.pool_used, s.cached_slots) << "slots of rejected drafts go back to the pool";
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ParallelSpeculativeTest,
    ::testing::Values(SpecCase{config(2, 1, 1), 1}, SpecCase{config(2, 1, 1), 3},
                      SpecCase{config(2, 2, 1), 1, 32}, SpecCase{config(2, 2, 1), 3, 32},
                      SpecCase{config(2, 1, 2, "all2all"), 3},
                      SpecCase{config(2, 2, 2, "none", 1), 4, 32},
                      SpecCase{config(2, 2, 1), 3, 32, 330}),
    spec_name);

// The fixture's weights are random, so the MTP layer's guesses are almost never accepted and
// the outputs cannot show whether the draft computes right on a shard. This checks it directly:
// each rank's MtpDraft over its shard of the MTP layer (attention heads or experts split, the
// collectives joined) observes prompt 3 chunk by chunk after the target's sharded forward, and
// each chunk's guess is the argmax of the fixture's MTP logits at the chunk's last position.
class ShardedMtpDraftTest : public ::testing::TestWithParam<ParallelConfig> {};

std::string config_name(const ::testing::TestParamInfo<ParallelConfig>& info) {
  return name_of(::testing::TestParamInfo<Case>(Case{"deepseek-v3-tiny", info.param}, info.index));
}

TEST_P(ShardedMtpDraftTest, GuessesAsTheReference) {
  const std::string dir = test::fixture_dir("deepseek-v3-tiny");
  auto ref = WeightStore::open_file(dir + "/reference.safetensors");
  const std::vector<int32_t> ids = test::to_ids(ref.get("prompt.3.input_ids"));
  const Tensor expected = ref.get("prompt.3.mtp_logits");  // row p: MTP position p (hidden p, token p + 1)
  const int positions = int(expected.size(0)), chunk = 23;
  ParallelRunner ranks(dir, GetParam(), {});
  std::vector<std::vector<int32_t>> guesses(size_t(ranks.num_local_ranks()));
  ranks.on_all_ranks([&](int r) {  // every DP group runs the same prompt
    const CausalLM& model = ranks.model(r);
    ModelRunner target(model, int64_t(ids.size()), false);
    const Tensor hidden = target.forward_hidden(Generator::single_sequence_batch(ids, 0, true));
    ReqToTokenTable table(1, int(ids.size()));
    Request req;
    req.input_ids = ids;
    req.row = table.alloc_row();
    for (int p = 0; p < int(ids.size()); ++p) table.row(req.row)[p] = p;
    MtpDraft draft(model, false);
    draft.attach(int64_t(ids.size()), 1);
    for (int start = 0; start < positions; start += chunk) {
      const int count = std::min(chunk, positions - start);
      const DraftSeq observed{&req, start, count};
      draft.observe({&observed, 1}, hidden.narrow_rows(start, count), table);
      const DraftSeq wanted{&req, start + count, 1};  // the guess after the token at start + count
      guesses[size_t(r)].push_back(draft.propose({&wanted, 1}, table)[0][0]);
    }
  });
  int checked = 0;
  for (int start = 0, i = 0; start < positions; start += chunk, ++i) {
    const int last = std::min(start + chunk, positions) - 1;
    std::vector<float> row = expected.narrow_rows(last, 1).to_vector();
    const int32_t best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    std::vector<float> sorted = row;
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] < 1e-3f) continue;  // too close to call across shardings
    ++checked;
    for (size_t r = 0; r < guesses.size(); ++r)
      EXPECT_EQ(guesses[r][size_t(i)], best) << "rank " << r << ", MTP position " << last;
  }
  EXPECT_GE(checked, 10);
}

INSTANTIATE_TEST_SUITE_P(Configs, ShardedMtpDraftTest,
                         ::testing::Values(config(2, 1, 1), config(2, 2, 2, "all2all"), config(4, 2, 2)),
                         config_name);

// The draft across ranks is the checkpoint's MTP layer; a model without one is refused up front.
TEST(ParallelEngine, SpeculationNeedsAnMtpLayer) {
  ParallelRunner ranks(test::fixture_dir("qwen3-moe-tiny"), config(2, 1, 1), {});
  EngineOptions o;
  o.max_total_tokens = 256;
  o.speculative.algorithm = "NEXTN";
  o.speculative.num_steps = 1;
  EXPECT_THROW(ParallelEngine(ranks, o), Error);
}

// Stopping keeps the requests in flight (as Engine::stop does); a restart finishes them.
TEST(ParallelEngine, StopThenStartFinishesTheRequestsInFlight) {
  ParallelRunner ranks(test::fixture_dir("qwen3-moe-tiny"), config(2, 2, 2), {});
  EngineOptions o;
  o.max_total_tokens = 1024;
  ParallelEngine engine(ranks, o);
  engine.start();
  std::atomic<int> tokens{0}, finished{0};
  GenerateRequest g;
  g.input_ids = {5, 17, 3};
  g.sampling.max_new_tokens = 200;
  g.sampling.ignore_eos = true;
  engine.submit(g, [&](const StreamOutput& out) {
    tokens += int(out.new_ids.size());
    if (out.finished) ++finished;
  });
  while (tokens < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.stop();
  const int at_stop = tokens;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(tokens, at_stop);  // stopped: no step runs
  engine.start();
  for (int i = 0; i < 5000 && finished == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(tokens, 200);
}

}  // namespace
}  // namespace ms
