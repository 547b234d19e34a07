// What the MoE expert tests share: the published expert shapes, random BF16 experts on both
// devices (a fast generator: they run to a billion weights), one rank's slice of them under
// expert parallelism, and random routings.
#pragma once
#include <algorithm>
#include <vector>

#include "cuda_test_util.h"

namespace ms::test {

struct MoeShape {
  const char* name;
  int64_t H, I, K;  // hidden, expert intermediate, experts a token
  int E;            // experts
};
inline const MoeShape kQwen3{"Qwen3-30B-A3B", 2048, 768, 8, 128};
inline const MoeShape kDeepseekV2Lite{"DeepSeek-V2-Lite", 2048, 1408, 6, 64};

// BF16 host tensor of uniform values with standard deviation `std` (xorshift_uniform).
inline Tensor fast_bf16(Shape shape, float std, uint64_t seed) {
  Tensor t = Tensor::empty(DType::BF16, std::move(shape));
  uint16_t* out = t.data<uint16_t>();
  xorshift_uniform(t.numel(), std, seed, [&](int64_t i, float v) { out[i] = f32_to_bf16(v); });
  return t;
}

// Host and device copies of s.E experts' BF16 weights (expert e's gate, up and down from seeds
// 3e + seed0, + 1, + 2; the device copies share nothing).
struct Experts {
  ops::ExpertWeights cpu, gpu;
};
inline Experts make_experts(const MoeShape& s, uint64_t seed0) {
  Experts ex;
  for (int e = 0; e < s.E; ++e) {
    const uint64_t seed = uint64_t(e) * 3 + seed0;
    ex.cpu.gate.push_back({fast_bf16({s.I, s.H}, 0.03f, seed)});
    ex.cpu.up.push_back({fast_bf16({s.I, s.H}, 0.03f, seed + 1)});
    ex.cpu.down.push_back({fast_bf16({s.H, s.I}, 0.04f, seed + 2)});
  }
  auto move = [](const std::vector<ops::Weight>& ws, std::vector<ops::Weight>& dst) {
    for (const auto& w : ws) dst.push_back({w.w.to(Device::CUDA)});
  };
  move(ex.cpu.gate, ex.gpu.gate), move(ex.cpu.up, ex.gpu.up), move(ex.cpu.down, ex.gpu.down);
  return ex;
}

// Experts [first, first + n) of `all` as one rank's slice under expert parallelism.
inline ops::ExpertWeights expert_slice(const ops::ExpertWeights& all, int first, int n) {
  ops::ExpertWeights s;
  s.gate.assign(all.gate.begin() + first, all.gate.begin() + first + n);
  s.up.assign(all.up.begin() + first, all.up.begin() + first + n);
  s.down.assign(all.down.begin() + first, all.down.begin() + first + n);
  s.first_expert = first, s.total_experts = all.num_experts();
  return s;
}

// K distinct experts of E for each of T tokens, weights in (0.1, 1). Skewed: expert e drawn as
// E * u^2 (low ids take most rows, as a trained router's favourites do) and experts e % 13 == 7
// never, so some experts have no rows.
inline void route_tokens(int64_t T, int64_t K, int E, bool skewed, Tensor& ids, Tensor& w) {
  ids = Tensor::empty(DType::I32, {T, K}), w = Tensor::empty(DType::F32, {T, K});
  std::uniform_real_distribution<float> u(0.f, 1.f), wd(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    int32_t* row = ids.data<int32_t>() + t * K;
    for (int64_t j = 0; j < K; ++j) {
      int32_t e;
      do {
        const float v = u(rng());
        e = std::min(E - 1, int(float(E) * (skewed ? v * v : v)));
      } while (std::find(row, row + j, e) != row + j || (skewed && e % 13 == 7));
      row[j] = e, w.data<float>()[t * K + j] = wd(rng());
    }
  }
}

}  // namespace ms::test
