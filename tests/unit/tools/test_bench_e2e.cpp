// The benchmark tools against `moeserve serve`: bench-serving on a fixture model (token totals
// equal the server's own counters, the server never runs more than --max-concurrency requests),
// bench-offline through the in-process engine, bench-one-batch's lists, and eval-gsm8k on
// random-weight models (accuracy near 0, the invalid rate reported, every request answered).
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "bench/http_client.h"
#include "server_process.h"
#include "test_support.h"

namespace ms {
namespace {

using nlohmann::json;

// A Prometheus sample of GET /metrics ("name{labels} value" or "name value").
double metric(const std::string& url, const std::string& name) {
  const bench::HttpReply r = bench::http_get(bench::parse_base_url(url), "/metrics");
  EXPECT_TRUE(r.ok()) << r.error;
  std::istringstream in(r.body);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name, 0) != 0 || (line[name.size()] != ' ' && line[name.size()] != '{')) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  ADD_FAILURE() << name << " not in /metrics";
  return -1;
}

json run_json(const std::string& args, const std::string& out_file, std::string& output) {
  const int status = test::run_command(test::moeserve_bin() + " " + args + " --disable-tqdm", output);
  EXPECT_EQ(status, 0) << output;
  std::ifstream in(out_file);
  std::string line;
  std::getline(in, line);
  return line.empty() ? json() : json::parse(line);
}

TEST(BenchServingE2E, FixtureServerCountsMatchAndConcurrencyIsRespected) {
  const std::string model = test::fixture_dir("qwen3-moe-tiny");
  test::ServerProcess server({"--model-path", model, "--max-total-tokens", "4096"});
  // Watch the scheduler from the server side while the benchmark runs.
  std::atomic<bool> done{false};
  std::atomic<int> peak{0};
  std::thread watch([&] {
    while (!done) {
      const int n = int(metric(server.url(), "moeserve:num_running_reqs") + metric(server.url(), "moeserve:num_queue_reqs"));
      peak = std::max(peak.load(), n);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const std::string out_file = test::temp_dir() + "/bench.jsonl";
  std::string output;
  // No --tokenizer: the server's /get_model_info names the fixture directory.
  const json rec = run_json("bench-serving --base-url " + server.url() +
                                " --num-prompts 24 --random-input-len 48 --random-output-len 96 --random-range-ratio 0.5"
                                " --request-rate inf --max-concurrency 4 --seed 3 --warmup-requests 0 --output-details"
                                " --output-file " + out_file,
                            out_file, output);
  done = true;
  watch.join();
  ASSERT_FALSE(rec.is_null()) << output;
  EXPECT_EQ(rec["completed"], 24);
  EXPECT_EQ(rec["failed"], 0);
  EXPECT_EQ(metric(server.url(), "moeserve:num_requests_total"), 24);
  EXPECT_EQ(metric(server.url(), "moeserve:prompt_tokens_total"), rec["total_input_tokens"].get<double>());
  EXPECT_EQ(metric(server.url(), "moeserve:generation_tokens_total"), rec["total_output_tokens"].get<double>());
  int64_t sum_out = 0;
  for (int n : rec["output_lens"]) sum_out += n;
  EXPECT_EQ(rec["total_output_tokens"], sum_out);
  // Long enough a run (~1 s) that the 5 ms samples see the limit reached, never passed.
  EXPECT_EQ(peak.load(), 4);
  EXPECT_NE(output.find("============ Serving Benchmark Result ============"), std::string::npos) << output;
}

TEST(BenchServingE2E, OpenAiBackendOnTheDemoModel) {
  const std::string demo = test::temp_dir() + "/demo";
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " make-demo-model " + demo, out), 0) << out;
  test::ServerProcess server({"--model-path", demo, "--max-total-tokens", "4096"});
  const std::string out_file = test::temp_dir() + "/bench.jsonl";
  const json rec = run_json("bench-serving --backend openai --base-url " + server.url() + " --tokenizer " + demo +
                                " --num-prompts 8 --random-input-len 32 --random-output-len 8 --random-range-ratio 1"
                                " --max-concurrency 8 --warmup-requests 1 --output-file " + out_file,
                            out_file, out);
  ASSERT_FALSE(rec.is_null()) << out;
  EXPECT_EQ(rec["completed"], 8);
  EXPECT_EQ(rec["total_input_tokens"], 8 * 32);
  EXPECT_EQ(rec["total_output_tokens"], 8 * 8);  // ignore_eos: every request runs to max_tokens
  EXPECT_EQ(metric(server.url(), "moeserve:generation_tokens_total"), 8 * 8 + 8);  // + the warmup's
  EXPECT_TRUE(rec.contains("total_output_tokens_retokenized"));  // the demo model streams text
}

TEST(BenchOfflineE2E, TotalsThroughTheEngine) {
  const std::string out_file = test::temp_dir() + "/offline.jsonl";
  std::string out;
  const json rec = run_json("bench-offline --model-path " + test::fixture_dir("deepseek-v2-lite-tiny") +
                                " --num-prompts 12 --random-input-len 40 --random-output-len 6 --random-range-ratio 1"
                                " --max-total-tokens 4096 --result-filename " + out_file,
                            out_file, out);
  ASSERT_FALSE(rec.is_null()) << out;
  EXPECT_EQ(rec["successful_requests"], 12);
  EXPECT_EQ(rec["total_input_tokens"], 12 * 40);
  EXPECT_EQ(rec["total_output_tokens"], 12 * 6);
  EXPECT_NE(out.find("Offline Throughput Benchmark Result"), std::string::npos) << out;
}

// bench-one-batch with lists, as SGLang's: every batch size x input length x output length on one
// load, in that order, one result line each; a combination past the model's positions is refused
// before any runs, with both lengths named.
TEST(BenchOneBatchE2E, EveryCombinationOnOneLoad) {
  const std::string file = test::temp_dir() + "/one_batch.jsonl", model = test::fixture_dir("qwen3-moe-tiny");
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " bench-one-batch --model-path " + model +
                                  " --batch-size 1 3 --input-len 8 5 --output-len 4 --result-filename " + file,
                              out),
            0)
      << out;
  std::ifstream in(file);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 4u) << out;
  const int want[4][2] = {{1, 8}, {1, 5}, {3, 8}, {3, 5}};
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["batch_size"], want[i][0]) << lines[i];
    EXPECT_EQ(lines[i]["input_len"], want[i][1]) << lines[i];
    EXPECT_EQ(lines[i]["output_len"], 4) << lines[i];
    EXPECT_GT(lines[i]["median_decode_latency"].get<double>(), 0.0) << lines[i];
  }
  size_t prefills = 0;
  for (size_t at = out.find("Prefill. latency"); at != std::string::npos; at = out.find("Prefill. latency", at + 1))
    ++prefills;
  EXPECT_EQ(prefills, 4u) << out;

  EXPECT_NE(test::run_command(test::moeserve_bin() + " bench-one-batch --model-path " + model +
                                  " --batch-size 1 --input-len 8 1020 --output-len 8",
                              out),
            0);
  EXPECT_NE(out.find("(1020 + 8) exceeds max_position_embeddings (1024)"), std::string::npos) << out;
  EXPECT_EQ(out.find("Prefill. latency"), std::string::npos) << out;  // refused before the first run
}

