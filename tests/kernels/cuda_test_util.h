// Helpers for the CUDA-vs-CPU tests: a skip when no GPU is present, random inputs whose values
// are exact in bf16 (so both backends see the same numbers), device copies, and poisoned
// outputs (all bits set: NaN in bf16 and f32) so an unwritten element fails the comparison.
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>
#include <random>

#include "kernels/cuda/cuda_common.h"  // stream(): the timing helpers
#include "kernels/cuda/cuda_ops.h"
#include "kernels/ops.h"
#include "test_support.h"

namespace ms::test {

inline bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define MS_REQUIRE_CUDA()                                         \
  do {                                                            \
    if (!::ms::test::cuda_available()) GTEST_SKIP() << "no CUDA device"; \
    ::ms::ops::init_backend(::ms::Device::CUDA);                  \
  } while (0)

inline std::mt19937& rng() {
  static std::mt19937 g(1234);
  return g;
}

// Uniform values of standard deviation `std`, each rounded to bf16, handed to put(i, v) in
// order: a 64-bit xorshift seeded by `seed`, as the weight tests run to a billion values, too
// many for the normal distribution's generator.
template <class Put>
void xorshift_uniform(int64_t n, float std, uint64_t seed, Put put) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  const float a = std * std::sqrt(3.0f) / float(1u << 31);
  for (int64_t i = 0; i < n; ++i) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    put(i, round_bf16(float(int32_t(uint32_t(s >> 32))) * a));
  }
}

// F32 host tensor of normal values times `scale`, rounded to bf16.
inline Tensor randn(Shape shape, float scale = 1.0f) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  std::normal_distribution<float> d(0.f, scale);
  for (auto& v : t.span<float>()) v = round_bf16(d(rng()));
  return t;
}

// Host copy of an F32 host tensor in `dtype` (BF16 or F32).
inline Tensor host_as(const Tensor& f32, DType dtype) {
  if (dtype == DType::F32) return f32.clone();
  Tensor out = Tensor::empty(DType::BF16, f32.shape());
  for (int64_t i = 0; i < f32.numel(); ++i) out.data<uint16_t>()[i] = f32_to_bf16(f32.data<float>()[i]);
  return out;
}

inline Tensor gpu(const Tensor& f32, DType dtype = DType::BF16) { return host_as(f32, dtype).to(Device::CUDA); }

inline Tensor poisoned(DType dtype, Shape shape) {
  Tensor host = Tensor::empty(dtype, std::move(shape));
  std::memset(host.raw(), 0xff, host.nbytes());
  return host.to(Device::CUDA);
}

// Elements of a and b (same dtype and size, either device) whose bits differ.
inline int64_t bit_mismatches(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  const size_t es = dtype_size(a.dtype());
  int64_t n = 0;
  for (int64_t i = 0; i < ha.numel(); ++i)
    n += std::memcmp(static_cast<const char*>(ha.raw()) + es * i, static_cast<const char*>(hb.raw()) + es * i, es) != 0;
  return n;
}

// Columns [c0, c0 + w) of a 2-D device tensor, as a contiguous F32 host copy.
inline Tensor host_block(const Tensor& dev, int64_t c0, int64_t w) {
  Tensor h = dev.to_f32();
  return h.slice(1, c0, c0 + w).clone();
}

// Random FP8 weight [n, k] (no NaN codes) with block scales; both devices.
struct Fp8Weight {
  ops::Weight cpu, gpu;
};
inline Fp8Weight random_fp8(int64_t n, int64_t k, float scale = 0.002f) {
  Tensor w = Tensor::empty(DType::F8_E4M3, {n, k});
  std::uniform_int_distribution<int> code(0, 125);
  std::uniform_int_distribution<int> sign(0, 1);
  for (auto& b : w.span<uint8_t>()) b = uint8_t(code(rng()) | (sign(rng()) << 7));
  Tensor s = Tensor::empty(DType::F32, {(n + 127) / 128, (k + 127) / 128});
  std::uniform_real_distribution<float> sd(0.5f * scale, 1.5f * scale);
  for (auto& v : s.span<float>()) v = sd(rng());
  Fp8Weight out;
  out.cpu.w = w, out.cpu.scale_inv = s;
  out.gpu.w = w.to(Device::CUDA), out.gpu.scale_inv = s.to(Device::CUDA);
  return out;
}

