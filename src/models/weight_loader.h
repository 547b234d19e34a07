// Loading is a table from checkpoint names to parameters: a model asks for every tensor it
// needs by name (with the shape it expects), and finish() refuses a checkpoint that holds
// tensors nobody asked for. Every error names the tensor.
#pragma once
#include <set>
#include <string>

#include "io/model_config.h"
#include "io/safetensors.h"
#include "layers/linear.h"

namespace ms {

// The part of a checkpoint tensor one rank holds: all of it, a range of rows (column-parallel:
// output features) or a range of columns (row-parallel: input features). `fix` names the flags
// that avoid the split, for the FP8 block-divisibility error.
struct Shard {
  int dim = -1;  // -1 whole, 0 rows, 1 columns
  int64_t begin = 0, count = 0;
  std::string fix;

  // Part `index` of `parts` equal parts of `full` along `dim` (whole when parts == 1).
  static Shard split(int dim, int64_t full, int index, int parts, std::string fix);
  static Shard range(int dim, int64_t begin, int64_t count, std::string fix) { return {dim, begin, count, std::move(fix)}; }
  bool whole() const { return dim < 0; }
};

class WeightLoader {
 public:
  // Tensors are handed out on `device` (views into the mapping on the CPU, copies elsewhere).
  WeightLoader(const WeightStore& store, const ModelConfig& config, Device device = Device::CPU)
      : store_(store), config_(config), device_(device) {}

  bool has(const std::string& name) const { return store_.has(name); }
  // A plain tensor (norm weight, bias, embedding) of the given full shape, float dtypes only;
  // `shard` picks this rank's part.
  Tensor tensor(const std::string& name, const Shape& shape, const Shard& shard = {});
  // `prefix`.weight [out, in] (full checkpoint sizes) in bf16/f16/f32 or, for fp8 checkpoints,
  // F8_E4M3 with `prefix`.weight_scale_inv; `prefix`.bias too when `bias` is set. A sharded FP8
  // weight must split on block boundaries: violations are collected and reported by finish().
  Linear linear(const std::string& prefix, int64_t out, int64_t in, bool bias = false, const Shard& shard = {});
  // Marks every tensor under `prefix` as intentionally unused (e.g. an MTP layer not loaded).
  void ignore_prefix(const std::string& prefix);
  // Throws if a sharded FP8 weight broke the block rule (every violation, with its fix) or the
  // checkpoint has tensors that were never asked for.
  void finish() const;

 private:
  Tensor take(const std::string& name);
  const WeightStore& store_;
  const ModelConfig& config_;
  Device device_;
  std::vector<std::string> fp8_violations_;
  std::set<std::string> used_;
};

}  // namespace ms
