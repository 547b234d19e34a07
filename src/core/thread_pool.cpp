#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace ms {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("MOESERVE_THREADS")) return std::max(1, std::atoi(env));
    return int(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int64_t chunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(size()) * 4);
  if (chunks <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::lock_guard call(call_mu_);
  std::unique_lock lock(mu_);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n + chunks - 1) / chunks;
  next_ = 0;
  pending_ = int(workers_.size()) + 1;
  error_ = nullptr;
  ++generation_;
  lock.unlock();
  work_cv_.notify_all();
  // The caller takes chunks too, then waits for the workers.
  for (;;) {
    lock.lock();
    int64_t begin = next_;
    next_ += chunk_;
    lock.unlock();
    if (begin >= n) break;
    try {
      fn(begin, std::min(n, begin + chunk_));
    } catch (...) {
      std::lock_guard g(mu_);
      if (!error_) error_ = std::current_exception();
    }
  }
  lock.lock();
  --pending_;
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    while (next_ < n_) {
      int64_t begin = next_;
      next_ += chunk_;
      lock.unlock();
      try {
        (*fn_)(begin, std::min(n_, begin + chunk_));
      } catch (...) {
        std::lock_guard g(mu_);
        if (!error_) error_ = std::current_exception();
      }
      lock.lock();
    }
    if (--pending_ == 0) done_cv_.notify_all();
  }
}

}  // namespace ms
