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
  // The block from the residual add before it to the norm after it: x = pre_norm(residual +=
  // y), residual += forward(x), out = next_norm(residual), bit for bit as add_forward, forward
  // and add_forward give them; but the first add and norm run with the router
  // (ops::add_rms_norm_route: inside its kernel on the GPU), and the experts' weighted sum (and
  // the shared expert's add) inside the last norm's kernel (ops::moe_combine_add_rms_norm). Only
  // where nothing comes between the block's output and the add: a rank holding all of it (no
  // reduction).
  void forward_add_norm(Tensor& residual, const Tensor& y, const RmsNorm& pre_norm, const ForwardContext& ctx,
                        const RmsNorm& next_norm, Tensor& out) const;
  // All-to-all dispatch (ep == tp): this rank's share of x (rows t with t % group == index)
  // goes to the ranks owning its experts and comes back weighted; returns the rows it owns
  // (others zero) — the attention-TP all-reduce completes them.
  Tensor forward_all_to_all(const Tensor& x, const ForwardContext& ctx) const;
  // The routing alone: ids and weights [T, router.columns()].
  void route(const Tensor& x, Tensor& ids, Tensor& weights) const;
  const ops::RouterParams& router() const { return router_; }

 private:
  // New ids and weights for T tokens; trace() records ids in ctx.routing_trace.
  void routing_outputs(int64_t T, const ForwardContext& ctx, Tensor& ids, Tensor& weights) const;
  static void trace(const Tensor& ids, const ForwardContext& ctx);
  void add_shared(const Tensor& x, const ForwardContext& ctx, Tensor& out) const;
  MoeWeights w_;
  ops::RouterParams router_;
};

}  // namespace ms
