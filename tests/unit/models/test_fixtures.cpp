// The five reference fixtures: logits at every position, greedy ids (up to the first step whose
// reference margin is too small to resolve), and the DeepSeek MTP layer, in fp32 and bf16.
#include <gtest/gtest.h>

#include <algorithm>

#include "io/safetensors.h"
#include "runtime/generator.h"
#include "test_support.h"

namespace ms {
namespace {

class FixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = test::fixture_dir(GetParam());
    model_ = load_model(dir_);
    ref_ = std::make_unique<WeightStore>(WeightStore::open_file(dir_ + "/reference.safetensors"));
  }
  std::vector<int32_t> prompt(int i) const { return test::to_ids(ref_->get("prompt." + std::to_string(i) + ".input_ids")); }

  std::string dir_;
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<WeightStore> ref_;
};

TEST_P(FixtureTest, LogitsMatchReferenceInFp32) {
  Generator gen(*model_);
  for (int i = 0; i < 4; ++i) {
    Tensor out = gen.prompt_logits(prompt(i));
    Tensor ref = ref_->get("prompt." + std::to_string(i) + ".logits");
    ASSERT_EQ(out.shape(), ref.shape());
    EXPECT_LT(test::rel_error(out, ref), 1e-4) << GetParam() << " prompt " << i;
  }
}

// bf16 activations: a token whose expert choice flips (a near-tie in the router, resolved
// differently after rounding) legitimately moves far; every other token must stay within 2e-2,
// and flips must stay rare.
TEST_P(FixtureTest, LogitsMatchReferenceWithBf16Activations) {
  Generator gen32(*model_), gen16(*model_, /*bf16_activations=*/true);
  int64_t rows = 0, flipped = 0;
  for (int i = 0; i < 4; ++i) {
    std::vector<Tensor> route32, route16;
    gen32.prompt_logits(prompt(i), &route32);
    Tensor out = gen16.prompt_logits(prompt(i), &route16);
    Tensor ref = ref_->get("prompt." + std::to_string(i) + ".logits");
    const int64_t T = ref.size(0);
    auto stable = test::same_routing(route32, route16, T);
    std::vector<int64_t> keep;
    for (int64_t t = 0; t < T; ++t) {
      if (stable[t]) keep.push_back(t); else ++flipped;
    }
    rows += T;
    double err = test::rel_error(test::select_rows(out, keep), test::select_rows(ref, keep));
    EXPECT_LT(err, 2e-2) << GetParam() << " prompt " << i;
    EXPECT_GT(err, 0.0) << "bf16 rounding had no effect";
  }
  EXPECT_LE(flipped * 10, rows) << flipped << " of " << rows << " tokens changed experts under bf16";
}

TEST_P(FixtureTest, GreedyIdsMatchUpToAnUnresolvableMargin) {
  Generator gen(*model_);
  for (int i = 0; i < 4; ++i) {
    std::string p = "prompt." + std::to_string(i);
    auto ref_ids = test::to_ids(ref_->get(p + ".greedy_ids"));
    auto margins = ref_->get(p + ".greedy_margins").to_vector();
    GenerateOptions opt;
    opt.max_new_tokens = int(ref_ids.size());
    opt.ignore_eos = true;
    auto out = gen.generate(prompt(i), opt);
    ASSERT_EQ(out.size(), ref_ids.size());
    for (size_t s = 0; s < ref_ids.size(); ++s) {
      if (margins[s] < 1e-3f) break;  // a legitimate divergence: stop comparing this prompt
      ASSERT_EQ(out[s], ref_ids[s]) << GetParam() << " prompt " << i << " step " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, FixtureTest, ::testing::ValuesIn(test::all_fixtures()), test::FixtureName());

TEST(MtpLayer, MatchesReferenceMtpLogits) {
  const std::string dir = test::fixture_dir("deepseek-v3-tiny");
  auto model = load_model(dir);
  ASSERT_NE(model->mtp, nullptr);
  auto ref = WeightStore::open_file(dir + "/reference.safetensors");
  Generator gen(*model);
  int checked = 0;
  for (int i = 0; i < 4; ++i) {
    std::string p = "prompt." + std::to_string(i);
    if (!ref.has(p + ".mtp_logits")) continue;
    Tensor out = gen.mtp_logits(test::to_ids(ref.get(p + ".input_ids")));
    Tensor expected = ref.get(p + ".mtp_logits");
    ASSERT_EQ(out.shape(), expected.shape());
    EXPECT_LT(test::rel_error(out, expected), 1e-4) << p;
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

}  // namespace
}  // namespace ms
