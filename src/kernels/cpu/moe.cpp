// Mixture-of-experts on the CPU: router top-k (every routing variant of DESIGN.md) and the
// routed experts, grouped by expert so each selected expert's weights are read once per call.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms::cpu {
namespace {

void score(const float* logits, int64_t E, Scoring scoring, float* s) {
  if (scoring == Scoring::Sigmoid) {
    for (int64_t e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    return;
  }
  float mx = *std::max_element(logits, logits + E), sum = 0.f;
  for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(logits[e] - mx));
  for (int64_t e = 0; e < E; ++e) s[e] /= sum;
}

// Zeroes `choice` outside the best `topk_group` groups (the reference masks with 0, not -inf).
void mask_groups(float* choice, int64_t E, const RouterParams& p) {
  const int64_t per = E / p.n_group;
  std::vector<float> gscore(static_cast<size_t>(p.n_group));
  for (int g = 0; g < p.n_group; ++g) {
    std::vector<float> v(choice + g * per, choice + (g + 1) * per);
    std::sort(v.begin(), v.end(), std::greater<>());
    gscore[g] = p.group_rank == GroupRank::Max ? v[0] : v[0] + (per > 1 ? v[1] : 0.f);
  }
  std::vector<int> order(static_cast<size_t>(p.n_group));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return gscore[a] > gscore[b]; });
  for (int r = p.topk_group; r < p.n_group; ++r)
    std::fill(choice + order[r] * per, choice + (order[r] + 1) * per, 0.f);
}

}  // namespace

void moe_topk(const Tensor& logits, const Tensor* bias, const RouterParams& p, Tensor& ids, Tensor& weights) {
  const int64_t T = logits.size(0), E = logits.size(1), K = p.top_k, C = p.columns();
  MS_CHECK(ids.size(1) == C && weights.size(1) == C && K <= E, "moe_topk: top_k ", K, " of ", E, " experts into ",
           ids.describe());
  MS_CHECK(p.group_rank == GroupRank::None || (E % p.n_group == 0 && p.topk_group <= p.n_group),
           "moe_topk: ", E, " experts do not split into ", p.n_group, " groups");
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    score(logits.data<float>() + t * logits.strides()[0], E, p.scoring, s.data());
    for (int64_t e = 0; e < E; ++e) choice[e] = s[e] + (bias ? bias->data<float>()[e] : 0.f);
    if (p.group_rank != GroupRank::None && p.n_group > 1) mask_groups(choice.data(), E, p);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int a, int b) { return choice[a] > choice[b] || (choice[a] == choice[b] && a < b); });
    int32_t* id = ids.data<int32_t>() + t * C;
    float* w = weights.data<float>() + t * C;
    float sum = 0.f;
    for (int64_t j = 0; j < K; ++j) sum += (w[j] = s[id[j] = order[j]]);
    float norm = p.renormalize ? 1.0f / (sum + 1e-20f) : 1.0f;
    for (int64_t j = 0; j < K; ++j) w[j] *= norm * p.scale;
    if (p.fused_shared_replicas > 0) {
      const int64_t replica = E + (t % p.fused_shared_replicas) * p.fused_shared_pieces;
      for (int64_t j = 0; j < p.fused_shared_pieces; ++j) id[K + j] = int32_t(replica + j), w[K + j] = 1.0f;
    }
  }
}

void moe_route(const Tensor& x, const Weight& gate, const Tensor* gate_bias, const Tensor* bias, const RouterParams& p,
               Tensor& ids, Tensor& weights) {
  Tensor logits = Tensor::empty(DType::F32, {x.size(0), gate.out_features()});
  cpu::linear(x, gate, gate_bias, logits);
  cpu::moe_topk(logits, bias, p, ids, weights);
}

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts, Tensor& out) {
  const int64_t T = x.size(0), H = x.size(1), K = ids.size(1);
  const int E = experts.num_experts(), first = experts.first_expert;
  // Tokens per local expert (counting sort), then one small GEMM chain per selected expert.
  std::vector<std::vector<std::pair<int32_t, float>>> routed(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      int32_t e = ids.data<int32_t>()[t * K + j];
      MS_CHECK(e >= 0 && e < experts.total(), "moe: expert id ", e, " outside 0..", experts.total() - 1);
      if (e >= first && e < first + E) routed[e - first].push_back({int32_t(t), weights.data<float>()[t * K + j]});
    }
  for (int64_t t = 0; t < T; ++t) std::fill_n(out.data<float>() + t * out.strides()[0], H, 0.f);
  for (int e = 0; e < E; ++e) {
    const auto& list = routed[e];
    if (list.empty()) continue;
    const int64_t n = int64_t(list.size()), I = experts.gate[e].out_features();
    Tensor xe = Tensor::empty(DType::F32, {n, H});
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x.data<float>() + list[i].first * x.strides()[0], H, xe.data<float>() + i * H);
    Tensor gu = Tensor::empty(DType::F32, {n, 2 * I});
    Tensor g = gu.slice(1, 0, I), u = gu.slice(1, I, 2 * I);
    cpu::linear(xe, experts.gate[e], nullptr, g);
    cpu::linear(xe, experts.up[e], nullptr, u);
    Tensor act = Tensor::empty(DType::F32, {n, I});
    cpu::silu_and_mul(gu, act);
    Tensor ye = Tensor::empty(DType::F32, {n, H});
    cpu::linear(act, experts.down[e], nullptr, ye);
    for (int64_t i = 0; i < n; ++i)
      axpy_f32(list[i].second, ye.data<float>() + i * H, out.data<float>() + list[i].first * out.strides()[0], H);
  }
}

// The experts sum inside (in expert order), so the rows are that sum: one a token, weight 1.
ops::ExpertRows moe_expert_rows(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                const ExpertWeights& experts) {
  const int64_t T = x.size(0);
  ops::ExpertRows r{Tensor::empty(DType::F32, {T, x.size(1)}), Tensor::empty(DType::I32, {T, 1}),
                    Tensor::empty(DType::F32, {T, 1})};
  cpu::moe_experts(x, ids, weights, experts, r.rows);
  for (int64_t t = 0; t < T; ++t) r.row_of.data<int32_t>()[t] = int32_t(t), r.weights.data<float>()[t] = 1.0f;
  return r;
}

}  // namespace ms::cpu
