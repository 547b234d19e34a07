#include "layers/linear.h"

#include "core/check.h"

namespace ms {

Linear::Linear(ops::Weight w, Tensor bias) : weight_(std::move(w)) {
  if (bias.defined()) bias_ = bias.to_f32().to(weight_.w.device());
}

Tensor Linear::operator()(const Tensor& x) const {
  Tensor out = Tensor::empty(x.dtype(), {x.size(0), out_features()}, x.device());
  forward(x, out);
  return out;
}

void Linear::forward(const Tensor& x, Tensor& out) const {
  ops::linear(x, weight_, bias_.defined() ? &bias_ : nullptr, out);
}

// Rows to normalise: a 2-D tensor as it is (it may be a column slice), else a contiguous
// tensor viewed as [-1, width].
static Tensor as_rows(const Tensor& x, int64_t width) {
  return (x.dim() == 2 && x.size(1) == width) ? x : x.view({-1, width});
}

Tensor RmsNorm::operator()(const Tensor& x) const {
  Tensor out = Tensor::empty(x.dtype(), x.shape(), x.device());
  Tensor rows = as_rows(out, weight_.numel());
  ops::rms_norm(as_rows(x, weight_.numel()), weight_, eps_, rows);
  return out;
}

void RmsNorm::forward(const Tensor& x, Tensor& out) const { ops::rms_norm(x, weight_, eps_, out); }

void RmsNorm::inplace(Tensor& x) const {
  Tensor rows = as_rows(x, weight_.numel());
  ops::rms_norm(rows, weight_, eps_, rows);
}

}  // namespace ms
