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
  // forward's two products apart, for a caller that runs other work between them (the MoE layer
  // at decode): act = silu(x gate^T) * (x up^T) (act: activations(x, ctx)), then out = act down^T
  // (out: [T, hidden]), each into a buffer the caller allocated and each with its overlap with the
  // kernel before it (ops::Overlap).
  void gate_up(const Tensor& x, const ForwardContext& ctx, Tensor& act, ops::Overlap overlap) const;
  void project_down(const Tensor& act, const ForwardContext& ctx, Tensor& out, ops::Overlap overlap) const;
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
