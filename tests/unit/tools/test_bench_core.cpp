// The benchmark clients' parts on their own: percentiles as numpy computes them, metrics from
// outcomes, SSE framing cut at every byte, stream accounting (TTFT / ITL), seeded Poisson
// arrivals, the random dataset, the request driver's concurrency limit, GSM8K scoring.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "bench/driver.h"
#include "bench/gsm8k.h"
#include "bench/metrics.h"
#include "bench/progress.h"
#include "core/check.h"

namespace ms::bench {
namespace {

TEST(BenchMetrics, PercentilesInterpolateLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], q) = 1.03, 2.5, 3.85, 3.97 for q = 1, 50, 95, 99.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_NEAR(percentile(v, 1), 1.03, 1e-12);
  EXPECT_NEAR(percentile(v, 50), 2.5, 1e-12);
  EXPECT_NEAR(percentile(v, 95), 3.85, 1e-12);
  EXPECT_NEAR(percentile(v, 99), 3.97, 1e-12);
  EXPECT_EQ(percentile({7}, 99), 7);
  EXPECT_EQ(percentile({}, 50), 0);
  const Summary s = summarize(v);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_NEAR(s.std, std::sqrt(1.25), 1e-12);  // population std, as numpy.std
}

TEST(BenchMetrics, TotalsAndThroughputsFromOutcomes) {
  std::vector<RequestOutcome> outs(3);
  outs[0] = {true, "", 10, 4, 0.0, 0.1, 0.4, {0.1, 0.1, 0.1}, "", {}};
  outs[1] = {true, "", 20, 2, 0.0, 0.2, 0.3, {0.1}, "", {}};
  outs[2] = {false, "HTTP 500", 30, 0, 0.0, 0, 0, {}, "", {}};
  const ServingMetrics m = compute_metrics(outs, 2.0);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);  // the failed request's prompt is not counted
  EXPECT_EQ(m.total_output, 6);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.total_throughput, 18.0);
  EXPECT_NEAR(m.concurrency, 0.35, 1e-12);
  EXPECT_NEAR(m.ttft_ms.mean, 150, 1e-9);
  EXPECT_NEAR(m.itl_ms.mean, 100, 1e-9);
  EXPECT_NEAR(m.tpot_ms.mean, 100, 1e-9);  // (0.4 - 0.1) / 3 and (0.3 - 0.2) / 1
  const std::string block = format_result(m, {"moeserve", INFINITY, 8});
  EXPECT_NE(block.find("Successful requests:                     2"), std::string::npos) << block;
  EXPECT_NE(block.find("Failed requests:                         1"), std::string::npos) << block;
  EXPECT_NE(block.find("Traffic request rate:                    inf"), std::string::npos) << block;
  EXPECT_NE(block.find("Mean TTFT (ms):                          150.00"), std::string::npos) << block;
  EXPECT_EQ(metrics_json(m)["total_output_tokens"], 6);
}

TEST(BenchHttp, SseParserHandlesEveryCut) {
  const std::string stream = "data: {\"a\":1}\r\n\r\n: comment\nevent: x\ndata:{\"b\":2}\n\ndata: [DONE]\n\n";
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    std::vector<std::string> got;
    SseParser p([&](std::string_view d) {
      got.emplace_back(d);
      return true;
    });
    p.feed(std::string_view(stream).substr(0, cut));
    p.feed(std::string_view(stream).substr(cut));
    p.finish();
    ASSERT_EQ(got, (std::vector<std::string>{"{\"a\":1}", "{\"b\":2}", "[DONE]"})) << "cut at " << cut;
  }
}

TEST(BenchHttp, BaseUrlSplitsOriginAndPrefix) {
  EXPECT_EQ(parse_base_url("http://127.0.0.1:30000").origin, "http://127.0.0.1:30000");
  const HttpTarget t = parse_base_url("http://host:8000/api/");
  EXPECT_EQ(t.origin, "http://host:8000");
  EXPECT_EQ(t.path_prefix, "/api");
  EXPECT_THROW(parse_base_url("127.0.0.1:30000"), Error);
}

