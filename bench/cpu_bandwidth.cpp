// Read bandwidth of host memory with every core streaming its share of a large buffer: the
// ceiling a weight-bound CPU decode step can reach. Build: g++ -O3 -march=native -pthread.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  const size_t bytes = size_t(argc > 1 ? std::atof(argv[1]) : 2.0) << 30;
  const int threads = int(std::thread::hardware_concurrency());
  std::vector<float> buf(bytes / 4, 1.0f);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    std::vector<double> sums(static_cast<size_t>(threads));
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        size_t n = buf.size() / threads, b = t * n;
        float acc[16] = {};
        for (size_t i = b; i + 16 <= b + n; i += 16)
          for (int k = 0; k < 16; ++k) acc[k] += buf[i + k];
        for (float a : acc) sums[t] += a;
      });
    for (auto& p : pool) p.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(bytes) / s / 1e9);
    if (sums[0] < 0) std::printf("impossible\n");
  }
  std::printf("read bandwidth: %.1f GB/s (%d threads, %zu MB, best of 5)\n", best, threads, bytes >> 20);
}
