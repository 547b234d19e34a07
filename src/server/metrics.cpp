#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace ms::server {
namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void gauge(std::string& out, const std::string& name, const std::string& help, const std::string& labels, double v,
           const char* type = "gauge") {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  out += name + "{" + labels + "} " + num(v) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value, uint64_t times) {
  const size_t b = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  counts_[b] += times;
  count_ += times;
  sum_ += value * double(times);
}

void Histogram::render(const std::string& name, const std::string& help, const std::string& labels,
                       std::string& out) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum{" + labels + "} " + num(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

// SGLang's bucket bounds for the three latency histograms.
Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 15, 20, 25, 30}),
      itl_({0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4,
            0.6, 0.8, 1, 2, 4, 6, 8}),
      e2e_({0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 350, 500, 1000}) {}

void Metrics::request_received() {
  std::lock_guard lk(mu_);
  ++received_;
}

void Metrics::first_token(double ttft_s) {
  std::lock_guard lk(mu_);
  ttft_.observe(ttft_s);
  count_generated(1);
}

void Metrics::tokens_arrived(double since_previous_s, int count) {
  if (count <= 0) return;
  std::lock_guard lk(mu_);
  itl_.observe(since_previous_s / count, uint64_t(count));
  count_generated(count);
}

void Metrics::count_generated(int n) {
  const int64_t sec = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_).count();
  if (per_second_.empty() || per_second_.back().first != sec) per_second_.emplace_back(sec, 0);
  per_second_.back().second += uint64_t(n);
  while (per_second_.size() > kWindow + 1) per_second_.pop_front();
}

void Metrics::request_finished(double e2e_s, int prompt_tokens, int completion_tokens, int cached_tokens, bool aborted) {
  std::lock_guard lk(mu_);
  ++finished_;
  if (aborted) ++aborted_;
  e2e_.observe(e2e_s);
  prompt_tokens_ += uint64_t(prompt_tokens);
  generation_tokens_ += uint64_t(completion_tokens);
  cached_tokens_ += uint64_t(cached_tokens);
}

void Metrics::client_error() {
  std::lock_guard lk(mu_);
  ++client_errors_;
}

double Metrics::generation_throughput() const {
  std::lock_guard lk(mu_);
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - start_).count();
  uint64_t tokens = 0;
  for (auto [sec, n] : per_second_)  // the current second is partial: the window is the kWindow before it
    if (sec < now && sec >= now - kWindow) tokens += n;
  return double(tokens) / double(std::clamp<int64_t>(now, 1, kWindow));
}

std::string Metrics::render(const EngineStats& s, const std::string& model_name) const {
  const double throughput = generation_throughput();
  const std::string l = "model_name=\"" + model_name + "\"";
  std::string out;
  const int64_t request_slots = s.pool_used - s.cached_slots;
  const double cap = double(std::max<int64_t>(s.pool_capacity, 1));
  const auto& sc = s.scheduler;
  const double looked_up = double(sc.extend_tokens + sc.cached_tokens);
  gauge(out, "moeserve:num_running_reqs", "Requests in the running batch.", l, s.running);
  gauge(out, "moeserve:num_queue_reqs", "Requests waiting to be scheduled.", l, s.waiting);
  gauge(out, "moeserve:num_used_tokens", "KV slots held by requests (not the evictable cache).", l, double(request_slots));
  gauge(out, "moeserve:token_usage", "Share of the KV pool held by requests.", l, double(request_slots) / cap);
  gauge(out, "moeserve:cached_tokens", "KV slots held by the radix cache.", l, double(s.cached_slots));
  gauge(out, "moeserve:max_total_num_tokens", "KV pool capacity in tokens.", l, double(s.pool_capacity));
  gauge(out, "moeserve:cache_hit_rate", "Prompt tokens served from the radix cache / prompt tokens scheduled.", l,
        looked_up > 0 ? double(sc.cached_tokens) / looked_up : 0.0);
  gauge(out, "moeserve:gen_throughput", "Generated tokens per second over the last 10 s.", l, throughput);
  if (s.speculative) {
    gauge(out, "moeserve:spec_accept_length", "Tokens a request gains per verify forward (mean; 1 = no gain).", l,
          s.spec.mean_accept_length());
    gauge(out, "moeserve:spec_acceptance_rate", "Accepted draft tokens / drafted tokens.", l, s.spec.acceptance_rate());
    gauge(out, "moeserve:spec_draft_overhead", "Share of model time spent in the draft model.", l,
          s.spec.draft_overhead());
    gauge(out, "moeserve:spec_verify_forwards_total", "Target forwards that verified drafts.", l,
          double(s.spec.verify_forwards), "counter");
  }
  std::lock_guard lk(mu_);
  gauge(out, "moeserve:num_requests_total", "Requests received.", l, double(received_), "counter");
  gauge(out, "moeserve:num_finished_requests_total", "Requests finished (any reason).", l, double(finished_), "counter");
  gauge(out, "moeserve:num_aborted_requests_total", "Requests aborted.", l, double(aborted_), "counter");
  gauge(out, "moeserve:num_client_errors_total", "Requests refused with a 4xx.", l, double(client_errors_), "counter");
  gauge(out, "moeserve:prompt_tokens_total", "Prompt tokens of finished requests.", l, double(prompt_tokens_), "counter");
  gauge(out, "moeserve:generation_tokens_total", "Generated tokens of finished requests.", l,
        double(generation_tokens_), "counter");
  gauge(out, "moeserve:cached_tokens_total", "Prompt tokens reused from the cache.", l, double(cached_tokens_), "counter");
  ttft_.render("moeserve:time_to_first_token_seconds", "Time to first token.", l, out);
  itl_.render("moeserve:inter_token_latency_seconds", "Time between generated tokens.", l, out);
  e2e_.render("moeserve:e2e_request_latency_seconds", "End-to-end request latency.", l, out);
  return out;
}

}  // namespace ms::server
