// The fused routing of a decode batch (cuda::moe_route: the router product whose last block runs
// the top-k) against the unfused path it replaces (cuda::linear into F32 logits, then
// cuda::moe_topk): ids and weights must be bit-identical in every routing variant, at T = 1, 3
// and 8 (and past the fused sizes, where moe_route is that path), over repeated launches (the
// block counter resets itself) and replayed from a captured step with new inputs each time.
// MoeRouteBench prints fused vs unfused microseconds (graphed) when MOESERVE_BENCH_ROUTE=1.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_common.h"

namespace ms {
namespace {
using namespace test;

struct RouteCase {
  const char* name;
  int64_t E, H;
  ops::RouterParams p;
  bool bias = false;       // correction bias
  bool gate_bias = false;  // a bias on the router's linear
  bool fp8 = false;        // FP8-block router weight
  // Integer weights and one-hot inputs: logits are weight entries, so many are equal and the
  // tie rules (lower expert, lower group) decide.
  bool ties = false;
};

ops::RouterParams router(int k, ops::Scoring s, ops::GroupRank g, int ng, int tg, bool renorm, float scale,
                         int fused = 0) {
  ops::RouterParams p;
  p.top_k = k, p.scoring = s, p.group_rank = g, p.n_group = ng, p.topk_group = tg, p.renormalize = renorm;
  p.scale = scale, p.fused_shared_replicas = fused;
  return p;
}

using S = ops::Scoring;
using G = ops::GroupRank;
const std::vector<RouteCase> kCases = {
    {"qwen3 softmax greedy renorm", 128, 2048, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
    {"v2-lite softmax greedy top-6", 64, 2048, router(6, S::Softmax, G::None, 1, 1, false, 1.0f)},
    {"qwen2 60 experts, gate bias", 60, 1024, router(4, S::Softmax, G::None, 1, 1, false, 1.0f), false, true},
    // Hidden 512: 4 warps a block, so at T = 8 the last block's warps take two tokens each.
    {"v2 group_limited_greedy", 160, 512, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f)},
    {"v3 noaux_tc", 256, 7168, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true},
    {"v3 noaux_tc fused shared x4", 256, 2048, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f, 4), true},
    {"v3 noaux_tc fp8 router", 256, 2048, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true, false, true},
    {"mixtral top-2 of 8", 8, 1024, router(2, S::Softmax, G::None, 1, 1, true, 1.0f)},
    {"sigmoid greedy no renorm", 32, 512, router(4, S::Sigmoid, G::None, 1, 1, false, 1.5f), true},
    {"512 experts (unfused)", 512, 1024, router(10, S::Softmax, G::None, 1, 1, true, 1.0f)},
    {"qwen3 ties", 128, 2048, router(8, S::Softmax, G::None, 1, 1, true, 1.0f), false, false, false, true},
    {"v3 noaux_tc ties", 256, 2048, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), false, false, false, true},
    {"v2 group_limited_greedy ties", 160, 512, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f), false, false, false,
     true},
};

// One case's device tensors.
struct Router {
  ops::Weight gate;
  Tensor gate_bias, bias;
  const Tensor* gb() const { return gate_bias.defined() ? &gate_bias : nullptr; }
  const Tensor* cb() const { return bias.defined() ? &bias : nullptr; }
};

Router make_router(const RouteCase& c) {
  Router r;
  if (c.fp8) {
    r.gate = random_fp8(c.E, c.H, 0.01f).gpu;
  } else {
    Tensor w = randn({c.E, c.H}, 0.03f);
    if (c.ties)
      for (auto& v : w.span<float>()) v = std::round(v * 60.f);  // small integers, exact in bf16
    r.gate.w = gpu(w);
  }
  if (c.gate_bias) r.gate_bias = randn({c.E}, 0.5f).to(Device::CUDA);
  if (c.bias) r.bias = randn({c.E}, 0.3f).to(Device::CUDA);
  return r;
}

// Inputs x [T, H] (BF16 on the device): one-hot rows for a ties case (logits = a weight column).
Tensor make_inputs(const RouteCase& c, int64_t T) {
  Tensor x = randn({T, c.H});
  if (c.ties) {
    std::memset(x.raw(), 0, x.nbytes());
    for (int64_t t = 0; t < T; ++t) x.data<float>()[t * c.H + (t * 37) % c.H] = 1.0f;
  }
  return gpu(x);
}

void unfused(const Tensor& x, const Router& r, const ops::RouterParams& p, Tensor& ids, Tensor& w) {
  Tensor logits = cuda::scratch(DType::F32, {x.size(0), r.gate.out_features()});
  cuda::linear(x, r.gate, r.gb(), logits);
  cuda::moe_topk(logits, r.cb(), p, ids, w);
}

void poison(Tensor& t) { MS_CUDA(cudaMemsetAsync(t.raw(), 0xff, t.nbytes(), cuda::stream())); }

// Number of elements whose bits differ.
int64_t bit_mismatches(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  int64_t n = 0;
  for (int64_t i = 0; i < ha.numel(); ++i)
    n += std::memcmp(static_cast<const char*>(ha.raw()) + 4 * i, static_cast<const char*>(hb.raw()) + 4 * i, 4) != 0;
  return n;
}

