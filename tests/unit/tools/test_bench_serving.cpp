// `moeserve bench-serving` and `moeserve eval-gsm8k` against an in-process fake server that
// records every request: token totals equal what the server was asked for, percentiles agree
// with the per-request records, arrivals follow the seeded Poisson schedule, and the server
// never sees more than --max-concurrency requests at once.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench/driver.h"
#include "bench/gsm8k.h"
#include "bench/metrics.h"
#include "fake_llm_server.h"
#include "io/tokenizer.h"
#include "test_support.h"

namespace ms {
namespace {

using nlohmann::json;

struct CliRun {
  int status = 0;
  std::string output;
  json record;  // the line bench-serving appended to its --output-file
};

CliRun run_cli(const std::string& args, const std::string& output_file) {
  CliRun r;
  r.status = test::run_command(test::moeserve_bin() + " " + args + " --disable-tqdm", r.output);
  std::ifstream in(output_file);
  std::string line, last;
  int lines = 0;
  while (std::getline(in, line)) last = line, ++lines;
  if (lines == 1) r.record = json::parse(last);
  return r;
}

// The value printed after `label` in the result block.
double printed(const std::string& output, const std::string& label) {
  const size_t at = output.find(label);
  EXPECT_NE(at, std::string::npos) << label << " missing from\n" << output;
  return at == std::string::npos ? -1 : std::stod(output.substr(at + label.size()));
}

std::vector<double> flat_ms(const json& lists) {
  std::vector<double> out;
  for (const auto& l : lists)
    for (double x : l) out.push_back(x * 1000);
  return out;
}

std::vector<double> ms_of(const json& list) {
  std::vector<double> out;
  for (double x : list) out.push_back(x * 1000);
  return out;
}

void expect_summary(const json& rec, const std::string& name, const std::vector<double>& values) {
  const bench::Summary s = bench::summarize(values);
  EXPECT_NEAR(rec["mean_" + name + "_ms"].get<double>(), s.mean, 1e-6) << name;
  EXPECT_NEAR(rec["median_" + name + "_ms"].get<double>(), s.median, 1e-6) << name;
  EXPECT_NEAR(rec["p99_" + name + "_ms"].get<double>(), s.p99, 1e-6) << name;
  EXPECT_LE(rec["median_" + name + "_ms"].get<double>(), rec["p99_" + name + "_ms"].get<double>());
}

TEST(BenchServing, NativeTotalsPercentilesAndConcurrencyFromTheServerSide) {
  test::FakeLlmServer server(std::chrono::milliseconds(3));
  const std::string out_file = test::temp_dir() + "/result.jsonl";
  const CliRun r = run_cli("bench-serving --base-url " + server.url() + " --tokenizer " +
                               test::fixture_dir("qwen3-moe-tiny") +
                               " --num-prompts 48 --random-input-len 40 --random-output-len 24 "
                               "--random-range-ratio 0.25 --request-rate inf --max-concurrency 6 --seed 5 "
                               "--warmup-requests 2 --output-details --output-file " + out_file,
                           out_file);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 50u);  // 2 warmup + 48
  int64_t asked_in = 0, asked_out = 0;
  for (size_t i = 2; i < seen.size(); ++i) {
    const json& b = seen[i].body;
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["sampling_params"]["ignore_eos"], true);
    EXPECT_EQ(b["sampling_params"]["temperature"], 0.0);
    for (int id : b["input_ids"]) ASSERT_TRUE(id >= 0 && id < 1024);  // the fixture's vocabulary
    asked_in += int64_t(b["input_ids"].size());
    asked_out += b["sampling_params"]["max_new_tokens"].get<int64_t>();
  }
  EXPECT_EQ(server.max_in_flight(), 6);
  const json& rec = r.record;
  EXPECT_EQ(rec["completed"], 48);
  EXPECT_EQ(rec["total_input_tokens"], asked_in);
  EXPECT_EQ(rec["total_output_tokens"], asked_out);
  EXPECT_EQ(printed(r.output, "Successful requests:"), 48);
  EXPECT_EQ(printed(r.output, "Total input tokens:"), double(asked_in));
  EXPECT_EQ(printed(r.output, "Total generated tokens:"), double(asked_out));
  EXPECT_EQ(printed(r.output, "Max request concurrency:"), 6);
  EXPECT_NEAR(printed(r.output, "P99 TTFT (ms):"), rec["p99_ttft_ms"].get<double>(), 0.006);
  EXPECT_NEAR(printed(r.output, "Max ITL (ms):"), rec["max_itl_ms"].get<double>(), 0.006);
  // Every record: one ITL per token after the first, E2E after TTFT; the summaries are theirs.
  int64_t sum_out = 0;
  for (size_t i = 0; i < 48; ++i) {
    const int n = rec["output_lens"][i];
    sum_out += n;
    EXPECT_EQ(rec["itls"][i].size(), size_t(n - 1));
    EXPECT_GE(rec["e2e_latencies"][i].get<double>(), rec["ttfts"][i].get<double>());
    EXPECT_GE(rec["e2e_latencies"][i].get<double>(), n * 0.003);  // the server's pace
    EXPECT_EQ(rec["errors"][i], "");
  }
  EXPECT_EQ(sum_out, asked_out);
  expect_summary(rec, "ttft", ms_of(rec["ttfts"]));
  expect_summary(rec, "e2e_latency", ms_of(rec["e2e_latencies"]));
  expect_summary(rec, "itl", flat_ms(rec["itls"]));
  EXPECT_NEAR(rec["p95_itl_ms"].get<double>(), bench::percentile(flat_ms(rec["itls"]), 95), 1e-6);
  double e2e_sum = 0;
  for (double x : rec["e2e_latencies"]) e2e_sum += x;
  EXPECT_NEAR(rec["concurrency"].get<double>(), e2e_sum / rec["duration"].get<double>(), 1e-9);
  EXPECT_LE(rec["concurrency"].get<double>(), 6.0);
}

