#include "layers/mlp.h"

#include "core/check.h"

namespace ms {

GatedMlp::GatedMlp(Linear gate, Linear up, Linear down)
    : gate_(std::move(gate)), up_(std::move(up)), down_(std::move(down)) {
  MS_CHECK(gate_.out_features() == up_.out_features() && down_.in_features() == gate_.out_features(),
           "gated MLP: gate ", gate_.weight().w.describe(), ", up ", up_.weight().w.describe(), ", down ",
           down_.weight().w.describe(), " do not fit together");
}

Tensor GatedMlp::forward(const Tensor& x, const ForwardContext& ctx) const {
  const int64_t T = x.size(0), I = gate_.out_features();
  Tensor gu = ctx.empty({T, 2 * I});
  Tensor g = gu.slice(1, 0, I), u = gu.slice(1, I, 2 * I);
  gate_.forward(x, g);
  up_.forward(x, u);
  ctx.round(gu);
  Tensor act = ctx.empty({T, I});
  ops::silu_and_mul(gu, act);
  ctx.round(act);
  Tensor out = down_(act);
  ctx.round(out);
  return out;
}

}  // namespace ms
