// Linear layer: a weight in its stored format (bf16, or fp8 128x128 blocks) and an optional
// bias. Parallel styles (column / row) arrive with the parallelism work.
#pragma once
#include "kernels/ops.h"

namespace ms {

class Linear {
 public:
  Linear() = default;
  explicit Linear(ops::Weight w, Tensor bias = {});  // bias is kept as F32 on the weight's device
  Tensor operator()(const Tensor& x) const;           // [T, in] -> [T, out]
  // Into a preallocated output; `overlap` with the kernel before (ops::Overlap).
  void forward(const Tensor& x, Tensor& out, ops::Overlap overlap = ops::Overlap::AfterLast) const;
  const ops::Weight& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  int64_t out_features() const { return weight_.out_features(); }
  int64_t in_features() const { return weight_.in_features(); }
  bool defined() const { return weight_.w.defined(); }
  // Marks the weight fetch_early (ops::Weight): the kernel before its product reads little.
  void mark_fetch_early() { weight_.fetch_early = true; }

  // One linear whose output rows are the parts' rows in order (their outputs side by side), for
  // projections of the same input that one GEMM can compute. Undefined when the parts cannot
  // share a weight: different input widths, dtypes or biases, or FP8 parts whose boundaries do
  // not fall on a scale block (every part but the last a whole number of block rows).
  static Linear concat_rows(std::initializer_list<const Linear*> parts);

 private:
  ops::Weight weight_;
  Tensor bias_;  // F32 or undefined
};

class RmsNorm {
 public:
  RmsNorm() = default;
  RmsNorm(Tensor weight, float eps) : weight_(std::move(weight)), eps_(eps) {}
  Tensor operator()(const Tensor& x) const;  // rows of x (any leading shape, last dim normalised)
  void forward(const Tensor& x, Tensor& out) const;  // 2-D rows, out may be a column slice
  void inplace(Tensor& x) const;
  // residual += y, then out = norm(residual): a block's residual add fused with the norm after it.
  void add_forward(Tensor& residual, const Tensor& y, Tensor& out) const;
  const Tensor& weight() const { return weight_; }
  float eps() const { return eps_; }

 private:
  Tensor weight_;
  float eps_ = 1e-6f;
};

}  // namespace ms
