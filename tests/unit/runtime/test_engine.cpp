// The engine API on a real (tiny) model: streaming, polling, abort, the background thread,
// seeded sampling across batch compositions, stop strings through a detokenizer, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "core/check.h"
#include "io/safetensors.h"
#include "runtime/engine.h"
#include "test_support.h"

namespace ms {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::fixture_dir("qwen3-moe-tiny")).release(); }
  static void TearDownTestSuite() { delete model_; }

  static EngineOptions options(int64_t slots = 2048) {
    EngineOptions o;
    o.max_total_tokens = slots;
    return o;
  }
  static GenerateRequest request(int len, int max_new, float temperature = 0.0f, int first = 3) {
    GenerateRequest g;
    for (int i = 0; i < len; ++i) g.input_ids.push_back(int32_t((first + i * 13) % 1000 + 2));
    g.sampling.max_new_tokens = max_new;
    g.sampling.temperature = temperature;
    g.sampling.ignore_eos = true;
    return g;
  }

  static CausalLM* model_;
};
CausalLM* EngineTest::model_ = nullptr;

TEST_F(EngineTest, StreamsTokensAsTheyAreProduced) {
  Engine engine(*model_, options());
  std::vector<StreamOutput> reports;
  engine.submit(request(9, 6), [&](const StreamOutput& o) { reports.push_back(o); });
  engine.run_until_idle();
  ASSERT_EQ(reports.size(), 6u) << "one report per token";
  std::vector<int32_t> streamed;
  for (size_t i = 0; i < reports.size(); ++i) {
    EXPECT_EQ(reports[i].new_ids.size(), 1u);
    EXPECT_EQ(reports[i].finished, i + 1 == reports.size());
    streamed.insert(streamed.end(), reports[i].new_ids.begin(), reports[i].new_ids.end());
  }
  EXPECT_EQ(reports.back().finish_reason, FinishReason::Length);
  EXPECT_EQ(reports.back().completion_tokens, 6);
  Engine again(*model_, options());
  EXPECT_EQ(again.generate({request(9, 6)})[0].output_ids, streamed);
}

TEST_F(EngineTest, PollCollectsReportsOfCallbacklessRequests) {
  Engine engine(*model_, options());
  RequestId a = engine.submit(request(5, 3)), b = engine.submit(request(7, 0));
  engine.run_until_idle();
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, FinishReason> reason;
  for (const StreamOutput& o : engine.poll()) {
    got[o.id].insert(got[o.id].end(), o.new_ids.begin(), o.new_ids.end());
    if (o.finished) reason[o.id] = o.finish_reason;
  }
  EXPECT_EQ(got[a].size(), 3u);
  EXPECT_TRUE(got[b].empty()) << "max_new_tokens 0 produces nothing";
  EXPECT_EQ(reason[a], FinishReason::Length);
  EXPECT_EQ(reason[b], FinishReason::Length);
  EXPECT_TRUE(engine.poll().empty());
}

// The same seed gives the same tokens whether a request runs alone or in a batch with others
// (and so at other batch positions and after other prefixes were cached).
TEST_F(EngineTest, SeededSamplingIsIndependentOfTheBatch) {
  GenerateRequest seeded = request(11, 12, 0.9f);
  seeded.sampling.seed = 1234;
  Engine alone(*model_, options());
  auto solo = alone.generate({seeded})[0].output_ids;
  Engine crowd(*model_, options());
  std::vector<GenerateRequest> batch = {request(30, 5, 1.0f, 7), seeded, request(4, 20, 0.5f, 9), seeded};
  auto results = crowd.generate(batch);
  EXPECT_EQ(results[1].output_ids, solo);
  EXPECT_EQ(results[3].output_ids, solo);
  GenerateRequest other = seeded;
  other.sampling.seed = 4321;
  EXPECT_NE(alone.generate({other})[0].output_ids, solo);
  // top_k = 1 at any temperature is greedy.
  GenerateRequest k1 = request(11, 12, 1.3f);
  k1.sampling.top_k = 1;
  EXPECT_EQ(alone.generate({k1})[0].output_ids, alone.generate({request(11, 12)})[0].output_ids);
}