TEST(BenchOfflineE2E, SampledRequestsReportTheirTemperature) {
  const std::string out_file = test::temp_dir() + "/offline.jsonl";
  std::string out;
  const json rec = run_json("bench-offline --model-path " + test::fixture_dir("qwen3-moe-tiny") +
                                " --num-prompts 6 --random-input-len 24 --random-output-len 5 --random-range-ratio 1"
                                " --temperature 0.8 --top-p 0.9 --max-total-tokens 4096 --result-filename " + out_file,
                            out_file, out);
  ASSERT_FALSE(rec.is_null()) << out;
  EXPECT_EQ(rec["total_output_tokens"], 6 * 5);
  EXPECT_FLOAT_EQ(rec["temperature"].get<float>(), 0.8f);
  EXPECT_FLOAT_EQ(rec["top_p"].get<float>(), 0.9f);
}

std::string write_gsm8k(const std::string& dir) {
  const std::string path = dir + "/gsm8k.jsonl";
  std::ofstream data(path);
  for (int i = 0; i < 8; ++i)
    data << json{{"question", "Tom has " + std::to_string(i + 3) + " apples and buys 4 more. How many does he have?"},
                 {"answer", "He has " + std::to_string(i + 3) + " + 4 = " + std::to_string(i + 7) + " apples.\n#### " +
                                std::to_string(i + 7)}}
                .dump()
         << "\n";
  return path;
}

void expect_random_model_score(const json& rec, const std::string& output) {
  ASSERT_FALSE(rec.is_null()) << output;
  EXPECT_EQ(rec["num_questions"], 8);
  EXPECT_EQ(rec["failed"], 0) << output;
  EXPECT_LE(rec["accuracy"].get<double>(), 0.25);  // random weights
  EXPECT_GE(rec["invalid"].get<double>(), 0.0);
  EXPECT_LE(rec["invalid"].get<double>(), 1.0);
  EXPECT_GT(rec["output_tokens"].get<int>(), 0);
  EXPECT_NE(output.find("Invalid: "), std::string::npos) << output;
}

TEST(EvalGsm8kE2E, TextPromptsOnTheDemoModel) {
  const std::string dir = test::temp_dir();
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " make-demo-model " + dir + "/demo", out), 0) << out;
  test::ServerProcess server({"--model-path", dir + "/demo", "--max-total-tokens", "8192"});
  const json rec = run_json("eval-gsm8k --base-url " + server.url() + " --data-path " + write_gsm8k(dir) +
                                " --num-shots 3 --num-questions 8 --parallel 4 --max-new-tokens 24 --output-file " + dir +
                                "/eval.jsonl",
                            dir + "/eval.jsonl", out);
  expect_random_model_score(rec, out);
  EXPECT_EQ(metric(server.url(), "moeserve:num_requests_total"), 8);
}

TEST(EvalGsm8kE2E, ClientTokenizerOnAFixtureWithoutOne) {
  const std::string dir = test::temp_dir();
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " make-demo-model " + dir + "/demo", out), 0) << out;
  test::ServerProcess server({"--model-path", test::fixture_dir("qwen2-moe-tiny"), "--max-total-tokens", "8192"});
  // The demo tokenizer's ids (fewer than 1024) are all inside the fixture's vocabulary.
  const json rec = run_json("eval-gsm8k --base-url " + server.url() + " --data-path " + write_gsm8k(dir) +
                                " --tokenizer " + dir + "/demo --num-shots 1 --num-questions 8 --parallel 8"
                                " --max-new-tokens 8 --output-file " + dir + "/eval.jsonl",
                            dir + "/eval.jsonl", out);
  expect_random_model_score(rec, out);
  EXPECT_EQ(metric(server.url(), "moeserve:generation_tokens_total"), rec["output_tokens"].get<double>());
}

}  // namespace
}  // namespace ms
