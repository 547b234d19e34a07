// `moeserve make-random-model`: the published shape's config fields, `--set` overrides (the way a
// benchmark models one EP rank's expert shard), refusal of unknown fields, and a checkpoint that
// the engine loads and decodes.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_support.h"

namespace ms {
namespace {

using nlohmann::json;

json read_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  return json::parse(in);
}

TEST(MakeRandomModel, SetOverridesFieldsAndTheCheckpointRuns) {
  const std::string dir = test::temp_dir() + "/model";
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " make-random-model --shape qwen3-moe-small --layers 2 --set num_experts=4"
                                                     " --set num_experts_per_tok=2 --set vocab_size=512 " + dir, out), 0) << out;
  const json c = read_config(dir);
  EXPECT_EQ(c["num_experts"], 4);
  EXPECT_EQ(c["num_experts_per_tok"], 2);
  EXPECT_EQ(c["vocab_size"], 512);
  EXPECT_EQ(c["num_hidden_layers"], 2);
  EXPECT_EQ(c["hidden_size"], 1024);  // untouched fields keep the shape's value
  EXPECT_EQ(c["architectures"][0], "Qwen3MoeForCausalLM");

  ASSERT_EQ(test::run_command(test::moeserve_bin() + " generate --model-path " + dir + " --ids 1,2,3 --max-new-tokens 4 --ignore-eos", out), 0) << out;
  std::istringstream lines(out);
  std::string last, line;
  while (std::getline(lines, line)) if (!line.empty()) last = line;
  EXPECT_EQ(json::parse(last).at("output_ids").size(), 4u) << out;
}

TEST(MakeRandomModel, RefusesAnOverrideTheModelCannotRun) {
  // top-8 routing over 4 experts: refused before anything is written.
  std::string out;
  EXPECT_NE(test::run_command(test::moeserve_bin() + " make-random-model --shape qwen3-moe-small --layers 2 --set num_experts=4 " +
                              test::temp_dir() + "/model", out), 0);
  EXPECT_NE(out.find("num_experts_per_tok"), std::string::npos) << out;
}

TEST(MakeRandomModel, RefusesUnknownFieldsAndMalformedOverrides) {
  std::string out;
  const std::string dir = test::temp_dir() + "/model";
  EXPECT_NE(test::run_command(test::moeserve_bin() + " make-random-model --shape deepseek-v3 --layers 2 --set n_routed_expert=32 " + dir, out), 0);
  EXPECT_NE(out.find("n_routed_expert"), std::string::npos) << out;
  EXPECT_NE(test::run_command(test::moeserve_bin() + " make-random-model --shape deepseek-v3 --layers 2 --set n_routed_experts " + dir, out), 0);
  EXPECT_NE(out.find("KEY=VALUE"), std::string::npos) << out;
}

}  // namespace
}  // namespace ms
