// Drawing tokens on the GPU (cuda::sample_rows_into) against the CPU op (the host sampler's
// rule): the same token on at least 99.9% of rows of a 151936-token vocabulary (Qwen's), over
// flat rows (a random-weight model: every logit within a hair of the others), peaked rows,
// rows of bf16 logits full of ties, and -inf-masked rows, with temperature, top_k, top_p and
// min_p mixed. The two sum the weights differently (the GPU exactly in fixed point, the host in
// doubles), so a row may differ where u lands within rounding of a boundary: mismatches are
// reported, and must be rare. SamplingBench prints the µs of a call for 1 and 64 rows when
// MOESERVE_BENCH_SAMPLING=1.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"
#include "runtime/engine.h"

namespace ms {
namespace {
using namespace test;

constexpr int64_t kVocab = 151936;

// Row r's logits (F32, exact in bf16 when `bf16`), of one of four kinds.
void fill_row(float* x, int kind, std::mt19937& g, bool bf16) {
  if (kind == 0) {  // flat
    std::uniform_real_distribution<float> d(1.0f, 1.02f);
    for (int64_t i = 0; i < kVocab; ++i) x[i] = d(g);
  } else if (kind == 1) {  // peaked: a few clear leaders over a spread tail
    std::normal_distribution<float> d(0.f, 2.5f);
    for (int64_t i = 0; i < kVocab; ++i) x[i] = d(g);
    for (int j = 0; j < 4; ++j) x[g() % uint32_t(kVocab)] = 16.0f + 0.5f * float(j);
  } else if (kind == 2) {  // a model's usual spread
    std::normal_distribution<float> d(2.f, 1.5f);
    for (int64_t i = 0; i < kVocab; ++i) x[i] = d(g);
  } else {  // masked: most of the vocabulary -inf
    std::normal_distribution<float> d(0.f, 1.f);
    for (int64_t i = 0; i < kVocab; ++i) x[i] = g() % 4 == 0 ? d(g) : -INFINITY;
  }
  if (bf16)
    for (int64_t i = 0; i < kVocab; ++i) x[i] = round_bf16(x[i]);
}

ops::RowSampling mixed_params(int r, std::mt19937& g) {
  static const float kTemps[] = {0.5f, 1.0f, 1.5f, 0.7f};
  static const int kTopK[] = {0, 20, 0, 1, 0, 50, 0, 1000};
  static const float kTopP[] = {1.0f, 0.9f, 1.0f, 0.95f, 0.5f};
  static const float kMinP[] = {0.0f, 0.0f, 0.1f, 0.05f};
  ops::RowSampling p;
  p.temperature = kTemps[r % 4];
  p.top_k = kTopK[(r / 4) % 8];
  p.top_p = kTopP[(r / 3) % 5];
  p.min_p = kMinP[(r / 7) % 4];
  if (r % 50 == 49) p.temperature = 0.0f;  // greedy rows in the batch
  p.seed = g(), p.step = uint64_t(r) * 13 + 1;
  return p;
}

TEST(CudaSampling, MatchesTheCpuOpOnMixedRows) {
  MS_REQUIRE_CUDA();
  std::mt19937 g(2024);
  int rows_total = 0, mismatches = 0;
  for (bool bf16 : {false, true}) {
    const int64_t rows = 640;
    Tensor host = Tensor::empty(DType::F32, {rows, kVocab});
    std::vector<ops::RowSampling> params;
    for (int64_t r = 0; r < rows; ++r) {
      fill_row(host.data<float>() + r * kVocab, int(r % 4), g, bf16);
      params.push_back(mixed_params(int(r), g));
    }
    Tensor want = Tensor::empty(DType::I32, {rows});
    cpu::sample_rows_into(host, params, want);
    Tensor ids = poisoned(DType::I32, {rows});
    cuda::sample_rows_into(gpu(host, bf16 ? DType::BF16 : DType::F32), params, ids);
    const Tensor got = ids.to(Device::CPU);
    for (int64_t r = 0; r < rows; ++r) {
      ++rows_total;
      const int32_t a = got.data<int32_t>()[r], b = want.data<int32_t>()[r];
      if (a == b) continue;
      ++mismatches;
      const ops::RowSampling& p = params[size_t(r)];
      std::printf("[sampling] mismatch: %s row %lld kind %lld T %g top_k %d top_p %g min_p %g: gpu %d (logit %g), "
                  "cpu %d (logit %g)\n",
                  bf16 ? "bf16" : "f32", (long long)r, (long long)(r % 4), p.temperature, p.top_k, p.top_p, p.min_p,
                  a, a >= 0 && a < kVocab ? host.data<float>()[r * kVocab + a] : NAN, b,
                  host.data<float>()[r * kVocab + b]);
    }
  }
  std::printf("[sampling] %d of %d rows differ\n", mismatches, rows_total);
  EXPECT_LE(mismatches * 1000, rows_total) << "at least 99.9% of rows the same token";
}

// Edge rows: all logits equal (one tie group of the whole vocabulary), a small vocabulary,
// top_k at and past the vocabulary, top_p small enough to keep only the best.
TEST(CudaSampling, EdgeRows) {
  MS_REQUIRE_CUDA();
  std::mt19937 g(7);
  for (int64_t V : {int64_t(1), int64_t(5), int64_t(3000), kVocab}) {
    const int64_t rows = 24;
    Tensor host = Tensor::empty(DType::F32, {rows, V});
    std::vector<ops::RowSampling> params;
    for (int64_t r = 0; r < rows; ++r) {
      float* x = host.data<float>() + r * V;
      std::normal_distribution<float> d(0.f, 1.f);
      for (int64_t i = 0; i < V; ++i) x[i] = r % 3 == 0 ? 0.5f : d(g);
      ops::RowSampling p{1.0f, -1, 1.0f, 0.0f, g(), uint64_t(r)};
      if (r % 4 == 1) p.top_k = int32_t(V);
      if (r % 4 == 2) p.top_k = int32_t(V) + 5;
      if (r % 6 == 3) p.top_p = 1e-6f;
      if (r % 6 == 5) p.min_p = 1.0f;
      params.push_back(p);
    }
    Tensor want = Tensor::empty(DType::I32, {rows});
    cpu::sample_rows_into(host, params, want);
    Tensor ids = poisoned(DType::I32, {rows});
    cuda::sample_rows_into(gpu(host, DType::F32), params, ids);
    const Tensor got = ids.to(Device::CPU);
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got.data<int32_t>()[r], want.data<int32_t>()[r]) << "V " << V << " row " << r;
  }
}

// The engine on the GPU: sampled requests drawn on the device with overlap (the token of index
// output_ids + pending_ids) are the ones the engine without overlap draws (sample_rows, also on
// the device). One request at a time, so both run the same batches and see the same logits.
TEST(CudaSampling, EngineOverlapDrawsTheSynchronousTokens) {
  MS_REQUIRE_CUDA();
  LoadOptions lo;
  lo.device = Device::CUDA;
  lo.act_dtype = DType::BF16;
  const std::unique_ptr<CausalLM> model = load_model(fixture_dir("qwen3-moe-tiny"), lo);
  EngineOptions o;
  o.max_total_tokens = 2048;
  o.scheduler.max_running_requests = 8;
  o.cuda_graph.max_bs = 8;
  EngineOptions sync_o = o;
  sync_o.disable_overlap_schedule = true;
  Engine overlap(*model, o), sync(*model, sync_o);
  for (int i = 0; i < 4; ++i) {
    GenerateRequest g;
    for (int t = 0; t < 6 + 3 * i; ++t) g.input_ids.push_back(int32_t((t * 37 + i * 11) % 900 + 5));
    g.sampling.max_new_tokens = 16;
    g.sampling.ignore_eos = true;
    g.sampling.temperature = i == 1 ? 0.7f : 1.0f;
    g.sampling.seed = uint64_t(1000 + i);
    if (i == 2) g.sampling.top_k = 20, g.sampling.top_p = 0.9f;
    if (i == 3) g.sampling.min_p = 0.05f;
    const std::vector<int32_t> want = sync.generate({g})[0].output_ids;
    EXPECT_EQ(overlap.generate({g})[0].output_ids, want) << "request " << i;
  }
  EXPECT_GT(overlap.stats().overlapped_steps, 0);
  EXPECT_EQ(sync.stats().overlapped_steps, 0);
}

// Opt-in timing: µs a call for 1 and 64 rows of 151936 logits (bf16, a model's spread), the
// default parameters (temperature 1, nothing else) and top_k 50 + top_p 0.9.
TEST(CudaSampling, SamplingBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_SAMPLING");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_SAMPLING=1 to time sampling";
  std::mt19937 g(3);
  for (int64_t rows : {1, 64})
    for (int variant = 0; variant < 3; ++variant) {
      Tensor host = Tensor::empty(DType::F32, {rows, kVocab});
      std::vector<ops::RowSampling> params;
      for (int64_t r = 0; r < rows; ++r) {
        fill_row(host.data<float>() + r * kVocab, variant == 2 ? 0 : 2, g, true);
        ops::RowSampling p{1.0f, -1, 1.0f, 0.0f, g(), uint64_t(r)};
        if (variant == 1) p.top_k = 50, p.top_p = 0.9f;
        params.push_back(p);
      }
      const Tensor logits = gpu(host, DType::BF16);
      Tensor ids = poisoned(DType::I32, {rows});
      for (int i = 0; i < 3; ++i) cuda::sample_rows_into(logits, params, ids);  // warm-up
      cudaEvent_t start, stop;
      cudaEventCreate(&start), cudaEventCreate(&stop);
      const int kCalls = 50;
      cudaEventRecord(start, cuda::stream());
      for (int i = 0; i < kCalls; ++i) cuda::sample_rows_into(logits, params, ids);
      cudaEventRecord(stop, cuda::stream());
      cudaEventSynchronize(stop);
      float ms = 0.f;
      cudaEventElapsedTime(&ms, start, stop);
      cudaEventDestroy(start), cudaEventDestroy(stop);
      Tensor argmax = poisoned(DType::I32, {rows});
      cudaEventCreate(&start), cudaEventCreate(&stop);
      cudaEventRecord(start, cuda::stream());
      for (int i = 0; i < kCalls; ++i) cuda::argmax_rows_into(logits, argmax);
      cudaEventRecord(stop, cuda::stream());
      cudaEventSynchronize(stop);
      float argmax_ms = 0.f;
      cudaEventElapsedTime(&argmax_ms, start, stop);
      cudaEventDestroy(start), cudaEventDestroy(stop);
      static const char* kNames[] = {"temperature 1", "top_k 50 top_p 0.9", "temperature 1, flat rows"};
      std::printf("[bench] sample_rows %lld x %lld bf16, %s: %.1f us a call (argmax_rows %.1f us)\n",
                  (long long)rows, (long long)kVocab, kNames[variant], 1000.0 * ms / kCalls,
                  1000.0 * argmax_ms / kCalls);
    }
}

}  // namespace
}  // namespace ms
