// Sparse MoE block: router top-k (every routing variant: softmax or sigmoid scoring, greedy,
// group-limited and noaux_tc grouped selection with a correction bias), routed experts, and the
// shared expert (DeepSeek: always added; Qwen2-MoE: scaled by a sigmoid gate).
#pragma once
#include <string_view>

#include "layers/forward.h"
#include "layers/linear.h"
#include "layers/mlp.h"

namespace ms {

// Router settings from a checkpoint's naming: scoring "softmax" | "sigmoid"; method "greedy"
// (plain top-k), "group_limited_greedy" (groups ranked by their best expert), "noaux_tc"
// (groups ranked by their best two, with e_score_correction_bias).
ops::RouterParams make_router_params(std::string_view scoring, std::string_view method, int top_k, int n_group,
                                     int topk_group, bool renormalize, double routed_scaling_factor);

struct MoeWeights {
  Linear gate;                // router: [experts, hidden]
  Tensor correction_bias;     // F32 [experts] or undefined
  ops::ExpertWeights experts;
  GatedMlp shared;            // optional
  Linear shared_gate;         // optional: Qwen2-MoE's [1, hidden] sigmoid gate on the shared expert
};

class SparseMoe {
 public:
  SparseMoe(MoeWeights w, ops::RouterParams router);
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const;
  // The routing alone (tests, expert-parallel dispatch): ids [T, k] I32, weights [T, k] F32.
  void route(const Tensor& x, Tensor& ids, Tensor& weights) const;

 private:
  MoeWeights w_;
  ops::RouterParams router_;
};

}  // namespace ms
