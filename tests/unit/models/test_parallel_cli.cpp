// The parallelism flags through `moeserve generate` / `logits` (ranks as threads of one process).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "parallel/socket_io.h"
#include "test_support.h"

namespace ms {
namespace {

std::string csv(const std::vector<int32_t>& ids) {
  std::string s;
  for (auto id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

TEST(ParallelCli, DpAttentionWithExpertParallelismGivesTheReferenceIds) {
  const std::string dir = test::fixture_dir("deepseek-v3-fp8-tiny");
  auto ref = WeightStore::open_file(dir + "/reference.safetensors");
  auto ids = test::to_ids(ref.get("prompt.1.input_ids"));
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " generate --model-path " + dir + " --ids " + csv(ids) +
                                  " --max-new-tokens 16 --ignore-eos --tp 4 --dp 4 --enable-dp-attention --ep-size 4",
                              out),
            0)
      << out;
  // This prompt's smallest reference margin is 7.4e-3: every step must match.
  EXPECT_EQ(nlohmann::json::parse(out)["output_ids"].get<std::vector<int32_t>>(), test::to_ids(ref.get("prompt.1.greedy_ids")));
}

TEST(ParallelCli, LogitsOverTensorParallelRanksMatchTheReference) {
  const std::string dir = test::fixture_dir("qwen3-moe-tiny"), file = test::temp_dir() + "/l.safetensors";
  auto ref = WeightStore::open_file(dir + "/reference.safetensors");
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " logits --model-path " + dir + " --ids " +
                                  csv(test::to_ids(ref.get("prompt.2.input_ids"))) + " --tp 4 --enable-ep-moe --out " + file,
                              out),
            0)
      << out;
  EXPECT_LT(test::rel_error(SafetensorsFile(file).get("logits"), ref.get("prompt.2.logits")), 1e-4);
}

// Two processes as two nodes on loopback give what one process with the same ranks gives.
TEST(ParallelCli, TwoNodesOnLoopbackMatchOneProcess) {
  const std::string dir = test::fixture_dir("deepseek-v3-tiny");
  auto ref = WeightStore::open_file(dir + "/reference.safetensors");
  const std::string gen = test::moeserve_bin() + " generate --model-path " + dir + " --ids " +
                          csv(test::to_ids(ref.get("prompt.2.input_ids"))) +
                          " --max-new-tokens 8 --ignore-eos --tp 4 --dp 2 --enable-dp-attention --ep-size 2";
  std::string one, two;
  ASSERT_EQ(test::run_command(gen, one), 0) << one;
  // A port that was free a moment ago (the two nodes must agree on it before either starts); a
  // test running beside this one may take it first, and then node 0 cannot listen: another port.
  int status = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    int probe = net::listen_on({"127.0.0.1", 0});
    const std::string port = std::to_string(net::local_port(probe));
    net::close_fd(probe);
    const std::string nodes = " --nnodes 2 --dist-init-addr 127.0.0.1:" + port;
    status = test::run_command("(" + gen + nodes + " --node-rank 1 > /dev/null 2>&1 & " + gen + nodes +
                                   " --node-rank 0; status=$?; wait $!; exit $((status | $?)))",
                               two);
    if (two.find("cannot listen on") == std::string::npos) break;
  }
  ASSERT_EQ(status, 0) << two;
  EXPECT_EQ(nlohmann::json::parse(two)["output_ids"], nlohmann::json::parse(one)["output_ids"]) << two;
}

// bench-one-batch over ranks: the batch dealt to the DP groups, every decode step timed, the
// collectives' time reported (0 on the shared-memory backend, which does not measure); two batch
// sizes run one after the other on the same ranks.
TEST(ParallelCli, BenchOneBatchRunsOverRanks) {
  const std::string file = test::temp_dir() + "/bench.jsonl";
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " bench-one-batch --model-path " + test::fixture_dir("qwen3-moe-tiny") +
                                  " --batch-size 3 2 --input-len 8 --output-len 4 --tp 2 --dp 2 --enable-dp-attention "
                                  "--ep-size 2 --result-file " + file,
                              out),
            0)
      << out;
  EXPECT_NE(out.find("Collectives (rank 0)"), std::string::npos) << out;
  std::ifstream in(file);
  int runs = 0;
  for (std::string line; std::getline(in, line); ++runs) {
    auto r = nlohmann::json::parse(line);
    EXPECT_EQ(r["batch_size"], runs == 0 ? 3 : 2);
    EXPECT_EQ(r["tp_size"], 2);
    EXPECT_EQ(r["dp_size"], 2);
    EXPECT_GT(r["median_decode_latency"].get<double>(), 0.0);
    EXPECT_EQ(r["median_decode_collective_seconds"].get<double>(), 0.0);
  }
  EXPECT_EQ(runs, 2) << out;
}

TEST(ParallelCli, Fp8ShardingRefusalNamesTheFixes) {
  std::string out;
  int rc = test::run_command(test::moeserve_bin() + " generate --model-path " + test::fixture_dir("deepseek-v3-fp8-tiny") +
                                 " --ids 5,17,3 --tp 8 --dp 8 --enable-dp-attention --ep-size 8",
                             out);
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("--moe-dense-tp-size 1"), std::string::npos) << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  rc = test::run_command(test::moeserve_bin() + " generate --model-path " + test::fixture_dir("qwen3-moe-tiny") +
                             " --ids 5 --tp 3 --dp 2 --enable-dp-attention",
                         out);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("--dp 2 must divide --tp 3"), std::string::npos) << out;
}

}  // namespace
}  // namespace ms
