// Sends a list of requests the way SGLang's bench_serving does: request i is released at its
// Poisson arrival time (exponential gaps of mean 1 / rate; all at once for rate inf) and then
// waits for one of max_concurrency slots, so at most that many are ever in flight.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "request.h"

namespace ms::bench {

// Arrival times in seconds from the start: 0 first, then exponential gaps with mean 1 / rate
// drawn from a generator seeded with `seed`; all zero when the rate is infinite.
std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed);

struct DriverOptions {
  double request_rate = 0;  // requests per second; inf: no pacing
  int max_concurrency = 0;  // 0: unlimited
  uint64_t seed = 0;
  bool progress = true;
  const char* progress_desc = "";
};

struct DriverRun {
  std::vector<RequestOutcome> outcomes;  // in request order; start_s set from the run's start
  double duration_s = 0;
};

// Calls send(i) for i in [0, n) from worker threads, paced and limited as above.
DriverRun drive_requests(int n, const std::function<RequestOutcome(int)>& send, const DriverOptions& options);

}  // namespace ms::bench