TEST(BenchServing, PoissonArrivalsFollowTheSeededSchedule) {
  test::FakeLlmServer server(std::chrono::milliseconds(1));
  const std::string out_file = test::temp_dir() + "/result.jsonl";
  const double rate = 40;
  const CliRun r = run_cli("bench-serving --base-url " + server.url() + " --tokenizer " +
                               test::fixture_dir("qwen3-moe-tiny") +
                               " --num-prompts 40 --random-input-len 8 --random-output-len 4 --request-rate 40 "
                               "--seed 11 --warmup-requests 0 --output-details --output-file " + out_file,
                           out_file);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 40u);
  const std::vector<double> plan = bench::poisson_arrivals(40, rate, 11);
  EXPECT_NEAR(plan.back() / 39, 1 / rate, 0.5 / rate);  // 39 exponential gaps: within 3 sigma
  // Client side: no request leaves before its arrival time, and most leave right at it (the
  // machine is shared with builds, so a few may be late).
  std::vector<double> late;
  for (size_t i = 0; i < 40; ++i) {
    const double start = r.record["start_times"][i].get<double>();
    EXPECT_GE(start, plan[i] - 1e-6) << "request " << i;
    late.push_back(start - plan[i]);
  }
  EXPECT_LT(bench::percentile(late, 50), 0.02);
  // Server side: the same schedule arrives, spread over the same span.
  std::vector<double> got;
  for (const auto& s : seen) got.push_back(s.arrival_s - seen[0].arrival_s);
  std::sort(got.begin(), got.end());
  std::vector<double> off;
  for (size_t i = 0; i < got.size(); ++i) off.push_back(std::abs(got[i] - plan[i]));
  EXPECT_LT(bench::percentile(off, 50), 0.02);
  EXPECT_NEAR(got.back() / 39, plan.back() / 39, 0.1 / 39);
}

