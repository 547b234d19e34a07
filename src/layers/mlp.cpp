#include "layers/mlp.h"

#include "core/check.h"

namespace ms {

GatedMlp::GatedMlp(Linear gate, Linear up, Linear down)
    : gate_(std::move(gate)), up_(std::move(up)), down_(std::move(down)) {
  MS_CHECK(gate_.out_features() == up_.out_features() && down_.in_features() == gate_.out_features(),
           "gated MLP: gate ", gate_.weight().w.describe(), ", up ", up_.weight().w.describe(), ", down ",
           down_.weight().w.describe(), " do not fit together");
  MS_CHECK(!gate_.bias().defined() && !up_.bias().defined(), "gated MLP: gate and up take no bias");
}

Tensor GatedMlp::forward(const Tensor& x, const ForwardContext& ctx) const {
  Tensor act = activations(x, ctx);
  gate_up(x, ctx, act, ops::Overlap::AfterLast);
  Tensor out = ctx.empty({x.size(0), down_.out_features()}, act.dtype());
  project_down(act, ctx, out, ops::Overlap::AfterLast);
  return out;
}

void GatedMlp::gate_up(const Tensor& x, const ForwardContext& ctx, Tensor& act, ops::Overlap overlap) const {
  MS_CHECK(act.dim() == 2 && act.size(0) == x.size(0) && act.size(1) == gate_.out_features(), "gated MLP: activations ",
           act.describe(), " for ", x.describe());
  ops::gated_linear(x, gate_.weight(), up_.weight(), ctx.bf16_activations, act, overlap);
  ctx.round(act);
}

void GatedMlp::project_down(const Tensor& act, const ForwardContext& ctx, Tensor& out, ops::Overlap overlap) const {
  down_.forward(act, out, overlap);
  ctx.round(out);
}

}  // namespace ms
