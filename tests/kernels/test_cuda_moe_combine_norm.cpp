// The MoE block's output folded into the next residual add + RMSNorm (ops::moe_combine_add_rms_norm
// on the experts' un-combined rows, one kernel) against the unfused ops a decoder layer ran before:
// moe_experts (whose combine rounds the weighted sum to bf16), the shared expert's add
// (add_inplace, or add_sigmoid_gated with Qwen2-MoE's gate), then add_rms_norm. The updated
// residual and the normalised output must be bit-identical, for Qwen3 (128 experts top-8), V2-Lite
// (64 top-6, two shared experts' output added ungated), a Qwen2-MoE-like block (60 top-4, a gated
// shared expert) and a rank holding part of the experts (rows -1), at T = 1, 2, 8, 64 (F32 rows
// of the grouped decode path) and 256 (BF16 rows of the grouped prefill GEMM), eager and replayed
// from a captured step with new inputs each time. At T = 1 the experts' rows come as the one-token
// kernel's slabs, which the fused op sums on its way (OneTokenSlabsSumToTheKernelsRows checks
// the slabs against the kernel's own rows). CombineNormBench prints fused vs unfused
// microseconds (graphed) when MOESERVE_BENCH_COMBINE_NORM=1.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms {
namespace {
using namespace test;

struct Case {
  const char* name;
  int E, K;       // experts the router names, slots a token
  int64_t H, I;   // hidden, expert intermediate (small: the combine does not depend on it)
  bool shared = false, gated = false;
  int first = 0, count = 0;  // this rank's experts (count 0: all)
};

const std::vector<Case> kCases = {
    {"qwen3 128 experts top-8", 128, 8, 2048, 128},
    {"v2-lite 64 top-6, 2 shared experts", 64, 6, 2048, 128, true},
    {"qwen2-moe-like 60 top-4, gated shared expert", 60, 4, 2048, 128, true, true},
    {"v2-lite experts 16..47 of 64", 64, 6, 2048, 128, false, false, 16, 32},
    // Batch 1 at 1280 wide: a cluster of 5 blocks, the norm row's last 96 pieces empty.
    {"1280 hidden 32 top-4", 32, 4, 1280, 128},
    // V2-Lite's 1408-wide experts: 22 slabs a slot at batch 1 (two rounds of loads a thread).
    {"8 experts of 1408 top-6, 2 shared experts", 8, 6, 2048, 1408, true},
    // 7168 wide: a row takes a whole 1024-thread block, where registers bound the launch.
    {"v3 ep8 shard experts 32..63 of 256 top-8, a shared expert", 256, 8, 7168, 64, true, false, 32, 32},
};

ops::ExpertWeights make_experts(const Case& c) {
  const int n = c.count > 0 ? c.count : c.E;
  ops::ExpertWeights ex;
  for (int e = 0; e < n; ++e) {
    ex.gate.push_back({gpu(randn({c.I, c.H}, 0.05f))}), ex.up.push_back({gpu(randn({c.I, c.H}, 0.05f))});
    ex.down.push_back({gpu(randn({c.H, c.I}, 0.08f))});
  }
  ex.first_expert = c.first, ex.total_experts = c.E;
  return ex;
}

// One step's inputs: tokens x, their routing (K distinct experts a token, positive weights), the
// shared expert's output and gate, the residual stream.
struct Inputs {
  Tensor x, ids, weights, shared, gate, residual;
};

Inputs make_inputs(const Case& c, int64_t T) {
  Inputs in;
  in.x = gpu(randn({T, c.H}));
  Tensor ids = Tensor::empty(DType::I32, {T, c.K}), w = Tensor::empty(DType::F32, {T, c.K});
  std::vector<int32_t> all(size_t(c.E));
  std::iota(all.begin(), all.end(), 0);
  std::uniform_real_distribution<float> wd(0.01f, 0.5f);
  for (int64_t t = 0; t < T; ++t) {
    std::shuffle(all.begin(), all.end(), rng());
    for (int j = 0; j < c.K; ++j) ids.data<int32_t>()[t * c.K + j] = all[size_t(j)], w.data<float>()[t * c.K + j] = wd(rng());
  }
  in.ids = ids.to(Device::CUDA), in.weights = w.to(Device::CUDA);
  if (c.shared) in.shared = gpu(randn({T, c.H}, 0.5f));
  if (c.gated) in.gate = gpu(randn({T, 1}, 2.0f));
  in.residual = gpu(randn({T, c.H}, 4.0f));
  return in;
}

const Tensor* shared_of(const Inputs& in) { return in.shared.defined() ? &in.shared : nullptr; }
const Tensor* gate_of(const Inputs& in) { return in.gate.defined() ? &in.gate : nullptr; }

constexpr float kEps = 1e-6f;

// The decoder layer's unfused ops on a copy of the residual: its new value and the norm's output.
std::pair<Tensor, Tensor> unfused(const Inputs& in, const ops::ExpertWeights& ex, const Tensor& norm_w) {
  const int64_t T = in.x.size(0), H = in.x.size(1);
  Tensor f = poisoned(DType::BF16, {T, H});
  ops::moe_experts(in.x, in.ids, in.weights, ex, f);
  if (in.gate.defined()) ops::add_sigmoid_gated(f, in.gate, in.shared);
  else if (in.shared.defined()) ops::add_inplace(f, in.shared);
  Tensor residual = in.residual.clone(), h = poisoned(DType::BF16, {T, H});
  ops::add_rms_norm(residual, f, norm_w, kEps, h);
  return {residual, h};
}

void fused(const Inputs& in, const ops::ExpertWeights& ex, const Tensor& norm_w, Tensor& residual, Tensor& h) {
  const ops::ExpertRows rows = ops::moe_expert_rows(in.x, in.ids, in.weights, ex);
  ops::moe_combine_add_rms_norm(rows, shared_of(in), gate_of(in), false, residual, norm_w, kEps, h);
}

TEST(CudaMoeCombineNorm, FusedMatchesUnfused) {
  MS_REQUIRE_CUDA();
  for (const auto& c : kCases) {
    const ops::ExpertWeights ex = make_experts(c);
    const Tensor norm_w = gpu(randn({c.H}, 0.5f));
    for (const int64_t T : {1, 2, 8, 64, 256}) {
      const std::string at = std::string(c.name) + " T=" + std::to_string(T);
      const Inputs in = make_inputs(c, T);
      const auto [res_ref, h_ref] = unfused(in, ex, norm_w);
      Tensor residual = in.residual.clone(), h = poisoned(DType::BF16, {T, c.H});
      fused(in, ex, norm_w, residual, h);
      EXPECT_EQ(bit_mismatches(residual, res_ref), 0) << at << ": residual";
      EXPECT_EQ(bit_mismatches(h, h_ref), 0) << at << ": normalised";
    }
  }
}

// At batch 1 the one-token experts leave each slot's row as its slabs (ExpertRows::slabs) where the
// fused norm takes them; summed they are the rows the kernel's own last step
// writes, bit for bit. (FusedMatchesUnfused checks the fused residual and output.)
TEST(CudaMoeCombineNorm, OneTokenSlabsSumToTheKernelsRows) {
  MS_REQUIRE_CUDA();
  for (const auto& c : kCases) {
    if (!cuda::moe_slab_norm_takes(c.H, c.K)) continue;
    const ops::ExpertWeights ex = make_experts(c);
    const cuda::ExpertTable* table = cuda::expert_table(ex);
    ASSERT_NE(table, nullptr) << c.name;
    for (int rep = 0; rep < 3; ++rep) {
      const std::string at = std::string(c.name) + " launch " + std::to_string(rep);
      const Inputs in = make_inputs(c, 1);
      const ops::ExpertRows rows = ops::moe_expert_rows(in.x, in.ids, in.weights, ex);
      ASSERT_GT(rows.slabs, 0) << at;
      const ops::ExpertRows summed = cuda::summed_slabs(rows);
      EXPECT_EQ(summed.slabs, 0) << at;
      const cuda::Permuted perm = cuda::permute_on_device(in.ids, c.first, table->experts);
      Tensor ye = poisoned(DType::F32, {c.K, c.H});
      ASSERT_TRUE(cuda::one_token_experts(in.x, in.ids, perm.row_of, *table, c.first, ye)) << at;
      // Rows of other ranks' slots are never written: compare the local ones.
      const Tensor row_of = perm.row_of.to(Device::CPU), a = summed.rows.to(Device::CPU), b = ye.to(Device::CPU);
      for (int j = 0; j < c.K; ++j) {
        const int32_t r = row_of.data<int32_t>()[j];
        if (r < 0) continue;
        EXPECT_EQ(std::memcmp(a.data<float>() + r * c.H, b.data<float>() + r * c.H, size_t(c.H) * 4), 0)
            << at << " slot " << j;
      }
    }
  }
}

// Captured once (experts, shared add and norm), replayed with new inputs copied in each time.
TEST(CudaMoeCombineNorm, ReplayedFromCapturedStep) {
  MS_REQUIRE_CUDA();
  for (const auto& c : kCases) {
    const ops::ExpertWeights ex = make_experts(c);
    const Tensor norm_w = gpu(randn({c.H}, 0.5f));
    for (const int64_t T : {1, 2, 8, 64}) {
      const std::string at = std::string(c.name) + " T=" + std::to_string(T);
      Inputs in = make_inputs(c, T);
      Tensor residual = in.residual.clone(), h = poisoned(DType::BF16, {T, c.H});
      auto body = [&] { fused(in, ex, norm_w, residual, h); };
      body();  // the expert table is built outside capture
      const StepShape step(T);
      auto pool = ops::make_graph_pool(Device::CUDA);
      auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool, body);
      for (int rep = 0; rep < 3; ++rep) {
        const Inputs next = make_inputs(c, T);
        const std::pair<Tensor*, const Tensor*> fresh[] = {{&in.x, &next.x},           {&in.ids, &next.ids},
                                                           {&in.weights, &next.weights}, {&in.shared, &next.shared},
                                                           {&in.gate, &next.gate},       {&in.residual, &next.residual}};
        for (auto [dst, src] : fresh)
          if (dst->defined()) dst->copy_from(*src);
        const auto [res_ref, h_ref] = unfused(in, ex, norm_w);
        residual.copy_from(in.residual);
        MS_CUDA(cudaMemsetAsync(h.raw(), 0xff, h.nbytes(), cuda::stream()));
        graph->replay(step.arrays());
        EXPECT_EQ(bit_mismatches(residual, res_ref), 0) << at << " replay " << rep << ": residual";
        EXPECT_EQ(bit_mismatches(h, h_ref), 0) << at << " replay " << rep << ": normalised";
      }
    }
  }
}


