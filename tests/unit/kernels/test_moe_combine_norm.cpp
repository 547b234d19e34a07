// The CPU form of the MoE output's fused residual add + norm (ops::moe_expert_rows, then
// ops::moe_combine_add_rms_norm) against the steps a decoder layer ran before it (moe_experts,
// the bf16 rounding, the shared expert's add, add_rms_norm): bit for bit, with and without bf16
// emulation and a shared expert (gated or not), since the fixture comparisons rely on the CPU
// numbers not moving. Also rows of several slots (another backend's form) against their sum.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/cpu/cpu_ops.h"
#include "test_support.h"

namespace ms {
namespace {

Tensor randn(Shape shape, float scale, std::mt19937& g) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  std::normal_distribution<float> d(0.f, scale);
  for (auto& v : t.span<float>()) v = d(g);  // not bf16-exact: the rounding steps must show
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor x = a.clone(), y = b.clone();
  return x.shape() == y.shape() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

TEST(MoeCombineNorm, CpuIsExpertsThenSharedThenAddNorm) {
  std::mt19937 g(11);
  const int64_t H = 64, I = 32, E = 6, K = 2;
  ops::ExpertWeights ex;
  for (int e = 0; e < E; ++e) {
    ex.gate.push_back({randn({I, H}, 0.2f, g)}), ex.up.push_back({randn({I, H}, 0.2f, g)});
    ex.down.push_back({randn({H, I}, 0.2f, g)});
  }
  const Tensor norm_w = randn({H}, 0.5f, g);
  for (const int64_t T : {0, 1, 5})
    for (const int shared_kind : {0, 1, 2})  // none, added, sigmoid-gated
      for (const bool round : {false, true}) {
        const std::string at = "T=" + std::to_string(T) + " shared " + std::to_string(shared_kind) +
                               (round ? " bf16" : "");
        const Tensor x = randn({T, H}, 1.0f, g), residual = randn({T, H}, 3.0f, g);
        Tensor ids = Tensor::empty(DType::I32, {T, K}), w = Tensor::empty(DType::F32, {T, K});
        for (int64_t t = 0; t < T; ++t) {
          ids.data<int32_t>()[t * K] = int32_t(t % E), ids.data<int32_t>()[t * K + 1] = int32_t((t + 3) % E);
          w.data<float>()[t * K] = 0.6f, w.data<float>()[t * K + 1] = 0.3f + 0.01f * float(t);
        }
        const Tensor shared = randn({T, H}, 0.5f, g), gate = randn({T, 1}, 2.0f, g);
        const Tensor* sp = shared_kind > 0 ? &shared : nullptr;
        const Tensor* gp = shared_kind == 2 ? &gate : nullptr;

        Tensor f = Tensor::empty(DType::F32, {T, H});
        cpu::moe_experts(x, ids, w, ex, f);
        if (round) cpu::round_to_bf16(f);
        if (gp) cpu::add_sigmoid_gated(f, *gp, *sp);
        else if (sp) cpu::add_inplace(f, *sp);
        if (sp && round) cpu::round_to_bf16(f);
        Tensor res_ref = residual.clone(), h_ref = Tensor::empty(DType::F32, {T, H});
        cpu::add_rms_norm(res_ref, f, norm_w, 1e-6f, h_ref);

        const ops::ExpertRows rows = ops::moe_expert_rows(x, ids, w, ex);
        Tensor res = residual.clone(), h = Tensor::empty(DType::F32, {T, H});
        ops::moe_combine_add_rms_norm(rows, sp, gp, round, res, norm_w, 1e-6f, h);
        EXPECT_TRUE(same_bits(res, res_ref)) << at << ": residual";
        EXPECT_TRUE(same_bits(h, h_ref)) << at << ": normalised";
      }
}

// Rows in another backend's form: slot order, rows -1 skipped, summed in f32.
TEST(MoeCombineNorm, CpuSumsRowsInSlotOrder) {
  std::mt19937 g(12);
  const int64_t T = 3, K = 3, H = 16;
  ops::ExpertRows rows{randn({7, H}, 1.0f, g), Tensor::empty(DType::I32, {T, K}), randn({T, K}, 0.5f, g)};
  const int32_t row_of[T * K] = {4, 0, 6, -1, 2, 5, 1, -1, 3};
  std::memcpy(rows.row_of.raw(), row_of, sizeof(row_of));
  Tensor f = Tensor::zeros(DType::F32, {T, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j)
      if (row_of[t * K + j] >= 0)
        for (int64_t i = 0; i < H; ++i)
          f.data<float>()[t * H + i] += rows.weights.data<float>()[t * K + j] * rows.rows.data<float>()[row_of[t * K + j] * H + i];
  const Tensor norm_w = randn({H}, 0.5f, g), residual = randn({T, H}, 2.0f, g);
  Tensor res_ref = residual.clone(), h_ref = Tensor::empty(DType::F32, {T, H});
  cpu::add_rms_norm(res_ref, f, norm_w, 1e-6f, h_ref);
  Tensor res = residual.clone(), h = Tensor::empty(DType::F32, {T, H});
  ops::moe_combine_add_rms_norm(rows, nullptr, nullptr, false, res, norm_w, 1e-6f, h);
  // axpy may contract w * v + acc into one rounding: equal up to an ulp or so, not bit for bit.
  for (int64_t i = 0; i < T * H; ++i) {
    EXPECT_NEAR(res.data<float>()[i], res_ref.data<float>()[i], 1e-5f) << i;
    EXPECT_NEAR(h.data<float>()[i], h_ref.data<float>()[i], 1e-4f) << i;
  }
}

}  // namespace
}  // namespace ms