TEST(BenchRequest, BodiesFollowEachApi) {
  BenchPrompt ids;
  ids.ids = {5, 6, 7};
  ids.prompt_len = 3;
  ids.output_len = 9;
  RequestSpec native;
  auto b = nlohmann::json::parse(request_body(native, ids, true));
  EXPECT_EQ(b["input_ids"], nlohmann::json({5, 6, 7}));
  EXPECT_FALSE(b.contains("text"));
  EXPECT_EQ(b["sampling_params"], nlohmann::json({{"temperature", 0.0}, {"max_new_tokens", 9}, {"ignore_eos", true}}));
  EXPECT_EQ(b["stream"], true);
  BenchPrompt text;
  text.text = "Question: 1+1?\nAnswer:";
  text.output_len = 4;
  RequestSpec oai;
  oai.api = Api::Completions;
  oai.model = "m";
  oai.ignore_eos = false;
  oai.stop = {"Question"};
  b = nlohmann::json::parse(request_body(oai, text, true));
  EXPECT_EQ(b["prompt"], text.text);
  EXPECT_EQ(b["max_tokens"], 4);
  EXPECT_EQ(b["model"], "m");
  EXPECT_EQ(b["stop"], nlohmann::json({"Question"}));
  EXPECT_FALSE(b.contains("ignore_eos"));  // not sent unless asked: OpenAI's API refuses it
  EXPECT_EQ(b["stream_options"]["include_usage"], true);
  EXPECT_EQ(std::string(api_path(Api::Completions)), "/v1/completions");
  EXPECT_EQ(api_for_backend("sglang"), Api::Native);
  EXPECT_EQ(api_for_backend("vllm"), Api::Completions);
  EXPECT_THROW(api_for_backend("trt"), Error);
}

TEST(BenchRequest, NativeStreamSpreadsItlOverTokensOfOneEvent) {
  StreamAccumulator acc(Api::Native);
  ASSERT_TRUE(acc.feed(R"({"text":"a","output_ids":[5],"meta_info":{"completion_tokens":1}})", 0.5));
  ASSERT_TRUE(acc.feed(R"({"text":"abc","output_ids":[5,6,7],"meta_info":{"completion_tokens":3}})", 0.9));
  ASSERT_TRUE(acc.feed(R"({"text":"abcd","output_ids":[8],"meta_info":{"completion_tokens":4}})", 1.0));
  ASSERT_TRUE(acc.feed("[DONE]", 1.0));
  RequestOutcome out;
  acc.finish(out, 1.1);
  EXPECT_TRUE(out.success);
  EXPECT_DOUBLE_EQ(out.ttft_s, 0.5);
  ASSERT_EQ(out.itl_s.size(), 3u);  // two tokens in the second event: two gaps of 0.2
  EXPECT_NEAR(out.itl_s[0], 0.2, 1e-12);
  EXPECT_NEAR(out.itl_s[1], 0.2, 1e-12);
  EXPECT_NEAR(out.itl_s[2], 0.1, 1e-12);
  EXPECT_EQ(out.output_len, 4);
  EXPECT_EQ(out.generated_text, "abcd");
  EXPECT_EQ(out.output_ids, (std::vector<int32_t>{5, 6, 7, 8}));  // cumulative, then incremental
  EXPECT_DOUBLE_EQ(out.latency_s, 1.1);
}

TEST(BenchRequest, CompletionsStreamUsesUsageAndStopsOnError) {
  StreamAccumulator acc(Api::Completions);
  ASSERT_TRUE(acc.feed(R"({"choices":[{"text":"Hi"}]})", 0.1));
  ASSERT_TRUE(acc.feed(R"({"choices":[{"text":""}]})", 0.2));  // no token: not an ITL
  ASSERT_TRUE(acc.feed(R"({"choices":[{"text":" there"}]})", 0.3));
  ASSERT_TRUE(acc.feed(R"({"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":3}})", 0.3));
  RequestOutcome out;
  acc.finish(out, 0.3);
  EXPECT_EQ(out.output_len, 3);  // the server's count wins over counted chunks
  EXPECT_EQ(out.itl_s.size(), 1u);
  EXPECT_EQ(out.generated_text, "Hi there");
  StreamAccumulator bad(Api::Completions);
  EXPECT_FALSE(bad.feed(R"({"error":{"message":"boom","type":"server_error"}})", 0.1));
  bad.finish(out, 0.1);
  EXPECT_FALSE(out.success);
  EXPECT_EQ(out.error, "boom");
}

TEST(BenchDriver, PoissonArrivalsHaveTheRateAsMeanAndFollowTheSeed) {
  const auto a = poisson_arrivals(20001, 50.0, 7);
  EXPECT_EQ(a[0], 0.0);
  double mean_gap = a.back() / 20000;
  EXPECT_NEAR(mean_gap, 1.0 / 50, 0.02 * (1.0 / 50));  // 20000 gaps: std of the mean is 0.7%
  double var = 0;
  for (size_t i = 1; i < a.size(); ++i) var += std::pow(a[i] - a[i - 1] - mean_gap, 2);
  EXPECT_NEAR(std::sqrt(var / 20000), 1.0 / 50, 0.05 * (1.0 / 50));  // exponential: std = mean
  EXPECT_EQ(poisson_arrivals(100, 50.0, 7), poisson_arrivals(100, 50.0, 7));
  EXPECT_NE(poisson_arrivals(100, 50.0, 7), poisson_arrivals(100, 50.0, 8));
  for (double t : poisson_arrivals(10, INFINITY, 7)) EXPECT_EQ(t, 0.0);
  EXPECT_THROW(poisson_arrivals(10, 0.0, 7), Error);
}

