#include "models/weight_loader.h"

#include "core/check.h"

namespace ms {

Tensor WeightLoader::take(const std::string& name) {
  Tensor t = store_.get(name);
  used_.insert(name);
  return t.to(device_);
}

Tensor WeightLoader::tensor(const std::string& name, const Shape& shape) {
  Tensor t = take(name);
  check_shape(t, shape, name);
  check_dtype(t, {DType::BF16, DType::F16, DType::F32}, name);
  return t;
}

Linear WeightLoader::linear(const std::string& prefix, int64_t out, int64_t in, bool bias) {
  const std::string wname = prefix + ".weight";
  ops::Weight w;
  w.w = take(wname);
  check_shape(w.w, {out, in}, wname);
  if (w.w.dtype() == DType::F8_E4M3) {
    MS_CHECK(config_.fp8.enabled, "tensor ", wname, " is F8_E4M3 but config.json has no fp8 quantization_config");
    w.block_n = config_.fp8.block_n;
    w.block_k = config_.fp8.block_k;
    const std::string sname = prefix + ".weight_scale_inv";
    MS_CHECK(store_.has(sname), "fp8 tensor ", wname, " has no ", sname);
    w.scale_inv = take(sname);
    check_dtype(w.scale_inv, {DType::F32}, sname);
    check_shape(w.scale_inv, {(out + w.block_n - 1) / w.block_n, (in + w.block_k - 1) / w.block_k}, sname);
  } else {
    check_dtype(w.w, {DType::BF16, DType::F16, DType::F32}, wname);
  }
  Tensor b = bias ? tensor(prefix + ".bias", {out}) : Tensor{};
  return Linear(std::move(w), std::move(b));
}

void WeightLoader::ignore_prefix(const std::string& prefix) {
  for (auto& name : store_.names())
    if (name.rfind(prefix, 0) == 0) used_.insert(name);
}

void WeightLoader::finish() const {
  std::string unknown;
  int count = 0;
  for (auto& name : store_.names())
    if (!used_.count(name)) {
      if (count++ < 3) unknown += (unknown.empty() ? "" : ", ") + name;
    }
  MS_CHECK(count == 0, "checkpoint in ", store_.dir(), " has ", count, " tensor(s) the ", config_.architecture,
           " model does not use: ", unknown, count > 3 ? ", ..." : "");
}

}  // namespace ms
