#include "metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "core/check.h"

namespace ms::bench {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(rank)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (rank - double(lo));
}

Summary summarize(const std::vector<double>& v) {
  Summary s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
  double sq = 0;
  for (double x : v) sq += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(sq / double(v.size()));
  s.median = percentile(v, 50);
  s.p95 = percentile(v, 95);
  s.p99 = percentile(v, 99);
  s.max = *std::max_element(v.begin(), v.end());
  return s;
}

namespace {
std::vector<double> to_ms(std::vector<double> v) {
  for (double& x : v) x *= 1000.0;
  return v;
}
}  // namespace

ServingMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double duration_s) {
  ServingMetrics m;
  m.duration_s = duration_s;
  std::vector<double> e2e, ttft, tpot, itl;
  for (const RequestOutcome& o : outcomes) {
    if (!o.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input += o.prompt_len;
    m.total_output += o.output_len;
    e2e.push_back(o.latency_s);
    ttft.push_back(o.ttft_s);
    if (o.output_len > 1) tpot.push_back((o.latency_s - o.ttft_s) / (o.output_len - 1));
    itl.insert(itl.end(), o.itl_s.begin(), o.itl_s.end());
  }
  const double d = duration_s > 0 ? duration_s : std::numeric_limits<double>::infinity();
  m.request_throughput = m.completed / d;
  m.input_throughput = double(m.total_input) / d;
  m.output_throughput = double(m.total_output) / d;
  m.total_throughput = double(m.total_input + m.total_output) / d;
  m.concurrency = std::accumulate(e2e.begin(), e2e.end(), 0.0) / d;
  m.e2e_ms = summarize(to_ms(e2e));
  m.ttft_ms = summarize(to_ms(ttft));
  m.tpot_ms = summarize(to_ms(tpot));
  m.itl_ms = summarize(to_ms(itl));
  return m;
}

std::string rule_line(const std::string& title, char fill) {
  const size_t pad = title.size() < 50 ? 50 - title.size() : 0;
  return std::string(pad / 2, fill) + title + std::string(pad - pad / 2, fill) + "\n";
}

std::string value_line(const std::string& label, const std::string& value) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%-40s %-10s\n", label.c_str(), value.c_str());
  return buf;
}

std::string value_line(const std::string& label, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", value);
  return value_line(label, std::string(buf));
}

namespace {
struct Block {
  std::string out;
  void rule(const char* title, char c) { out += rule_line(title, c); }
  void line(const char* label, const std::string& value) { out += value_line(label, value); }
  void num(const char* label, double v) { out += value_line(label, v); }
  void count(const char* label, int64_t v) { line(label, std::to_string(v)); }
};
}  // namespace

std::string format_result(const ServingMetrics& m, const RunLabels& labels) {
  Block b;
  b.rule(" Serving Benchmark Result ", '=');
  b.line("Backend:", labels.backend);
  b.line("Traffic request rate:", std::isinf(labels.request_rate) ? "inf" : fmt(labels.request_rate));
  b.line("Max request concurrency:", labels.max_concurrency > 0 ? std::to_string(labels.max_concurrency) : "not set");
  b.count("Successful requests:", m.completed);
  if (m.failed > 0) b.count("Failed requests:", m.failed);
  b.num("Benchmark duration (s):", m.duration_s);
  b.count("Total input tokens:", m.total_input);
  b.count("Total generated tokens:", m.total_output);
  if (m.total_output_retokenized >= 0) b.count("Total generated tokens (retokenized):", m.total_output_retokenized);
  b.num("Request throughput (req/s):", m.request_throughput);
  b.num("Input token throughput (tok/s):", m.input_throughput);
  b.num("Output token throughput (tok/s):", m.output_throughput);
  b.num("Total token throughput (tok/s):", m.total_throughput);
  b.num("Concurrency:", m.concurrency);
  b.rule("End-to-End Latency", '-');
  b.num("Mean E2E Latency (ms):", m.e2e_ms.mean);
  b.num("Median E2E Latency (ms):", m.e2e_ms.median);
  b.num("P99 E2E Latency (ms):", m.e2e_ms.p99);
  b.rule("Time to First Token", '-');
  b.num("Mean TTFT (ms):", m.ttft_ms.mean);
  b.num("Median TTFT (ms):", m.ttft_ms.median);
  b.num("P99 TTFT (ms):", m.ttft_ms.p99);
  b.rule("Inter-Token Latency", '-');
  b.num("Mean ITL (ms):", m.itl_ms.mean);
  b.num("Median ITL (ms):", m.itl_ms.median);
  b.num("P95 ITL (ms):", m.itl_ms.p95);
  b.num("P99 ITL (ms):", m.itl_ms.p99);
  b.num("Max ITL (ms):", m.itl_ms.max);
  b.out += std::string(50, '=') + "\n";
  return b.out;
}

nlohmann::json metrics_json(const ServingMetrics& m) {
  nlohmann::json j = {
      {"duration", m.duration_s},
      {"completed", m.completed},
      {"failed", m.failed},
      {"total_input_tokens", m.total_input},
      {"total_output_tokens", m.total_output},
      {"request_throughput", m.request_throughput},
      {"input_throughput", m.input_throughput},
      {"output_throughput", m.output_throughput},
      {"total_throughput", m.total_throughput},
      {"concurrency", m.concurrency},
  };
  if (m.total_output_retokenized >= 0) j["total_output_tokens_retokenized"] = m.total_output_retokenized;
  auto put = [&j](const std::string& name, const Summary& s, bool tails) {
    j["mean_" + name + "_ms"] = s.mean;
    j["median_" + name + "_ms"] = s.median;
    j["std_" + name + "_ms"] = s.std;
    j["p99_" + name + "_ms"] = s.p99;
    if (tails) j["p95_" + name + "_ms"] = s.p95, j["max_" + name + "_ms"] = s.max;
  };
  put("e2e_latency", m.e2e_ms, false);
  put("ttft", m.ttft_ms, false);
  put("tpot", m.tpot_ms, false);
  put("itl", m.itl_ms, true);
  return j;
}

nlohmann::json details_json(const std::vector<RequestOutcome>& outcomes) {
  nlohmann::json d = {{"input_lens", nlohmann::json::array()},   {"output_lens", nlohmann::json::array()},
                      {"start_times", nlohmann::json::array()},  {"ttfts", nlohmann::json::array()},
                      {"e2e_latencies", nlohmann::json::array()}, {"itls", nlohmann::json::array()},
                      {"errors", nlohmann::json::array()}};
  for (const RequestOutcome& o : outcomes) {
    d["input_lens"].push_back(o.prompt_len);
    d["output_lens"].push_back(o.success ? o.output_len : 0);
    d["start_times"].push_back(o.start_s);
    d["ttfts"].push_back(o.ttft_s);
    d["e2e_latencies"].push_back(o.latency_s);
    d["itls"].push_back(o.itl_s);
    d["errors"].push_back(o.error);
  }
  return d;
}

}  // namespace ms::bench
