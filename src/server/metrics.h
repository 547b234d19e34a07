// Prometheus text metrics (exposition format 0.0.4), with SGLang's metric names under the
// `moeserve:` prefix: request counts, token counters, TTFT / inter-token / end-to-end latency
// histograms, generation throughput, and the engine's gauges read at scrape time.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace ms::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value, uint64_t times = 1);
  void render(const std::string& name, const std::string& help, const std::string& labels, std::string& out) const;
  uint64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative
  uint64_t count_ = 0;
  double sum_ = 0;
};

class Metrics {
 public:
  using Clock = std::chrono::steady_clock;
  Metrics();
  void request_received();
  void first_token(double ttft_s);
  void tokens_arrived(double since_previous_s, int count);  // inter-token latency per token
  void request_finished(double e2e_s, int prompt_tokens, int completion_tokens, int cached_tokens, bool aborted);
  void client_error();  // a request refused with a 4xx

  // Generated tokens per second over the last kWindow seconds.
  double generation_throughput() const;
  std::string render(const EngineStats& engine, const std::string& model_name) const;

 private:
  static constexpr int kWindow = 10;
  void count_generated(int n);  // into the per-second ring, under mu_
  mutable std::mutex mu_;
  Clock::time_point start_ = Clock::now();
  uint64_t received_ = 0, finished_ = 0, aborted_ = 0, client_errors_ = 0;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0, cached_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
  mutable std::deque<std::pair<int64_t, uint64_t>> per_second_;  // (second since start, tokens)
};

}  // namespace ms::server