TEST(BenchServing, CompletionsBackendAndTheServersModelDirectory) {
  test::FakeLlmServer server(std::chrono::milliseconds(1), {}, test::fixture_dir("deepseek-v3-tiny"));
  const std::string out_file = test::temp_dir() + "/result.jsonl";
  const CliRun r = run_cli("bench-serving --backend vllm --base-url " + server.url() +
                               " --num-prompts 12 --random-input-len 16 --random-output-len 8 --random-range-ratio 1 "
                               "--max-concurrency 4 --warmup-requests 1 --output-file " + out_file,
                           out_file);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 13u);
  for (const auto& s : seen) {
    EXPECT_EQ(s.path, "/v1/completions");
    EXPECT_EQ(s.body["model"], "fake-model");
    EXPECT_EQ(s.body["stream_options"]["include_usage"], true);
  }
  EXPECT_EQ(seen.back().body["prompt"].size(), 16u);
  EXPECT_EQ(r.record["completed"], 12);
  EXPECT_EQ(r.record["total_input_tokens"], 12 * 16);
  EXPECT_EQ(r.record["total_output_tokens"], 12 * 8);
  EXPECT_FALSE(r.record.contains("itls"));  // details only when asked
}

// ShareGPT prompts go as text and are measured with the model's tokenizer; the random dataset
// over the same file cuts the tokenized texts to its drawn lengths.
TEST(BenchServing, ShareGptLengthsComeFromTheTokenizer) {
  const std::string dir = test::temp_dir();
  std::string out;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " make-demo-model " + dir + "/demo", out), 0) << out;
  json convs = json::array();
  for (int i = 0; i < 6; ++i)
    convs.push_back({{"conversations",
                      {{{"from", "human"}, {"value", "How do experts route tokens, case " + std::to_string(i) + "?"}},
                       {{"from", "gpt"}, {"value", "A router picks the top experts for every token."}}}}});
  convs.push_back({{"conversations", {{{"from", "human"}, {"value", "one turn only"}}}}});  // skipped
  std::ofstream(dir + "/sharegpt.json") << convs.dump();
  const Tokenizer tok = Tokenizer::load(dir + "/demo");
  const int reply_len = int(tok.encode("A router picks the top experts for every token.").size());
  test::FakeLlmServer server(std::chrono::milliseconds(1));
  const std::string common = " --base-url " + server.url() + " --tokenizer " + dir + "/demo --dataset-path " + dir +
                             "/sharegpt.json --num-prompts 6 --warmup-requests 0 --output-file ";
  CliRun r = run_cli("bench-serving --dataset-name sharegpt" + common + dir + "/a.jsonl", dir + "/a.jsonl");
  ASSERT_EQ(r.status, 0) << r.output;
  int64_t expect_in = 0;
  for (const auto& s : server.seen()) {
    expect_in += int64_t(tok.encode(s.body["text"].get<std::string>()).size());
    EXPECT_EQ(s.body["sampling_params"]["max_new_tokens"], reply_len);  // the reply's length
  }
  EXPECT_EQ(server.seen().size(), 6u);
  EXPECT_EQ(r.record["total_input_tokens"], expect_in);
  EXPECT_EQ(r.record["total_output_tokens"], 6 * reply_len);
  const std::string random = "bench-serving --dataset-name random --random-input-len 40 --random-output-len 4 "
                             "--random-range-ratio 1";
  r = run_cli(random + common + dir + "/b.jsonl", dir + "/b.jsonl");
  ASSERT_EQ(r.status, 0) << r.output;
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 12u);
  for (size_t i = 6; i < 12; ++i) {  // ids of the ShareGPT prompts, repeated to length
    const auto ids = seen[i].body["input_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids.size(), 40u);
    const std::string text = tok.decode(ids);
    EXPECT_NE(text.find("How do experts route tokens"), std::string::npos) << text;
  }
}

