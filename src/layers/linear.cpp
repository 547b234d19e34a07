#include "layers/linear.h"

#include "core/check.h"

namespace ms {

Linear::Linear(ops::Weight w, Tensor bias) : weight_(std::move(w)) {
  if (bias.defined()) bias_ = bias.to_f32().to(weight_.w.device());
}

Tensor Linear::operator()(const Tensor& x) const {
  Tensor out = Tensor::uninit(x.dtype(), {x.size(0), out_features()}, x.device());
  forward(x, out);
  return out;
}

void Linear::forward(const Tensor& x, Tensor& out, ops::Overlap overlap) const {
  ops::linear(x, weight_, bias_.defined() ? &bias_ : nullptr, out, overlap);
}

Linear Linear::concat_rows(std::initializer_list<const Linear*> parts) {
  const Linear& first = **parts.begin();
  const ops::Weight& w0 = first.weight_;
  int64_t rows = 0, scale_rows = 0, i = 0;
  for (const Linear* p : parts) {
    const ops::Weight& w = p->weight_;
    if (!p->defined() || w.in_features() != w0.in_features() || w.w.dtype() != w0.w.dtype() ||
        w.w.device() != w0.w.device() || p->bias_.defined() != first.bias_.defined() ||
        w.scale_inv.defined() != w0.scale_inv.defined())
      return {};
    if (w.is_fp8()) {
      const bool last = ++i == int64_t(parts.size());
      if (w.block_n != w0.block_n || w.block_k != w0.block_k || (!last && w.out_features() % w.block_n != 0) ||
          w.scale_inv.size(0) != (w.out_features() + w.block_n - 1) / w.block_n)
        return {};
      scale_rows += w.scale_inv.size(0);
    }
    rows += w.out_features();
  }
  ops::Weight cat = w0;
  cat.w = Tensor::empty(w0.w.dtype(), {rows, w0.in_features()}, w0.w.device());
  if (w0.is_fp8()) cat.scale_inv = Tensor::empty(DType::F32, {scale_rows, w0.scale_inv.size(1)}, w0.w.device());
  Linear out(std::move(cat));
  if (first.bias_.defined()) out.bias_ = Tensor::empty(DType::F32, {rows}, w0.w.device());
  int64_t r = 0, sr = 0;
  for (const Linear* p : parts) {
    const ops::Weight& w = p->weight_;
    const int64_t n = w.out_features();
    out.weight_.w.slice(0, r, r + n).copy_from(w.w.is_contiguous() ? w.w : w.w.clone());
    if (w.is_fp8()) {
      const int64_t sn = w.scale_inv.size(0);
      out.weight_.scale_inv.slice(0, sr, sr + sn).copy_from(w.scale_inv.is_contiguous() ? w.scale_inv
                                                                                          : w.scale_inv.clone());
      sr += sn;
    }
    if (p->bias_.defined()) out.bias_.slice(0, r, r + n).copy_from(p->bias_);
    r += n;
  }
  return out;
}

// Rows to normalise: a 2-D tensor as it is (it may be a column slice), else a contiguous
// tensor viewed as [-1, width].
static Tensor as_rows(const Tensor& x, int64_t width) {
  return (x.dim() == 2 && x.size(1) == width) ? x : x.view({-1, width});
}

Tensor RmsNorm::operator()(const Tensor& x) const {
  Tensor out = Tensor::uninit(x.dtype(), x.shape(), x.device());
  Tensor rows = as_rows(out, weight_.numel());
  ops::rms_norm(as_rows(x, weight_.numel()), weight_, eps_, rows);
  return out;
}

void RmsNorm::forward(const Tensor& x, Tensor& out) const { ops::rms_norm(x, weight_, eps_, out); }

void RmsNorm::inplace(Tensor& x) const {
  Tensor rows = as_rows(x, weight_.numel());
  ops::rms_norm(rows, weight_, eps_, rows);
}

void RmsNorm::add_forward(Tensor& residual, const Tensor& y, Tensor& out) const {
  ops::add_rms_norm(residual, y, weight_, eps_, out);
}

}  // namespace ms