TEST_F(EngineTest, AbortFreesRunningAndWaitingRequests) {
  EngineOptions o = options();
  o.scheduler.max_running_requests = 1;
  o.scheduler.enable_radix_cache = false;
  Engine engine(*model_, o);
  std::map<RequestId, StreamOutput> last;
  std::map<RequestId, int> tokens;
  auto track = [&](const StreamOutput& s) {
    last[s.id] = s;
    tokens[s.id] += int(s.new_ids.size());
  };
  RequestId running = engine.submit(request(20, 200), track);
  RequestId waiting = engine.submit(request(20, 5), track);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(engine.step());
  EXPECT_EQ(engine.stats().running, 1);
  EXPECT_EQ(engine.stats().waiting, 1);
  EXPECT_GT(engine.stats().pool_used, 20);
  engine.abort(running);
  engine.abort(waiting);
  engine.abort(999);  // unknown: ignored
  engine.run_until_idle();
  EXPECT_EQ(last[running].finish_reason, FinishReason::Abort);
  EXPECT_EQ(last[waiting].finish_reason, FinishReason::Abort);
  EXPECT_EQ(tokens[running], 4) << "tokens produced before the abort were reported";
  EXPECT_EQ(tokens[waiting], 0);
  EngineStats s = engine.stats();
  EXPECT_EQ(s.pool_used, 0);
  EXPECT_EQ(s.running + s.waiting, 0);
}

TEST_F(EngineTest, BackgroundThreadServesManySubmitters) {
  Engine engine(*model_, options());
  Engine reference(*model_, options());
  engine.start();
  std::vector<std::vector<GenerateResult>> got(3);
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c)
    clients.emplace_back([&, c] { got[size_t(c)] = engine.generate({request(6 + c, 4 + c), request(15, 3 + c)}); });
  for (auto& t : clients) t.join();
  engine.stop();
  for (int c = 0; c < 3; ++c) {
    auto want = reference.generate({request(6 + c, 4 + c), request(15, 3 + c)});
    for (size_t i = 0; i < 2; ++i) EXPECT_EQ(got[size_t(c)][i].output_ids, want[i].output_ids) << c << " " << i;
  }
  EXPECT_EQ(engine.stats().running, 0);
}

TEST_F(EngineTest, StopStringsThroughADetokenizer) {
  Engine plain(*model_, options());
  auto out = plain.generate({request(8, 16)})[0].output_ids;
  // Each id decodes to "<id>"; stop at the text of the fourth token.
  Detokenizer detok = [](std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += "<" + std::to_string(id) + ">";
    return s;
  };
  Engine engine(*model_, options(), detok);
  GenerateRequest g = request(8, 16);
  g.sampling.stop = {"<" + std::to_string(out[3]) + ">"};
  GenerateResult r = engine.generate({g})[0];
  const size_t first = size_t(std::find(out.begin(), out.end(), out[3]) - out.begin());
  EXPECT_EQ(r.output_ids, std::vector<int32_t>(out.begin(), out.begin() + std::ptrdiff_t(first + 1)));
  EXPECT_EQ(r.finish_reason, FinishReason::Stop);
  EXPECT_EQ(r.matched_stop, g.sampling.stop[0]);
}

TEST_F(EngineTest, LogprobsAreReported) {
  Engine engine(*model_, options());
  GenerateRequest g = request(8, 5);
  g.sampling.return_logprob = true;
  g.sampling.top_logprobs_num = 4;
  GenerateResult r = engine.generate({g})[0];
  ASSERT_EQ(r.logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_LE(r.logprobs[i].logprob, 0.0f);
    ASSERT_EQ(r.logprobs[i].top.size(), 4u);
    EXPECT_EQ(r.logprobs[i].top[0].token, r.output_ids[i]) << "greedy picks the most likely token";
    EXPECT_FLOAT_EQ(r.logprobs[i].top[0].logprob, r.logprobs[i].logprob);
    EXPECT_GE(r.logprobs[i].top[0].logprob, r.logprobs[i].top[3].logprob);
  }
}

TEST_F(EngineTest, RejectsInvalidRequests) {
  Engine engine(*model_, options(64));
  EXPECT_THROW(engine.submit(request(0, 4)), Error);
  GenerateRequest bad_id = request(3, 4);
  bad_id.input_ids[1] = 5000;
  EXPECT_THROW(engine.submit(bad_id), Error);
  EXPECT_THROW(engine.submit(request(60, 10)), Error);  // 70 slots > pool of 64
  GenerateRequest stop = request(3, 4);
  stop.sampling.stop = {"x"};
  EXPECT_THROW(engine.submit(stop), Error);  // no detokenizer
  GenerateRequest temp = request(3, 4);
  temp.sampling.temperature = -1;
  EXPECT_THROW(engine.submit(temp), Error);
  Engine big(*model_, options(4096));
  EXPECT_THROW(big.submit(request(1000, 100)), Error);  // past max_position_embeddings 1024
  EXPECT_NO_THROW(engine.submit(request(50, 14)));
  engine.step();
  EXPECT_THROW(engine.flush_cache(), Error);  // a request is in flight
  engine.run_until_idle();
  EXPECT_NO_THROW(engine.flush_cache());
}

}  // namespace
}  // namespace ms
