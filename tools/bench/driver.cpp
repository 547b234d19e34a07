#include "driver.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "core/check.h"
#include "progress.h"

namespace ms::bench {

std::vector<double> poisson_arrivals(int n, double rate, uint64_t seed) {
  MS_CHECK(rate > 0, "--request-rate ", rate, " must be positive (inf: send all at once)");
  std::vector<double> at(static_cast<size_t>(std::max(n, 0)), 0.0);
  if (std::isinf(rate)) return at;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  for (size_t i = 1; i < at.size(); ++i) at[i] = at[i - 1] + gap(rng);
  return at;
}

DriverRun drive_requests(int n, const std::function<RequestOutcome(int)>& send, const DriverOptions& o) {
  MS_CHECK(o.max_concurrency >= 0, "--max-concurrency ", o.max_concurrency, " must be positive");
  const std::vector<double> arrivals = poisson_arrivals(n, o.request_rate, o.seed);
  DriverRun run;
  run.outcomes.resize(static_cast<size_t>(n));
  // Workers take requests in order, so request i starts at its arrival or when a worker frees
  // up, whichever is later: a FIFO semaphore of max_concurrency slots.
  const int workers = o.max_concurrency > 0 ? std::min(o.max_concurrency, n) : n;
  std::atomic<int> next{0};
  ProgressBar bar(o.progress_desc, n, o.progress);
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  auto work = [&] {
    for (int i; (i = next.fetch_add(1)) < n;) {
      std::this_thread::sleep_until(start + std::chrono::duration_cast<clock::duration>(
                                                std::chrono::duration<double>(arrivals[size_t(i)])));
      const double sent = std::chrono::duration<double>(clock::now() - start).count();
      RequestOutcome out;
      try {
        out = send(i);
      } catch (const std::exception& e) {  // one bad request must not end the run
        out.success = false;
        out.error = e.what();
      }
      out.start_s = sent;
      run.outcomes[size_t(i)] = std::move(out);
      bar.advance();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(size_t(workers));
  for (int w = 0; w < workers; ++w) threads.emplace_back(work);
  for (auto& t : threads) t.join();
  run.duration_s = std::chrono::duration<double>(clock::now() - start).count();
  return run;
}

}  // namespace ms::bench
