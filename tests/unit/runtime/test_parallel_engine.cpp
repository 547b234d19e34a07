// ParallelEngine: the batching engine over the ranks of a parallel configuration (CPU ranks as
// threads). The same requests give the same tokens as one Engine on one rank — greedy ones equal
// the Hugging Face reference under the margin rule, sampled ones equal the one-rank engine's —
// for TP, DP attention, EP with both dispatches, dense layers replicated, and under chunked
// prefill with a pool too small for a group's requests at once (they queue); aborts reach the right group; the engine sleeps when idle and serves again.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "io/safetensors.h"
#include "runtime/engine.h"
#include "runtime/parallel_engine.h"
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
  ParallelConfig c;
  c.tp_size = tp, c.dp_size = dp, c.enable_dp_attention = dp > 1, c.ep_size = ep;
  c.moe_a2a_backend = a2a, c.moe_dense_tp_size = dense;
  return c;
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

TEST(ParallelEngine, RefusesSpeculativeDecoding) {
  ParallelRunner ranks(test::fixture_dir("deepseek-v3-tiny"), config(2, 1, 1), {});
  EngineOptions o;
  o.max_total_tokens = 256;
  o.speculative.algorithm = "NEXTN";
  o.speculative.num_steps = 1;
  o.speculative.num_draft_tokens = 2;
  EXPECT_THROW(ParallelEngine(ranks, o), Error);
}

}  // namespace
}  // namespace ms
