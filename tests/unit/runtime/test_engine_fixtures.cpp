// Batching is invisible: the four reference prompts of every fixture, submitted together to
// the engine, give the reference greedy tokens (up to the first step whose reference margin is
// below 1e-3) — plain, with 16-token prefill chunks, with a pool so small that decoding must
// retract requests, and with the radix cache serving prefixes of earlier requests.
#include <gtest/gtest.h>

#include "io/safetensors.h"
#include "runtime/engine.h"
#include "test_support.h"

namespace ms {
namespace {

constexpr int kPrompts = 4;

struct Reference {
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::vector<std::vector<float>> margins;
};

class EngineFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string dir = test::fixture_dir(GetParam());
    model_ = load_model(dir);
    auto ref = WeightStore::open_file(dir + "/reference.safetensors");
    for (int i = 0; i < kPrompts; ++i) {
      const std::string p = "prompt." + std::to_string(i);
      ref_.prompts.push_back(test::to_ids(ref.get(p + ".input_ids")));
      ref_.greedy.push_back(test::to_ids(ref.get(p + ".greedy_ids")));
      ref_.margins.push_back(ref.get(p + ".greedy_margins").to_vector());
    }
  }

  GenerateRequest greedy_request(const std::vector<int32_t>& prompt) const {
    GenerateRequest g;
    g.input_ids = prompt;
    g.sampling.temperature = 0.0f;
    g.sampling.max_new_tokens = int(ref_.greedy[0].size());
    g.sampling.ignore_eos = true;
    return g;
  }
  std::vector<GenerateRequest> reference_requests() const {
    std::vector<GenerateRequest> out;
    for (const auto& p : ref_.prompts) out.push_back(greedy_request(p));
    return out;
  }

  void expect_reference(int i, const GenerateResult& r, const std::string& label) const {
    ASSERT_EQ(r.output_ids.size(), ref_.greedy[size_t(i)].size()) << label << " prompt " << i;
    EXPECT_EQ(r.finish_reason, FinishReason::Length);
    for (size_t s = 0; s < r.output_ids.size(); ++s) {
      if (ref_.margins[size_t(i)][s] < 1e-3f) break;  // the reference cannot resolve this step
      ASSERT_EQ(r.output_ids[s], ref_.greedy[size_t(i)][s]) << GetParam() << " " << label << " prompt " << i
                                                             << " step " << s;
    }
  }
  void expect_all_reference(const std::vector<GenerateResult>& results, const std::string& label) const {
    ASSERT_EQ(results.size(), size_t(kPrompts));
    for (int i = 0; i < kPrompts; ++i) expect_reference(i, results[size_t(i)], label);
  }
  int64_t total_prompt_tokens() const {
    int64_t n = 0;
    for (const auto& p : ref_.prompts) n += int64_t(p.size());
    return n;
  }

  std::unique_ptr<CausalLM> model_;
  Reference ref_;
};

TEST_P(EngineFixtureTest, AllPromptsTogether) {
  EngineOptions o;
  o.max_total_tokens = 4096;
  o.scheduler.enable_radix_cache = false;
  Engine engine(*model_, o);
  expect_all_reference(engine.generate(reference_requests()), "batched");
  EngineStats s = engine.stats();
  EXPECT_EQ(s.scheduler.extend_batches, 1) << "all four prompts should prefill in one batch";
  EXPECT_EQ(s.pool_used, 0);
}

TEST_P(EngineFixtureTest, ChunkedPrefill16) {
  EngineOptions o;
  o.max_total_tokens = 4096;
  o.scheduler.chunked_prefill_size = 16;
  Engine engine(*model_, o);
  expect_all_reference(engine.generate(reference_requests()), "chunked-16");
  EngineStats s = engine.stats();
  // The 300-token prompt alone needs 19 chunks.
  EXPECT_GE(s.scheduler.extend_batches, (total_prompt_tokens() + 15) / 16);
  EXPECT_EQ(s.pool_used, s.cached_slots) << "every slot not in the cache must be free when idle";
}

// The pool holds all prompts but not all their outputs: decoding must retract the newest
// request, which is recomputed after the others finish.
TEST_P(EngineFixtureTest, RetractionUnderMemoryPressure) {
  for (bool radix : {false, true}) {
    EngineOptions o;
    o.max_total_tokens = total_prompt_tokens() + 9;
    o.scheduler.enable_radix_cache = radix;
    o.scheduler.conservativeness = 0.0;  // admit everything, so decode runs out
    Engine engine(*model_, o);
    const std::string label = radix ? "retraction+radix" : "retraction";
    expect_all_reference(engine.generate(reference_requests()), label);
    EngineStats s = engine.stats();
    EXPECT_GT(s.scheduler.retractions, 0) << label;
    EXPECT_EQ(s.pool_used, s.cached_slots) << label;
    if (!radix) EXPECT_EQ(s.pool_used, 0);
  }
}

TEST_P(EngineFixtureTest, RadixCacheReusesPrefixes) {
  EngineOptions o;
  o.max_total_tokens = 4096;
  o.scheduler.chunked_prefill_size = 64;
  Engine engine(*model_, o);
  expect_all_reference(engine.generate(reference_requests()), "radix, first pass");
  // Second pass: each prompt again, plus a new prompt that shares the first half of the longest.
  std::vector<GenerateRequest> again = reference_requests();
  const std::vector<int32_t>& longest = ref_.prompts[kPrompts - 1];
  again.push_back(greedy_request(std::vector<int32_t>(longest.begin(), longest.begin() + int(longest.size() / 2))));
  std::vector<GenerateResult> second = engine.generate(again);
  expect_all_reference(std::vector<GenerateResult>(second.begin(), second.begin() + kPrompts), "radix, second pass");
  for (int i = 0; i < kPrompts; ++i)
    EXPECT_EQ(second[size_t(i)].cached_tokens, int(ref_.prompts[size_t(i)].size()) - 1) << "prompt " << i;
  EXPECT_EQ(second[kPrompts].cached_tokens, int(longest.size() / 2) - 1);
  EXPECT_GT(engine.stats().scheduler.cached_tokens, 0);
  engine.flush_cache();
  EXPECT_EQ(engine.stats().pool_used, 0);
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, EngineFixtureTest, ::testing::ValuesIn(test::all_fixtures()), test::FixtureName());

}  // namespace
}  // namespace ms