// Sequences of (queries, keys); every key gets a distinct random slot of a pool of `pool`
// (or, unshuffled, the slots in order: each sequence's keys contiguous).
inline ops::AttentionLayout make_layout(const std::vector<std::pair<int, int>>& seqs, int pool, bool shuffle = true) {
  ops::AttentionLayout l;
  l.q_start = {0}, l.kv_start = {0};
  std::vector<int32_t> slots(static_cast<size_t>(pool));
  std::iota(slots.begin(), slots.end(), 0);
  if (shuffle) std::shuffle(slots.begin(), slots.end(), rng());
  size_t next = 0;
  for (auto [nq, nk] : seqs) {
    for (int i = 0; i < nk; ++i) l.kv_slots.push_back(slots.at(next++));
    l.q_start.push_back(l.q_start.back() + nq);
    l.kv_start.push_back(l.kv_start.back() + nk);
  }
  return l;
}

// The sum of count(node) over the nodes of what `body` launches, captured (not run).
template <class F, class C>
int count_captured(F body, C count) {
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  body();
  EXPECT_EQ(cudaStreamEndCapture(cuda::stream(), &graph), cudaSuccess);
  size_t n = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &n), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(n);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &n), cudaSuccess);
  int total = 0;
  for (cudaGraphNode_t node : nodes) total += count(node);
  cudaGraphDestroy(graph);
  return total;
}

// Kernel nodes of what `body` launches, captured (not run).
template <class F>
int kernel_nodes(F body) {
  return count_captured(body, [](cudaGraphNode_t node) {
    cudaGraphNodeType type;
    EXPECT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    return int(type == cudaGraphNodeTypeKernel);
  });
}

// ---- timing (the opt-in benches) ----

// Mean milliseconds of one of `reps` back-to-back runs of `call` on the calling thread's stream,
// timed by CUDA events after `warm` untimed runs (first launches pay for shared-memory limits,
// module loads and allocator pools).
template <class F>
double stream_ms(F&& call, int reps, int warm = 1) {
  for (int i = 0; i < warm; ++i) call();
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  cudaEventRecord(start, cuda::stream());
  for (int i = 0; i < reps; ++i) call();
  cudaEventRecord(stop, cuda::stream());
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start), cudaEventDestroy(stop);
  return ms / reps;
}
// Microseconds a call, one warm-up run.
template <class F>
double time_us(int iters, F&& call) {
  return 1000.0 * stream_ms(call, iters);
}
// Milliseconds a call, two warm-up runs.
template <class F>
double time_ms(F call, int reps) {
  return stream_ms(call, reps, 2);
}

// What capture_step needs to stage for a decode of T tokens of one key each (all zeros: the ops
// timed or replayed here do not read positions or slots).
struct StepShape {
  std::vector<int32_t> zeros;
  ops::AttentionLayout layout;
  explicit StepShape(int64_t T)
      : zeros(size_t(T), 0), layout(make_layout(std::vector<std::pair<int, int>>(size_t(T), {1, 1}), int(T))) {}
  ops::StepArrays arrays() const { return ops::StepArrays{zeros, zeros, zeros, &layout}; }
};

// Microseconds a call takes, replayed from graphs of per_graph calls (as a decode step replays
// one per layer); the first call runs eagerly, outside the capture.
template <class F>
double graphed_us(int64_t T, F call, int per_graph = 20, int replays = 50) {
  auto body = [&] {
    for (int i = 0; i < per_graph; ++i) call();
  };
  body();
  const StepShape step(T);
  auto pool = ops::make_graph_pool(Device::CUDA);
  auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool, body);
  return 1000.0 * stream_ms([&] { graph->replay(step.arrays()); }, replays, 5) / per_graph;
}

}  // namespace ms::test
