// The numbers of SGLang's "Serving Benchmark Result" block, from per-request outcomes.
// Percentiles interpolate linearly between order statistics, as numpy's default does.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "request.h"

namespace ms::bench {

// Statistics of one sample; all zero for an empty sample.
struct Summary {
  double mean = 0, median = 0, std = 0, p95 = 0, p99 = 0, max = 0;
};
double percentile(std::vector<double> values, double p);  // p in [0, 100]
Summary summarize(const std::vector<double>& values);

struct ServingMetrics {
  int completed = 0, failed = 0;
  int64_t total_input = 0, total_output = 0;
  int64_t total_output_retokenized = -1;  // -1: no tokenizer to count with
  double duration_s = 0;
  double request_throughput = 0, input_throughput = 0, output_throughput = 0, total_throughput = 0;
  double concurrency = 0;  // mean requests in flight: sum of E2E latencies / duration
  Summary e2e_ms, ttft_ms, tpot_ms, itl_ms;
};

// Failed requests count in `failed` only; their tokens and latencies are left out.
ServingMetrics compute_metrics(const std::vector<RequestOutcome>& outcomes, double duration_s);

struct RunLabels {
  std::string backend;
  double request_rate = 0;  // inf: all at once
  int max_concurrency = 0;  // 0: not set
};

// SGLang's result lines: a title centred in a 50-wide rule ("===== title ====="), and
// "label" padded to 40 then the value.
std::string rule_line(const std::string& title, char fill);
std::string value_line(const std::string& label, const std::string& value);
std::string value_line(const std::string& label, double value);  // two decimals

// The block SGLang prints, line for line.
std::string format_result(const ServingMetrics& m, const RunLabels& labels);

// SGLang's result record (keys and units as its output file has them).
nlohmann::json metrics_json(const ServingMetrics& m);
// Per-request details: input_lens, output_lens, start_times, ttfts, e2e_latencies, itls, errors.
nlohmann::json details_json(const std::vector<RequestOutcome>& outcomes);

}  // namespace ms::bench