TEST(BenchDriver, ConcurrencyNeverExceedsTheLimitAndIsReached) {
  std::atomic<int> now{0}, peak{0};
  auto send = [&](int i) {
    const int n = ++now;
    for (int p = peak.load(); n > p && !peak.compare_exchange_weak(p, n);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    --now;
    RequestOutcome o;
    o.success = true;
    o.prompt_len = i;
    return o;
  };
  DriverRun run = drive_requests(40, send, {INFINITY, 5, 0, false, ""});
  EXPECT_EQ(peak.load(), 5);
  ASSERT_EQ(run.outcomes.size(), 40u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(run.outcomes[size_t(i)].prompt_len, i);  // kept in request order
  EXPECT_GE(run.duration_s, 8 * 0.020);  // 40 requests, 5 at a time, 20 ms each
}

TEST(BenchDataset, RandomLengthsInRangeAndSeeded) {
  RandomDatasetOptions o{200, 64, 16, 0.5, 3, 1024};
  const auto a = random_dataset(o, nullptr), b = random_dataset(o, nullptr);
  ASSERT_EQ(a.size(), 200u);
  bool varied = false;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i].prompt_len, 32);
    EXPECT_LE(a[i].prompt_len, 64);
    EXPECT_GE(a[i].output_len, 8);
    EXPECT_LE(a[i].output_len, 16);
    EXPECT_EQ(int(a[i].ids.size()), a[i].prompt_len);
    for (int32_t id : a[i].ids) ASSERT_TRUE(id >= 0 && id < 1024);
    EXPECT_EQ(a[i].ids, b[i].ids);
    varied = varied || a[i].prompt_len != a[0].prompt_len;
  }
  EXPECT_TRUE(varied);
  o.range_ratio = 1.0;
  for (const auto& p : random_dataset(o, nullptr)) EXPECT_TRUE(p.prompt_len == 64 && p.output_len == 16);
}

TEST(Gsm8k, AnswerExtractionTakesTheLastIntegerWithoutCommas) {
  EXPECT_EQ(extract_answer("Natalia sold 48/2 = 24 clips.\n#### 72"), 72);
  EXPECT_EQ(extract_answer("The total is 1,234,567 dollars."), 1234567);
  EXPECT_EQ(extract_answer("-5 degrees"), 5);  // \d+, as SGLang matches
  EXPECT_EQ(extract_answer("3.75"), 75);
  EXPECT_EQ(extract_answer("no digits here"), std::nullopt);
  EXPECT_EQ(extract_answer(""), std::nullopt);
}

TEST(Gsm8k, ScoresAgainstAStubAnswerList) {
  std::vector<Gsm8kItem> items;
  for (int i = 0; i < 5; ++i) {
    // append(), not "literal" + string: GCC 12 warns falsely (-Wrestrict) on the latter here.
    const std::string label = std::to_string(10 * i + 1);
    items.push_back({std::string("q").append(std::to_string(i)), std::string("work\n#### ").append(label)});
  }
  const std::vector<std::string> gens = {"so 1", "it is 11.", "22", "I do not know", "#### 41 then Question"};
  const Gsm8kScore s = score_gsm8k(items, gens);
  EXPECT_EQ(s.questions, 5);
  EXPECT_EQ(s.correct, 3);
  EXPECT_EQ(s.invalid, 1);
  EXPECT_DOUBLE_EQ(s.accuracy(), 0.6);
  EXPECT_DOUBLE_EQ(s.invalid_rate(), 0.2);
  EXPECT_EQ(gsm8k_few_shot(items, 2), "Question: q0\nAnswer: work\n#### 1\n\nQuestion: q1\nAnswer: work\n#### 11\n\n");
  EXPECT_THROW(gsm8k_few_shot(items, 6), Error);
}

TEST(BenchProgress, RendersFractionCountsAndRate) {
  EXPECT_EQ(ProgressBar::render("run", 16, 64, 2.0),
            "run:  25%|#######                       | 16/64 [00:02<00:06, 8.00it/s]");
  EXPECT_EQ(ProgressBar::render("", 0, 10, 0.0), "  0%|                              | 0/10 [00:00<?, 0.00it/s]");
}

}  // namespace
}  // namespace ms::bench
