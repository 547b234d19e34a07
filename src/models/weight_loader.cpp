#include "models/weight_loader.h"

#include <map>
#include <regex>

#include "core/check.h"

namespace ms {

Tensor WeightLoader::take(const std::string& name) {
  Tensor t = store_.get(name);
  used_.insert(name);
  return t.to(device_);
}

Shard Shard::split(int dim, int64_t full, int index, int parts, std::string fix) {
  if (parts == 1) return {};
  MS_CHECK(full % parts == 0, "cannot split ", full, " evenly over ", parts, " ranks (", fix, ")");
  return {dim, index * (full / parts), full / parts, std::move(fix)};
}

static Tensor apply_shard(const Tensor& t, const Shard& s) {
  return s.whole() ? t : t.slice(s.dim, s.begin, s.begin + s.count);
}

Tensor WeightLoader::tensor(const std::string& name, const Shape& shape, const Shard& shard) {
  Tensor t = store_.get(name);
  used_.insert(name);
  check_shape(t, shape, name);
  check_dtype(t, {DType::BF16, DType::F16, DType::F32}, name);
  return apply_shard(t, shard).to(device_);
}

Linear WeightLoader::linear(const std::string& prefix, int64_t out, int64_t in, bool bias, const Shard& shard) {
  const std::string wname = prefix + ".weight";
  ops::Weight w;
  Tensor full = store_.get(wname);
  used_.insert(wname);
  check_shape(full, {out, in}, wname);
  w.w = apply_shard(full, shard);
  if (full.dtype() == DType::F8_E4M3) {
    MS_CHECK(config_.fp8.enabled, "tensor ", wname, " is F8_E4M3 but config.json has no fp8 quantization_config");
    w.block_n = config_.fp8.block_n;
    w.block_k = config_.fp8.block_k;
    const std::string sname = prefix + ".weight_scale_inv";
    MS_CHECK(store_.has(sname), "fp8 tensor ", wname, " has no ", sname);
    Tensor scale = store_.get(sname);
    used_.insert(sname);
    check_dtype(scale, {DType::F32}, sname);
    check_shape(scale, {(out + w.block_n - 1) / w.block_n, (in + w.block_k - 1) / w.block_k}, sname);
    ops::check_fp8_scales(scale, sname);  // every backend: a checkpoint loads everywhere or nowhere
    w.scale_inv = scale;
    if (!shard.whole()) {
      const int64_t block = shard.dim == 0 ? w.block_n : w.block_k, extent = shard.dim == 0 ? out : in;
      if (shard.begin % block != 0 || (shard.count % block != 0 && shard.begin + shard.count != extent)) {
        // Recorded, and loading goes on (with the covering scale blocks) so that every
        // violation is reported at once; finish() refuses the checkpoint.
        fp8_violations_.push_back(fmt(prefix, ": ", extent, " ", shard.dim == 0 ? "rows" : "columns", " split into ",
                                      shard.count, " per rank, not a multiple of the FP8 block ", block, " (fix: ",
                                      shard.fix, ")"));
      }
      int64_t first = shard.begin / block, last = (shard.begin + shard.count + block - 1) / block;
      w.scale_inv = scale.slice(shard.dim, first, last);
    }
  } else {
    check_dtype(full, {DType::BF16, DType::F16, DType::F32}, wname);
  }
  w.w = w.w.to(device_);
  w.scale_inv = w.scale_inv.defined() ? w.scale_inv.to(device_) : w.scale_inv;
  // Every rank would add a row-parallel bias before the reduce; none of the families has one.
  MS_CHECK(!(bias && shard.dim == 1), prefix, ": a row-parallel linear with a bias is not supported");
  Tensor b = bias ? tensor(prefix + ".bias", {out}, shard) : Tensor{};
  return Linear(std::move(w), std::move(b));
}

void WeightLoader::ignore_prefix(const std::string& prefix) {
  for (auto& name : store_.names())
    if (name.rfind(prefix, 0) == 0) used_.insert(name);
}

void WeightLoader::finish() const {
  if (!fp8_violations_.empty()) {
    // One entry per kind of weight: layer and expert indices become '*', with a count.
    std::map<std::string, int> kinds;
    static const std::regex index(R"(\.(layers|experts)\.\d+\.)");
    for (auto& v : fp8_violations_) ++kinds[std::regex_replace(v, index, ".$1.*.")];
    std::string all;
    for (auto& [k, n] : kinds) all += (all.empty() ? "" : "; ") + k + (n > 1 ? fmt(" [", n, " weights]") : "");
    fail("FP8 block weights cannot be sharded this way: ", all);
  }
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