TEST(CudaMoeRoute, FusedMatchesUnfusedInEveryVariant) {
  MS_REQUIRE_CUDA();
  for (const auto& c : kCases) {
    const Router r = make_router(c);
    for (const int64_t T : {1, 3, 8, 9}) {  // 9: past the fused sizes
      const Tensor x = make_inputs(c, T);
      const int64_t C = c.p.columns();
      Tensor ids_ref = poisoned(DType::I32, {T, C}), w_ref = poisoned(DType::F32, {T, C});
      unfused(x, r, c.p, ids_ref, w_ref);
      Tensor ids = Tensor::empty(DType::I32, {T, C}, Device::CUDA), w = Tensor::empty(DType::F32, {T, C}, Device::CUDA);
      for (int rep = 0; rep < 3; ++rep) {  // a counter left set would leave the outputs poisoned
        poison(ids), poison(w);
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
        const std::string at = std::string(c.name) + " T=" + std::to_string(T) + " launch " + std::to_string(rep);
        EXPECT_EQ(bit_mismatches(ids, ids_ref), 0) << at;
        EXPECT_EQ(bit_mismatches(w, w_ref), 0) << at;
      }
      // The op interface reaches the same code.
      poison(ids), poison(w);
      ops::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
      EXPECT_EQ(bit_mismatches(ids, ids_ref), 0) << c.name << " T=" << T << " through ops::";
      EXPECT_EQ(bit_mismatches(w, w_ref), 0) << c.name << " T=" << T << " through ops::";
    }
  }
}

// A step that is a decode of T tokens (what capture_step needs to stage).
struct StepShape {
  std::vector<int32_t> zeros;
  ops::AttentionLayout layout;
  explicit StepShape(int64_t T)
      : zeros(size_t(T), 0), layout(make_layout(std::vector<std::pair<int, int>>(size_t(T), {1, 1}), int(T))) {}
  ops::StepArrays arrays() const { return ops::StepArrays{zeros, zeros, zeros, &layout}; }
};

// Captured once, replayed with new inputs copied into x (and the outputs poisoned) each time.
TEST(CudaMoeRoute, ReplayedFromCapturedStep) {
  MS_REQUIRE_CUDA();
  for (const auto& c : {kCases[0], kCases[4], kCases[5]})
    for (const int64_t T : {1, 3, 8}) {
      const Router r = make_router(c);
      const int64_t C = c.p.columns();
      Tensor x = make_inputs(c, T);
      Tensor ids = Tensor::empty(DType::I32, {T, C}, Device::CUDA), w = Tensor::empty(DType::F32, {T, C}, Device::CUDA);
      auto body = [&] { cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w); };
      body();
      const StepShape step(T);
      auto pool = ops::make_graph_pool(Device::CUDA);
      auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool, body);
      for (int rep = 0; rep < 4; ++rep) {
        x.copy_from(make_inputs(c, T));
        Tensor ids_ref = poisoned(DType::I32, {T, C}), w_ref = poisoned(DType::F32, {T, C});
        unfused(x, r, c.p, ids_ref, w_ref);
        poison(ids), poison(w);
        graph->replay(step.arrays());
        const std::string at = std::string(c.name) + " T=" + std::to_string(T) + " replay " + std::to_string(rep);
        EXPECT_EQ(bit_mismatches(ids, ids_ref), 0) << at;
        EXPECT_EQ(bit_mismatches(w, w_ref), 0) << at;
      }
    }
}

// Microseconds a call takes, replayed from graphs of 20 calls (as a decode step replays one per
// layer).
template <class F>
double graphed_us(int64_t T, F call) {
  constexpr int kPerGraph = 20, kReplays = 50;
  auto body = [&] {
    for (int i = 0; i < kPerGraph; ++i) call();
  };
  body();
  const StepShape step(T);
  auto pool = ops::make_graph_pool(Device::CUDA);
  auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool, body);
  for (int i = 0; i < 5; ++i) graph->replay(step.arrays());
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  cudaEventRecord(start, cuda::stream());
  for (int i = 0; i < kReplays; ++i) graph->replay(step.arrays());
  cudaEventRecord(stop, cuda::stream());
  cudaEventSynchronize(stop);
  float ms = 0.f;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start), cudaEventDestroy(stop);
  return 1000.0 * ms / (kPerGraph * kReplays);
}

TEST(CudaMoeRoute, MoeRouteBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_ROUTE");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_ROUTE=1 to time the routing";
  const std::vector<RouteCase> shapes = {
      {"qwen3-30b-a3b (128 experts top-8, hidden 2048)", 128, 2048, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
      {"v2-lite (64 experts top-6, hidden 2048)", 64, 2048, router(6, S::Softmax, G::None, 1, 1, false, 1.0f)},
      {"v3 (256 experts, 8 groups top-4, top-8, hidden 7168)", 256, 7168,
       router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true},
  };
  for (const auto& c : shapes)
    for (const int64_t T : {1, 8}) {
      const Router r = make_router(c);
      const Tensor x = make_inputs(c, T);
      Tensor ids = Tensor::empty(DType::I32, {T, c.p.columns()}, Device::CUDA);
      Tensor w = Tensor::empty(DType::F32, {T, c.p.columns()}, Device::CUDA);
      const double fused = graphed_us(T, [&] { cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w); });
      const double split = graphed_us(T, [&] { unfused(x, r, c.p, ids, w); });
      std::printf("[bench] route %s T=%lld: fused %.2f us, unfused (product + topk_kernel) %.2f us (graphed)\n",
                  c.name, (long long)T, fused, split);
    }
}

}  // namespace
}  // namespace ms
