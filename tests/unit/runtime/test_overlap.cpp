// Overlap scheduling: the engine issues step N+1 before it reads step N's tokens (placeholders
// in N+1's inputs name them on the device). Whatever the mix of requests — early stops that
// leave a token computed for nothing, stop strings, sampled requests (drawn on the device like
// greedy ones), penalised and logprob requests that force synchronous steps, retraction, aborts
// while a step is in flight — the outputs must be those of the engine that runs one step at a
// time, and no KV slot may leak.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/check.h"
#include "runtime/engine.h"
#include "test_support.h"

namespace ms {
namespace {

class OverlapTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = load_model(test::fixture_dir("qwen3-moe-tiny")).release(); }
  static void TearDownTestSuite() { delete model_; }

  static EngineOptions options(bool overlap, int64_t slots = 4096) {
    EngineOptions o;
    o.max_total_tokens = slots;
    o.disable_overlap_schedule = !overlap;
    o.scheduler.chunked_prefill_size = 16;
    o.scheduler.max_running_requests = 6;
    return o;
  }
  static GenerateRequest request(int len, int max_new, int first) {
    GenerateRequest g;
    for (int i = 0; i < len; ++i) g.input_ids.push_back(int32_t((first + i * 17) % 900 + 5));
    g.sampling.max_new_tokens = max_new;
    g.sampling.temperature = 0.0f;
    g.sampling.ignore_eos = true;
    return g;
  }
  static std::string detok(std::span<const int32_t> ids) {
    std::string s;
    for (int32_t id : ids) s += "<" + std::to_string(id) + ">";
    return s;
  }
  // Greedy continuations of the prompts, one step at a time.
  static std::vector<std::vector<int32_t>> greedy_outputs(const std::vector<GenerateRequest>& reqs) {
    Engine sync(*model_, options(false));
    std::vector<std::vector<int32_t>> out;
    for (const GenerateResult& r : sync.generate(reqs)) out.push_back(r.output_ids);
    return out;
  }
  static void expect_same(const std::vector<GenerateResult>& got, const std::vector<GenerateResult>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].output_ids, want[i].output_ids) << "request " << i;
      EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "request " << i;
      EXPECT_EQ(got[i].matched_stop, want[i].matched_stop) << "request " << i;
      ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
      for (size_t j = 0; j < got[i].logprobs.size(); ++j)
        EXPECT_EQ(got[i].logprobs[j].token, want[i].logprobs[j].token) << "request " << i << " token " << j;
    }
  }
  static void expect_no_leak(Engine& e) {
    const EngineStats s = e.stats();
    EXPECT_EQ(s.waiting + s.running, 0);
    EXPECT_EQ(s.pool_used, s.cached_slots) << "every slot outside the radix cache is free when idle";
  }

  static CausalLM* model_;
};
CausalLM* OverlapTest::model_ = nullptr;

// Early stops (a stop token, EOS, a stop string) end a request while its next step is already
// in flight; a sampled request overlaps too, penalised and logprob requests make some steps
// synchronous.
TEST_F(OverlapTest, MixedRequestsMatchTheSynchronousEngine) {
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) reqs.push_back(request(5 + 9 * i, 12 + i, 3 + 40 * i));
  const std::vector<std::vector<int32_t>> plain = greedy_outputs(reqs);
  reqs[1].sampling.stop_token_ids = {plain[1][3]};  // stops at its 4th token (or earlier)
  reqs[2].sampling.ignore_eos = false;
  reqs[2].sampling.stop_token_ids = {};
  reqs[3].sampling.stop = {"<" + std::to_string(plain[3][5]) + ">"};
  GenerateRequest sampled = request(7, 10, 500);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 42;
  reqs.push_back(sampled);
  GenerateRequest logprobs = request(6, 8, 700);
  logprobs.sampling.return_logprob = true;
  logprobs.sampling.top_logprobs_num = 2;
  reqs.push_back(logprobs);
  GenerateRequest none = request(4, 0, 800);
  reqs.push_back(none);
  GenerateRequest penalised = request(5, 6, 600);
  penalised.sampling.temperature = 0.9f;
  penalised.sampling.frequency_penalty = 0.5f;
  reqs.push_back(penalised);

  Engine sync(*model_, options(false), detok);
  Engine overlap(*model_, options(true), detok);
  const std::vector<GenerateResult> want = sync.generate(reqs);
  expect_same(overlap.generate(reqs), want);
  EXPECT_EQ(want[1].output_ids.back(), plain[1][3]);
  EXPECT_EQ(want[1].finish_reason, FinishReason::Stop);
  EXPECT_EQ(want[3].finish_reason, FinishReason::Stop);
  EXPECT_EQ(sync.stats().overlapped_steps, 0);
  EXPECT_GT(overlap.stats().overlapped_steps, 0);
  EXPECT_EQ(overlap.stats().generated_tokens, sync.stats().generated_tokens) << "dropped tokens are not counted";
  expect_no_leak(sync);
  expect_no_leak(overlap);

  // Only greedy requests: every decode step overlaps, one at a time or batched.
  std::vector<GenerateRequest> greedy(reqs.begin(), reqs.begin() + 4);
  Engine again(*model_, options(true), detok);
  const EngineStats before = again.stats();
  expect_same(again.generate({greedy[1]}), {want[1]});
  // Every step overlaps; one more than the tokens: the step after the stop token was issued
  // before the stop was read.
  EXPECT_EQ(again.stats().overlapped_steps - before.overlapped_steps, int64_t(want[1].output_ids.size()) + 1);
  expect_same(again.generate(greedy), std::vector<GenerateResult>(want.begin(), want.begin() + 4));
  expect_no_leak(again);
}

