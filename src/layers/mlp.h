// The gated MLP of both families: down(silu(gate(x)) * up(x)).
#pragma once
#include "layers/forward.h"
#include "layers/linear.h"

namespace ms {

class GatedMlp {
 public:
  GatedMlp() = default;
  GatedMlp(Linear gate, Linear up, Linear down);
  Tensor forward(const Tensor& x, const ForwardContext& ctx) const;
  // forward with the first product's output `act` (activations(x, ctx)) allocated by the caller,
  // and that product's `overlap` with the kernel before it (ops::Overlap).
  Tensor forward(const Tensor& x, const ForwardContext& ctx, Tensor act, ops::Overlap overlap) const;
  Tensor activations(const Tensor& x, const ForwardContext& ctx) const {
    return ctx.empty({x.size(0), gate_.out_features()});
  }
  bool defined() const { return down_.defined(); }
  const Linear& gate() const { return gate_; }
  const Linear& up() const { return up_; }
  const Linear& down() const { return down_; }

 private:
  Linear gate_, up_, down_;
};

}  // namespace ms
