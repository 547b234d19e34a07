// The batch-1 routed experts in one kernel (cuda::fused_experts, moe_experts_fused.h) against
// the two gemv launches it replaces (MOESERVE_MOE_FUSED=0): the experts' rows and the layer's
// output must be bit-identical, for shapes whose sums gemv splits over 4 or 8 warps, one token
// and several, eager and replayed many times from one capture (the blocks' meeting counters
// must come back to their start after every launch). MoeFusedBench (MOESERVE_BENCH_MOE_FUSED=1)
// prints the routed layer's microseconds both ways, graphed, at Qwen3-30B-A3B's shape.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/moe_experts_fused.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms {
namespace {
using namespace test;

struct FusedCase {
  const char* name;
  int64_t E, H, I;
  int K;
  int64_t T;
};

// Split warps (gemv_split_warps) of [gate | up] / down in brackets.
const std::vector<FusedCase> kCases = {
    {"qwen3 shape [4/4]", 128, 2048, 768, 8, 1},
    {"16 experts top-2, hidden 2048 [8/4]", 16, 2048, 256, 2, 1},
    {"8 experts top-2, 1024 x 1024 [8/8]", 8, 1024, 1024, 2, 1},
    {"8 experts top-2, four tokens", 8, 512, 256, 2, 4},
    {"8 experts top-1, eight tokens", 8, 512, 256, 1, 8},
};

ops::ExpertWeights make_experts(const FusedCase& c) {
  ops::ExpertWeights ex;
  for (int e = 0; e < c.E; ++e) {
    ex.gate.push_back({gpu(randn({c.I, c.H}, 0.05f))}), ex.up.push_back({gpu(randn({c.I, c.H}, 0.05f))});
    ex.down.push_back({gpu(randn({c.H, c.I}, 0.08f))});
  }
  return ex;
}

// Distinct experts a token, top-K of a random permutation; router weights in (0, 1).
void make_routing(const FusedCase& c, Tensor& ids, Tensor& w) {
  Tensor hi = Tensor::empty(DType::I32, {c.T, c.K}), hw = Tensor::empty(DType::F32, {c.T, c.K});
  std::vector<int32_t> perm(static_cast<size_t>(c.E));
  for (int64_t t = 0; t < c.T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    for (int j = 0; j < c.K; ++j) {
      hi.data<int32_t>()[t * c.K + j] = perm[size_t(j)];
      hw.data<float>()[t * c.K + j] = 0.1f + 0.8f * float(j + 1) / float(c.K + 1);
    }
  }
  ids = hi.to(Device::CUDA), w = hw.to(Device::CUDA);
}

class FusedSwitch {
 public:
  explicit FusedSwitch(bool on) {
    if (const char* v = std::getenv("MOESERVE_MOE_FUSED")) saved_ = v, had_ = true;
    setenv("MOESERVE_MOE_FUSED", on ? "1" : "0", 1);
  }
  ~FusedSwitch() {
    if (had_) setenv("MOESERVE_MOE_FUSED", saved_.c_str(), 1);
    else unsetenv("MOESERVE_MOE_FUSED");
  }