// From the experts' rows on: the fused kernel against combine, shared add and add_rms_norm.
TEST(CudaMoeCombineNorm, CombineNormBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_COMBINE_NORM");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_COMBINE_NORM=1 to time it";
  for (const auto& c : {kCases[0], kCases[1], kCases[2]}) {
    const ops::ExpertWeights ex = make_experts(c);
    const Tensor norm_w = gpu(randn({c.H}, 0.5f));
    for (const int64_t T : {1, 64, 8192}) {
      const Inputs in = make_inputs(c, T);
      const ops::ExpertRows rows = ops::moe_expert_rows(in.x, in.ids, in.weights, ex);
      const ops::ExpertRows ye = cuda::summed_slabs(rows);  // the unfused ops' rows
      Tensor residual = in.residual.clone(), h = Tensor::empty(DType::BF16, {T, c.H}, Device::CUDA);
      Tensor f = Tensor::empty(DType::BF16, {T, c.H}, Device::CUDA);
      const double one = graphed_us(T, [&] {
        cuda::moe_combine_add_rms_norm(rows, shared_of(in), gate_of(in), false, residual, norm_w, kEps, h);
      });
      const double split = graphed_us(T, [&] {
        cuda::combine_expert_rows(ye.rows, ye.row_of, ye.weights, f);
        if (in.gate.defined()) cuda::add_sigmoid_gated(f, in.gate, in.shared);
        else if (in.shared.defined()) cuda::add_inplace(f, in.shared);
        cuda::add_rms_norm(residual, f, norm_w, kEps, h);
      });
      std::printf("[bench] moe combine+norm %s hidden %lld T=%lld (%s rows%s): fused %.2f us, unfused (combine%s + "
                  "add_rms_norm) %.2f us (graphed)\n",
                  c.name, (long long)c.H, (long long)T, std::string(dtype_name(rows.rows.dtype())).c_str(),
                  rows.slabs ? ", as slabs" : "", one,
                  c.shared ? " + shared add" : "", split);
    }
  }
}

}  // namespace
}  // namespace ms
