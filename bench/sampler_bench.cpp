// Host sampling cost per row of a 151936-token vocabulary (Qwen3's), for the sampling parameters
// OpenAI clients send most (temperature 1, top_p 1 or 0.95; top_k 50 with min_p), and for a
// batch of 64 rows through sample_rows. Logits: N(0, sigma) rounded to 1/16 (ties), sigma 3
// (flat) and 8 (peaked). Prints one line per case; the token checksum pins the draws.
//   bench/sampler_bench.sh BUILD_DIR [SAMPLER_CPP]
#include <chrono>
#include <cstdio>
#include <random>

#include "runtime/sampler.h"

using namespace ms;

int main() {
  const int V = 151936, rows = 64;
  for (float sigma : {3.0f, 8.0f}) {
    std::mt19937 gen(1);
    std::normal_distribution<float> n(0.0f, sigma);
    std::vector<float> logits(size_t(V) * rows);
    for (float& x : logits) x = std::round(n(gen) * 16.0f) / 16.0f;
    struct Case { const char* name; float top_p; int top_k; float min_p; };
    for (Case c : {Case{"t=1", 1.0f, -1, 0.0f}, Case{"t=1 top_p=0.95", 0.95f, -1, 0.0f},
                   Case{"t=1 top_k=50 min_p=0.05", 1.0f, 50, 0.05f}}) {
      SamplingParams p;
      p.temperature = 1.0f, p.top_p = c.top_p, p.top_k = c.top_k, p.min_p = c.min_p;
      const auto t0 = std::chrono::steady_clock::now();
      long sum = 0;
      for (int r = 0; r < rows; ++r)
        sum += sample_token({std::span<const float>(logits.data() + size_t(r) * V, size_t(V)), &p, {}, {}, 7, uint64_t(r)}).token;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("sigma %.0f  %-24s %7.2f ms a row  (checksum %ld)\n", sigma, c.name, ms / rows, sum);
    }
    // The engine's path: 64 rows of one batch through sample_rows (rows in parallel where it can).
    std::vector<Request> reqs(rows);
    std::vector<const Request*> ptrs;
    for (int r = 0; r < rows; ++r) reqs[size_t(r)].sampling.temperature = 1.0f, reqs[size_t(r)].rng_seed = uint64_t(r), ptrs.push_back(&reqs[size_t(r)]);
    Tensor t = Tensor::empty(DType::F32, {rows, V});
    std::copy(logits.begin(), logits.end(), t.data<float>());
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<SampleResult> out = sample_rows(t, ptrs);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("sigma %.0f  sample_rows, 64 rows t=1     %7.2f ms a batch (first token %d)\n", sigma, ms, out[0].token);
  }
}