 private:
  std::string saved_;
  bool had_ = false;
};

bool takes_fused(const FusedCase& c, const ops::ExpertWeights& ex) {
  const cuda::ExpertTable* table = cuda::expert_table(ex);
  if (!table) return false;
  cuda::GemvRows rows;
  rows.rows = int(c.T * c.K), rows.max_groups = rows.expected_groups = int(std::min<int64_t>(c.E, c.T * c.K));
  return cuda::fused_experts_plan(*table, rows, c.T).has_value();
}

struct Outputs {
  Tensor rows, out;
};

Outputs run_layer(const Tensor& x, const Tensor& ids, const Tensor& w, const ops::ExpertWeights& ex, bool fused) {
  FusedSwitch sw(fused);
  const ops::ExpertRows r = cuda::moe_expert_rows(x, ids, w, ex);
  Tensor out = poisoned(DType::BF16, {x.size(0), x.size(1)});
  cuda::moe_experts(x, ids, w, ex, out);
  return {r.rows.to(Device::CPU), out};
}

TEST(CudaMoeFused, MatchesTwoProductsBitForBit) {
  MS_REQUIRE_CUDA();
  if (!cuda::hopper()) GTEST_SKIP() << "the fused experts kernel runs on Hopper only";
  for (const auto& c : kCases) {
    const ops::ExpertWeights ex = make_experts(c);
    ASSERT_TRUE(takes_fused(c, ex)) << c.name;
    for (int trial = 0; trial < 3; ++trial) {
      Tensor ids, w;
      make_routing(c, ids, w);
      const Tensor x = gpu(randn({c.T, c.H}));
      const Outputs two = run_layer(x, ids, w, ex, false), one = run_layer(x, ids, w, ex, true);
      EXPECT_EQ(bit_mismatches(one.rows, two.rows), 0) << c.name << " trial " << trial << ": expert rows";
      EXPECT_EQ(bit_mismatches(one.out, two.out), 0) << c.name << " trial " << trial << ": layer output";
    }
    // One kernel where there were two.
    Tensor ids, w;
    make_routing(c, ids, w);
    const Tensor x = gpu(randn({c.T, c.H}));
    Tensor out = poisoned(DType::BF16, {c.T, c.H});
    auto layer = [&] { cuda::moe_experts(x, ids, w, ex, out); };
    int fused_nodes, split_nodes;
    {
      FusedSwitch sw(true);
      fused_nodes = kernel_nodes(layer);
    }
    {
      FusedSwitch sw(false);
      split_nodes = kernel_nodes(layer);
    }
    EXPECT_EQ(fused_nodes, split_nodes - 1) << c.name;
  }
}

// Many replays of one capture, new tokens and routing each time, against the two products run
// eagerly: a meeting left counting would hang or mix generations here.
TEST(CudaMoeFused, ReplayedFromCapturedStep) {
  MS_REQUIRE_CUDA();
  if (!cuda::hopper()) GTEST_SKIP() << "the fused experts kernel runs on Hopper only";
  for (const auto& c : {kCases[0], kCases[3]}) {
    const ops::ExpertWeights ex = make_experts(c);
    Tensor ids = Tensor::empty(DType::I32, {c.T, c.K}, Device::CUDA);
    Tensor w = Tensor::empty(DType::F32, {c.T, c.K}, Device::CUDA);
    Tensor x = Tensor::empty(DType::BF16, {c.T, c.H}, Device::CUDA);
    Tensor out = Tensor::empty(DType::BF16, {c.T, c.H}, Device::CUDA);
    Tensor ids0, w0;
    make_routing(c, ids0, w0);
    ids.copy_from(ids0), w.copy_from(w0), x.copy_from(gpu(randn({c.T, c.H})));
    FusedSwitch sw(true);
    auto layer = [&] { cuda::moe_experts(x, ids, w, ex, out); };
    layer();
    const StepShape step(c.T);
    auto pool = ops::make_graph_pool(Device::CUDA);
    auto graph = ops::capture_step(Device::CUDA, step.arrays(), c.T, 1, *pool, layer);
    for (int rep = 0; rep < 20; ++rep) {
      Tensor ids_new, w_new;
      make_routing(c, ids_new, w_new);
      ids.copy_from(ids_new), w.copy_from(w_new), x.copy_from(gpu(randn({c.T, c.H})));
      const Outputs ref = run_layer(x, ids, w, ex, false);
      MS_CUDA(cudaMemsetAsync(out.raw(), 0xff, out.nbytes(), cuda::stream()));
      graph->replay(step.arrays());
      EXPECT_EQ(bit_mismatches(out, ref.out), 0) << c.name << " replay " << rep;
    }
  }
}

TEST(CudaMoeFused, MoeFusedBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_MOE_FUSED");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_MOE_FUSED=1 to time the fused experts";
  const FusedCase c = kCases[0];
  // Weights zero: streaming time does not depend on the values. A graph of 16 calls, each with
  // its own routing, so that L2 (50 MB) does not keep one call's 75 MB of experts for the next.
  ops::ExpertWeights ex;
  for (int e = 0; e < c.E; ++e) {
    ex.gate.push_back({Tensor::empty(DType::BF16, {c.I, c.H}, Device::CUDA)});
    ex.up.push_back({Tensor::empty(DType::BF16, {c.I, c.H}, Device::CUDA)});
    ex.down.push_back({Tensor::empty(DType::BF16, {c.H, c.I}, Device::CUDA)});
  }
  constexpr int kCalls = 16;
  std::vector<Tensor> ids(kCalls), w(kCalls);
  for (int i = 0; i < kCalls; ++i) make_routing(c, ids[size_t(i)], w[size_t(i)]);
  const Tensor x = gpu(randn({c.T, c.H}));
  Tensor out = Tensor::empty(DType::BF16, {c.T, c.H}, Device::CUDA);
  int next = 0;
  auto layer = [&] {
    cuda::moe_experts(x, ids[size_t(next)], w[size_t(next)], ex, out);
    next = (next + 1) % kCalls;
  };
  for (int round = 0; round < 3; ++round)
    for (const bool fused : {false, true}) {
      FusedSwitch sw(fused);
      const double us = graphed_us(c.T, layer, kCalls, 50);
      std::printf("[bench] moe experts %s T=1, %s: %.2f us a layer (graphed, sort + products + combine)\n", c.name,
                  fused ? "fused kernel" : "two gemv products", us);
    }
}

}  // namespace
}  // namespace ms
