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

class WeightLoader {
 public:
  // Tensors are handed out on `device` (views into the mapping on the CPU, copies elsewhere).
  WeightLoader(const WeightStore& store, const ModelConfig& config, Device device = Device::CPU)
      : store_(store), config_(config), device_(device) {}

  bool has(const std::string& name) const { return store_.has(name); }
  // A plain tensor (norm weight, bias, embedding) of the given shape, float dtypes only.
  Tensor tensor(const std::string& name, const Shape& shape);
  // `prefix`.weight [out, in] in bf16/f16/f32 or, for fp8 checkpoints, F8_E4M3 with
  // `prefix`.weight_scale_inv; `prefix`.bias too when `bias` is set.
  Linear linear(const std::string& prefix, int64_t out, int64_t in, bool bias = false);
  // Marks every tensor under `prefix` as intentionally unused (e.g. an MTP layer not loaded).
  void ignore_prefix(const std::string& prefix);
  // Throws if the checkpoint has tensors that were never asked for.
  void finish() const;

 private:
  Tensor take(const std::string& name);
  const WeightStore& store_;
  const ModelConfig& config_;
  Device device_;
  std::set<std::string> used_;
};

}  // namespace ms
