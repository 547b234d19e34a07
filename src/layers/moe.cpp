#include "layers/moe.h"

#include "core/check.h"
#include "parallel/groups.h"

namespace ms {

ops::RouterParams make_router_params(std::string_view scoring, std::string_view method, int top_k, int n_group,
                                     int topk_group, bool renormalize, double routed_scaling_factor) {
  ops::RouterParams p;
  p.top_k = top_k;
  p.scoring = scoring == "sigmoid" ? ops::Scoring::Sigmoid : ops::Scoring::Softmax;
  MS_CHECK(scoring == "sigmoid" || scoring == "softmax", "unknown router scoring \"", scoring, "\"");
  if (method == "group_limited_greedy") p.group_rank = ops::GroupRank::Max;
  else if (method == "noaux_tc") p.group_rank = ops::GroupRank::SumTop2;
  else MS_CHECK(method == "greedy", "unknown router top-k method \"", method, "\"");
  p.n_group = n_group;
  p.topk_group = topk_group;
  p.renormalize = renormalize;
  p.scale = float(routed_scaling_factor);
  return p;
}

SparseMoe::SparseMoe(MoeWeights w, ops::RouterParams router) : w_(std::move(w)), router_(router) {
  const int64_t routed = w_.gate.out_features();
  MS_CHECK(router_.fused_shared_pieces >= 1 && w_.experts.total() == routed + router_.fused_shared_experts(), "MoE: ",
           w_.experts.total(), " experts for a router of ", routed, " outputs and ", router_.fused_shared_replicas,
           " fused shared replicas of ", router_.fused_shared_pieces, " pieces");
  MS_CHECK(!w_.correction_bias.defined() || w_.correction_bias.numel() == routed, "e_score_correction_bias has ",
           w_.correction_bias.numel(), " entries for ", routed, " experts");
  if (w_.correction_bias.defined())
    w_.correction_bias = w_.correction_bias.to_f32().to(w_.gate.weight().w.device());
}

void SparseMoe::route(const Tensor& x, Tensor& ids, Tensor& weights) const {
  // F32 router logits on every device, as the reference computes them (on the GPU the
  // activations are BF16, and bf16 logits would flip near-tied expert choices); the op keeps
  // them internal, so a GPU decode step runs product and top-k as one kernel.
  const Tensor& gate_bias = w_.gate.bias();
  ops::moe_route(x, w_.gate.weight(), gate_bias.defined() ? &gate_bias : nullptr,
                 w_.correction_bias.defined() ? &w_.correction_bias : nullptr, router_, ids, weights);
}

void SparseMoe::add_shared(const Tensor& x, const ForwardContext& ctx, Tensor& out) const {
  if (!w_.shared.defined()) return;
  Tensor shared = w_.shared.forward(x, ctx);
  if (w_.shared_gate.defined()) {
    Tensor gate = w_.shared_gate(x);
    ops::add_sigmoid_gated(out, gate, shared);
  } else {
    ops::add_inplace(out, shared);
  }
  ctx.round(out);
}

void SparseMoe::route_traced(const Tensor& x, const ForwardContext& ctx, Tensor& ids, Tensor& weights) const {
  const int64_t T = x.size(0);
  ids = ctx.empty({T, router_.columns()}, DType::I32);
  weights = ctx.empty({T, router_.columns()}, DType::F32);
  route(x, ids, weights);
  if (ctx.routing_trace) ctx.routing_trace->push_back(ids.to(Device::CPU).clone());
}

Tensor SparseMoe::forward(const Tensor& x, const ForwardContext& ctx) const {
  Tensor ids, weights;
  route_traced(x, ctx, ids, weights);
  Tensor out = ctx.empty(x.shape());
  ops::moe_experts(x, ids, weights, w_.experts, out);
  ctx.round(out);
  add_shared(x, ctx, out);
  return out;
}

void SparseMoe::forward_add_norm(const Tensor& x, const ForwardContext& ctx, Tensor& residual, const RmsNorm& norm,
                                 Tensor& out) const {
  // The shared expert does not need the routing: its products run beside the router's kernel
  // and the routed experts' (ops::Overlap::BesideLast), its gate|up streaming its weights while
  // the router's top-k leaves HBM idle, its down product in the experts' tail, as their
  // multiprocessors come free. Its buffers are allocated before the router runs, so neither can
  // be one that the router or the experts free while their kernels still write it.
  Tensor shared_act, shared, gate;
  if (w_.shared.defined()) shared_act = w_.shared.activations(x, ctx), shared = ctx.empty(x.shape());
  Tensor ids, weights;
  route_traced(x, ctx, ids, weights);
  if (w_.shared.defined()) w_.shared.gate_up(x, ctx, shared_act, ops::Overlap::BesideLast);
  if (w_.shared.defined() && w_.shared_gate.defined()) gate = w_.shared_gate(x);
  const ops::ExpertRows routed = ops::moe_expert_rows(x, ids, weights, w_.experts);
  if (w_.shared.defined()) w_.shared.project_down(shared_act, ctx, shared, ops::Overlap::BesideLast);
  ops::moe_combine_add_rms_norm(routed, shared.defined() ? &shared : nullptr, gate.defined() ? &gate : nullptr,
                                ctx.bf16_activations, residual, norm.weight(), norm.eps(), out);
}

}  // namespace ms