// Sampled requests (temperature, top_k, top_p, min_p; no penalty nor logprobs) are drawn on the
// device and overlap like greedy ones: a step draws token output_ids + pending_ids of each
// request (the tokens in flight count), so the draws, a function of (seed, token index), are
// those of the engine that samples every step on the host.
TEST_F(OverlapTest, SampledRequestsOverlapAndMatch) {
  std::vector<GenerateRequest> reqs;
  const float temps[] = {1.0f, 0.7f, 1.3f, 1.0f, 0.5f};
  for (int i = 0; i < 5; ++i) {
    GenerateRequest g = request(6 + 5 * i, 9 + i, 31 * i + 2);
    g.sampling.temperature = temps[i];
    g.sampling.seed = 100 + i;
    if (i == 1) g.sampling.top_k = 20;
    if (i == 2) g.sampling.top_p = 0.9f;
    if (i == 3) g.sampling.min_p = 0.1f;
    if (i == 4) g.sampling.temperature = 0.0f;  // a greedy row among drawn ones
    ASSERT_TRUE(g.sampling.device_sampleable());
    reqs.push_back(g);
  }
  Engine sync(*model_, options(false), detok);
  const std::vector<GenerateResult> want = sync.generate(reqs);
  Engine overlap(*model_, options(true), detok);
  expect_same(overlap.generate(reqs), want);
  expect_no_leak(overlap);
  // One request alone: every step (its prefill and each decode) overlaps.
  Engine single(*model_, options(true), detok);
  expect_same(single.generate({reqs[0]}), {want[0]});
  EXPECT_EQ(single.stats().overlapped_steps, int64_t(want[0].output_ids.size()));
  // Draws differ by seed: the tokens are not the greedy ones.
  GenerateRequest greedy = reqs[0];
  greedy.sampling.temperature = 0.0f;
  EXPECT_NE(sync.generate({greedy})[0].output_ids, want[0].output_ids);
}

// The pool holds the prompts but not all the outputs: decode steps retract, which first needs
// the tokens in flight.
TEST_F(OverlapTest, RetractionWaitsForTheTokensInFlight) {
  std::vector<GenerateRequest> reqs;
  int64_t prompt_tokens = 0;
  for (int i = 0; i < 5; ++i) {
    reqs.push_back(request(20 + 3 * i, 14, 11 * i + 1));
    prompt_tokens += 20 + 3 * i;
  }
  for (bool radix : {false, true}) {
    EngineOptions sync_o = options(false, prompt_tokens + 12), overlap_o = options(true, prompt_tokens + 12);
    for (EngineOptions* o : {&sync_o, &overlap_o}) {
      o->scheduler.conservativeness = 0.0;
      o->scheduler.enable_radix_cache = radix;
      o->scheduler.chunked_prefill_size = 0;
    }
    Engine sync(*model_, sync_o), overlap(*model_, overlap_o);
    expect_same(overlap.generate(reqs), sync.generate(reqs));
    EXPECT_GT(overlap.stats().scheduler.retractions, 0) << "radix " << radix;
    EXPECT_GT(overlap.stats().overlapped_steps, 0);
    expect_no_leak(overlap);
  }
}

TEST_F(OverlapTest, AbortWhileAStepIsInFlight) {
  const GenerateRequest long_one = request(10, 40, 9);
  const std::vector<int32_t> full = greedy_outputs({long_one})[0];
  Engine engine(*model_, options(true));
  std::vector<int32_t> got;
  FinishReason reason = FinishReason::None;
  const RequestId id = engine.submit(long_one, [&](const StreamOutput& o) {
    got.insert(got.end(), o.new_ids.begin(), o.new_ids.end());
    if (o.finished) reason = o.finish_reason;
  });
  while (got.size() < 5) ASSERT_TRUE(engine.step());
  EXPECT_GT(engine.stats().overlapped_steps, 0);
  engine.abort(id);
  engine.run_until_idle();
  EXPECT_EQ(reason, FinishReason::Abort);
  ASSERT_LE(got.size(), full.size());
  EXPECT_EQ(got, std::vector<int32_t>(full.begin(), full.begin() + std::ptrdiff_t(got.size())));
  expect_no_leak(engine);
  // The engine goes on: the same request again gives the whole continuation.
  EXPECT_EQ(engine.generate({long_one})[0].output_ids, full);
  expect_no_leak(engine);
}

// A placeholder id -(j + 1) embeds the row of the token the previous step sampled at row j.
TEST(OverlapEmbedding, PlaceholdersReadTheEarlierIds) {
  Tensor table = Tensor::empty(DType::F32, {10, 3});
  for (int64_t i = 0; i < 30; ++i) table.data<float>()[i] = float(i);
  Tensor earlier = Tensor::empty(DType::I32, {2});
  earlier.data<int32_t>()[0] = 7, earlier.data<int32_t>()[1] = 2;
  Tensor out = Tensor::empty(DType::F32, {3, 3});
  const std::vector<int32_t> ids = {4, -2, -1};
  ops::embedding(table, ids, out, &earlier);
  EXPECT_EQ(out.to_vector(), std::vector<float>({12, 13, 14, 6, 7, 8, 21, 22, 23}));
  EXPECT_THROW(ops::embedding(table, std::vector<int32_t>{-3, 0, 0}, out, &earlier), Error);
  EXPECT_THROW(ops::embedding(table, std::vector<int32_t>{-1, 0, 0}, out), Error) << "no earlier ids";
}

}  // namespace
}  // namespace ms
