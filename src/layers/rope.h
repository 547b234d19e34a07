// Rotary position embedding tables: plain (theta) or YaRN-scaled, NeoX or interleaved pairs.
#pragma once
#include "core/tensor.h"
#include "kernels/ops.h"

namespace ms {

struct YarnParams {
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1.0, mscale_all_dim = 0.0;
};

// YaRN's magnitude correction: 0.1 * mscale * ln(scale) + 1 for scale > 1.
double yarn_get_mscale(double scale, double mscale = 1.0);

struct RopeTable {
  Tensor cos, sin;  // F32 [max_positions, rot_dim / 2]
  int rot_dim = 0;
  bool interleaved = false;

  static RopeTable build(int rot_dim, double theta, int max_positions, bool interleaved,
                         const YarnParams* yarn = nullptr);
  RopeTable to(Device device) const { return {cos.to(device), sin.to(device), rot_dim, interleaved}; }
  // This table applied at `positions` (the fused rope ops' argument; it refers to the table).
  ops::RopeArgs at(std::span<const int32_t> positions) const { return {cos, sin, rot_dim, interleaved, positions}; }
};

}  // namespace ms