TEST(BenchServing, RefusedRequestsAreCountedAsFailedWithTheirError) {
  test::FakeLlmServer server(std::chrono::milliseconds(1));
  server.refuse_when([](int index) { return index % 3 == 2; });  // index 0 is the warmup
  const std::string out_file = test::temp_dir() + "/result.jsonl";
  const CliRun r = run_cli("bench-serving --base-url " + server.url() + " --tokenizer " +
                               test::fixture_dir("qwen3-moe-tiny") +
                               " --num-prompts 12 --random-input-len 8 --random-output-len 4 --random-range-ratio 1"
                               " --max-concurrency 1 --output-details --output-file " + out_file,
                           out_file);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.record["completed"], 8);  // arrivals 1..12: 2, 5, 8, 11 refused
  EXPECT_EQ(r.record["failed"], 4);
  EXPECT_EQ(r.record["total_input_tokens"], 8 * 8);
  EXPECT_EQ(r.record["total_output_tokens"], 8 * 4);
  int refused = 0;
  for (const auto& e : r.record["errors"]) {
    const std::string error = e.get<std::string>();
    if (error.empty()) continue;
    ++refused;
    EXPECT_NE(error.find("HTTP 400"), std::string::npos) << error;
    EXPECT_NE(error.find("refused by the test"), std::string::npos) << error;
  }
  EXPECT_EQ(refused, 4);
  EXPECT_EQ(printed(r.output, "Failed requests:"), 4);
}

TEST(BenchServing, UnreachableServerFailsWithTheReason) {
  const std::string out_file = test::temp_dir() + "/result.jsonl";
  const CliRun r = run_cli("bench-serving --base-url http://127.0.0.1:1 --tokenizer " +
                               test::fixture_dir("qwen3-moe-tiny") + " --num-prompts 2 --output-file " + out_file,
                           out_file);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("warmup failed"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Connection"), std::string::npos) << r.output;
}

TEST(EvalGsm8k, AccuracyAgainstAStubAnswerList) {
  const std::string dir = test::temp_dir();
  std::ofstream data(dir + "/gsm8k.jsonl");
  const int labels[] = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
  for (int i = 0; i < 10; ++i) {
    const std::string n = std::to_string(i), label = std::to_string(labels[i]);
    data << json{{"question", std::string("Q").append(n).append("?")}, {"answer", std::string("so\n#### ").append(label)}}
         << "\n";
  }
  data.close();
  // Replies: right for Q0..Q5, wrong for Q6 and Q7, no number for Q8 and Q9.
  auto script = [&](const std::string& prompt) -> std::vector<std::string> {
    const size_t at = prompt.rfind("Question: Q");
    const int q = std::stoi(prompt.substr(at + 11));
    if (q < 6) return {" The", " answer", " is", std::string(" ").append(std::to_string(labels[q])), "."};
    if (q < 8) return {" 1,000", " and", " 7"};
    return {" I", " cannot", " tell"};
  };
  test::FakeLlmServer server(std::chrono::milliseconds(1), script);
  const std::string out_file = dir + "/gsm8k_result.jsonl";
  const CliRun r = run_cli("eval-gsm8k --base-url " + server.url() + " --data-path " + dir +
                               "/gsm8k.jsonl --num-shots 2 --num-questions 10 --parallel 4 --max-new-tokens 64 "
                               "--output-file " + out_file,
                           out_file);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("Accuracy: 0.600"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Invalid: 0.200"), std::string::npos) << r.output;
  EXPECT_EQ(r.record["correct"], 6);
  EXPECT_EQ(r.record["output_tokens"], 6 * 5 + 2 * 3 + 2 * 3);
  EXPECT_LE(server.max_in_flight(), 4);
  const auto seen = server.seen();
  ASSERT_EQ(seen.size(), 10u);
  for (const auto& s : seen) {
    const std::string text = s.body["text"];
    EXPECT_EQ(text.rfind("Question: Q0?\nAnswer: so\n#### 3\n\nQuestion: Q1?\nAnswer: so\n#### 14\n\nQuestion: Q", 0), 0u)
        << text;
    EXPECT_EQ(s.body["sampling_params"]["stop"], json(bench::gsm8k_stop()));
    EXPECT_EQ(s.body["sampling_params"]["max_new_tokens"], 64);
  }
}

}  // namespace
}  // namespace ms
