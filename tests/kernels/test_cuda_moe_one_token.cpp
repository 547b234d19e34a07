// The routed experts of one token in one kernel (cuda::one_token_experts, moe_one_token.cu)
// against the two grouped products it replaces at batch 1 (MOESERVE_MOE_ONE_TOKEN=0) and the
// CPU op: at Qwen3-30B-A3B's and DeepSeek-V2-Lite's expert shapes and smaller ones; twenty
// launches in a row with new tokens and experts, in each launch shape (the per-slot counters reset themselves); an
// expert-parallel slice whose other slots are another rank's; replayed from a captured step.
// Its sums run in another order than the products', so the bound is float rounding, not bits.
// MoeOneTokenBench prints both paths' graphed microseconds when MOESERVE_BENCH_MOE_ONE_TOKEN=1.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms {
namespace {
using namespace test;

constexpr double kBf16Tol = 1e-2;  // against the CPU op: BF16 inputs and intermediate, F32 sums

const MoeShape kShapes[] = {{"Qwen3-30B-A3B experts", 2048, 768, 8, 24},
                            {"DeepSeek-V2-Lite experts", 2048, 1408, 6, 12},
                            {"small", 1024, 512, 4, 8},
                            {"wide", 4096, 256, 8, 8}};

// MOESERVE_MOE_ONE_TOKEN=value while alive (0: moe_experts takes the two grouped products;
// ring, 64 or 32: that launch shape), then as it was.
struct OneTokenMode {
  std::string saved;
  bool was_set;
  explicit OneTokenMode(const char* value) {
    const char* old = std::getenv("MOESERVE_MOE_ONE_TOKEN");
    was_set = old != nullptr, saved = old ? old : "";
    setenv("MOESERVE_MOE_ONE_TOKEN", value, 1);
  }
  ~OneTokenMode() {
    if (was_set) setenv("MOESERVE_MOE_ONE_TOKEN", saved.c_str(), 1);
    else unsetenv("MOESERVE_MOE_ONE_TOKEN");
  }
};
struct TwoProducts : OneTokenMode {
  TwoProducts() : OneTokenMode("0") {}
};

Tensor run_experts(const Tensor& x, const Tensor& ids, const Tensor& w, const ops::ExpertWeights& ex) {
  Tensor out = poisoned(DType::F32, {1, x.size(1)});
  cuda::moe_experts(x, ids.to(Device::CUDA), w.to(Device::CUDA), ex, out);
  return out.to(Device::CPU);
}

// Every launch shape (the ring, and register loads at 64 and 32 features a block), each shape.
TEST(CudaMoeOneToken, MatchesTheGroupedProductsAndCpu) {
  MS_REQUIRE_CUDA();
  for (const MoeShape& s : kShapes)
  for (const char* width : {"ring", "64", "32"}) {
    const OneTokenMode mode(width);
    const Experts ex = make_experts(s, 11);
    const cuda::ExpertTable* table = cuda::expert_table(ex.gpu);
    ASSERT_NE(table, nullptr) << s.name;
    for (int rep = 0; rep < 20; ++rep) {
      Tensor ids, w;
      route_tokens(1, s.K, s.E, false, ids, w);
      const Tensor x = randn({1, s.H});
      const Tensor xd = gpu(x), idsd = ids.to(Device::CUDA);
      const std::string at = std::string(s.name) + " shape " + width + " launch " + std::to_string(rep);
      // The kernel is taken, and each slot's row is the two products' row up to rounding.
      const cuda::Permuted perm = cuda::permute_on_device(idsd, 0, s.E);
      Tensor ye = poisoned(DType::F32, {s.K, s.H});
      ASSERT_TRUE(cuda::one_token_experts(xd, idsd, perm.row_of, *table, 0, ye)) << at;
      Tensor ye_ref;
      {
        TwoProducts off;
        ye_ref = cuda::moe_expert_rows(xd, idsd, w.to(Device::CUDA), ex.gpu).rows;
      }
      EXPECT_LT(rel_error(ye.to_f32(), ye_ref.to_f32()), 2e-3) << at;
      // The whole op against the CPU.
      Tensor ref = Tensor::empty(DType::F32, {1, s.H});
      cpu::moe_experts(x, ids, w, ex.cpu, ref);
      EXPECT_LT(rel_error(run_experts(xd, ids, w, ex.gpu), ref), kBf16Tol) << at;
    }
  }
}

// A rank holding experts [4, 12) of 16: slots on other ranks' experts add nothing here.
TEST(CudaMoeOneToken, ExpertParallelSliceSkipsOtherRanksSlots) {
  MS_REQUIRE_CUDA();
  const MoeShape s{"slice", 2048, 768, 8, 16};
  const Experts ex = make_experts(s, 11);
  const ops::ExpertWeights local = expert_slice(ex.gpu, 4, 8);
  for (int rep = 0; rep < 6; ++rep) {
    Tensor ids, w;
    route_tokens(1, s.K, s.E, false, ids, w);
    const Tensor xd = gpu(randn({1, s.H}));
    const Tensor on = run_experts(xd, ids, w, local);
    Tensor off;
    {
      TwoProducts two;
      off = run_experts(xd, ids, w, local);
    }
    EXPECT_LT(rel_error(on, off), 2e-3) << "launch " << rep;
  }
}

// Captured once; each replay with a new token and new experts copied into the captured inputs.
TEST(CudaMoeOneToken, ReplayedFromCapturedStep) {
  MS_REQUIRE_CUDA();
  unsetenv("MOESERVE_MOE_ONE_TOKEN");
  const MoeShape& s = kShapes[0];
  const Experts ex = make_experts(s, 11);
  Tensor ids, w;
  route_tokens(1, s.K, s.E, false, ids, w);
  Tensor xd = gpu(randn({1, s.H})), idsd = ids.to(Device::CUDA), wd = w.to(Device::CUDA);
  Tensor out = Tensor::empty(DType::F32, {1, s.H}, Device::CUDA);
  auto body = [&] { cuda::moe_experts(xd, idsd, wd, ex.gpu, out); };
  body();
  const StepShape step(1);
  auto pool = ops::make_graph_pool(Device::CUDA);
  auto graph = ops::capture_step(Device::CUDA, step.arrays(), 1, 1, *pool, body);
  for (int rep = 0; rep < 5; ++rep) {
    route_tokens(1, s.K, s.E, false, ids, w);
    const Tensor x = randn({1, s.H});
    xd.copy_from(host_as(x, DType::BF16)), idsd.copy_from(ids), wd.copy_from(w);
    graph->replay(step.arrays());
    Tensor ref = Tensor::empty(DType::F32, {1, s.H});
    cpu::moe_experts(x, ids, w, ex.cpu, ref);
    EXPECT_LT(rel_error(out.to(Device::CPU), ref), kBf16Tol) << "replay " << rep;
  }
}

// Graphed microseconds of moe_experts at batch 1, one kernel (in the shape MOESERVE_MOE_ONE_TOKEN
// names, or its automatic one) against the two products, Qwen3's and V2-Lite's shapes with all their experts, each replay's weights cold in L2 (the experts
// rotate over more bytes than L2 holds).
TEST(CudaMoeOneToken, MoeOneTokenBench) {
  const char* env = std::getenv("MOESERVE_BENCH_MOE_ONE_TOKEN");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_MOE_ONE_TOKEN=1 to time it";
  MS_REQUIRE_CUDA();
  for (const MoeShape& s : {kQwen3, kDeepseekV2Lite}) {
    const Experts ex = make_experts(s, 11);
    std::vector<Tensor> ids_of, w_of;
    for (int i = 0; i < 16; ++i) {  // slots rotate over all experts: 16 launches read them all
      Tensor ids, w;
      route_tokens(1, s.K, s.E, false, ids, w);
      ids_of.push_back(ids.to(Device::CUDA)), w_of.push_back(w.to(Device::CUDA));
    }
    const Tensor xd = gpu(randn({1, s.H}));
    Tensor out = Tensor::empty(DType::F32, {1, s.H}, Device::CUDA);
    int i = 0;
    auto call = [&] {
      cuda::moe_experts(xd, ids_of[size_t(i)], w_of[size_t(i)], ex.gpu, out);
      i = (i + 1) % 16;
    };
    const double one = graphed_us(1, call, 16);
    double two;
    {
      TwoProducts off;
      two = graphed_us(1, call, 16);
    }
    const double mb = double(s.K) * 3 * s.H * s.I * 2 / 1e6;
    std::printf("[bench] %s batch-1 experts (%.1f MB): one kernel %.2f us (%.0f GB/s), two products %.2f us (%.0f GB/s)\n",
                s.name, mb, one, mb * 1e3 / one, two, mb * 1e3 / two);
  }
}

}  // namespace
}  // namespace ms
