// Sparse MoE block: router top-k (every routing variant: softmax or sigmoid scoring, greedy,
// group-limited and noaux_tc grouped selection with a correction bias), routed experts, and the
// shared expert (DeepSeek: always added; Qwen2-MoE: scaled by a sigmoid gate) — or the shared
// expert fused into the routed ones. Under expert parallelism a rank holds a slice of the
// experts; its output is a partial sum that the decoder layer reduces.
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
  Linear gate;                // router: [n_routed, hidden], replicated
  Tensor correction_bias;     // F32 [n_routed] or undefined
  ops::ExpertWeights experts; // this rank's experts (routed, then fused shared replicas)
  GatedMlp shared;            // optional, unfused shared expert (this rank's shard)
  Linear shared_gate;         // optional: Qwen2-MoE's [1, hidden] sigmoid gate on the shared expert
};

class SparseMoe {
 public:
  SparseMoe(MoeWeights w, ops::RouterParams router);
  // Partial output of this rank's experts (and shard of the shared expert) for tokens x.
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const;
  // residual += forward(x), then out = norm(residual), bit for bit as norm.add_forward after
  // forward gives them, but with the experts' weighted sum (and the shared expert's add) made
  // inside the norm's kernel on the GPU (ops::moe_combine_add_rms_norm). Only where nothing
  // comes between the block's output and the add: a rank holding all of it (no reduction).
  void forward_add_norm(const Tensor& x, const ForwardContext& ctx, Tensor& residual, const RmsNorm& norm,
                        Tensor& out) const;
  // All-to-all dispatch (ep == tp): this rank's share of x (rows t with t % group == index)
  // goes to the ranks owning its experts and comes back weighted; returns the rows it owns
  // (others zero) — the attention-TP all-reduce completes them.
  Tensor forward_all_to_all(const Tensor& x, const ForwardContext& ctx) const;
  // The routing alone: ids and weights [T, router.columns()].
  void route(const Tensor& x, Tensor& ids, Tensor& weights) const;
  const ops::RouterParams& router() const { return router_; }

 private:
  // route() into new ids and weights, recorded in ctx.routing_trace.
  void route_traced(const Tensor& x, const ForwardContext& ctx, Tensor& ids, Tensor& weights) const;
  void add_shared(const Tensor& x, const ForwardContext& ctx, Tensor& out) const;
  MoeWeights w_;
  ops::RouterParams router_;
};

}  // namespace ms
