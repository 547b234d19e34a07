#include "layers/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"

namespace ms {

double yarn_get_mscale(double scale, double mscale) { return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

namespace {

// Dimension index at which a frequency completes `rotations` turns over the original context.
double correction_dim(double rotations, int dim, double base, int max_pos) {
  return dim * std::log(max_pos / (rotations * 2 * M_PI)) / (2 * std::log(base));
}

// Inverse frequencies blended between interpolation (factor) and extrapolation by YaRN's ramp.
std::vector<float> yarn_inv_freq(int dim, double base, const YarnParams& y) {
  double low = std::max(0.0, std::floor(correction_dim(y.beta_fast, dim, base, y.original_max_position_embeddings)));
  double high =
      std::min(double(dim - 1), std::ceil(correction_dim(y.beta_slow, dim, base, y.original_max_position_embeddings)));
  if (low == high) high += 0.001;
  std::vector<float> inv(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    float pos_freq = float(std::pow(base, double(float(2 * i) / float(dim))));
    float extrap = 1.0f / pos_freq, interp = 1.0f / float(y.factor * pos_freq);
    float ramp = std::clamp(float((i - low) / (high - low)), 0.0f, 1.0f);
    float extrap_weight = 1.0f - ramp;
    inv[i] = interp * (1.0f - extrap_weight) + extrap * extrap_weight;
  }
  return inv;
}

}  // namespace

RopeTable RopeTable::build(int rot_dim, double theta, int max_positions, bool interleaved, const YarnParams* yarn) {
  MS_CHECK(rot_dim > 0 && rot_dim % 2 == 0, "rope dimension ", rot_dim, " must be even");
  const int half = rot_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  float attention_factor = 1.0f;
  if (yarn) {
    inv = yarn_inv_freq(rot_dim, theta, *yarn);
    attention_factor = (yarn->mscale != 0 && yarn->mscale_all_dim != 0)
                           ? float(yarn_get_mscale(yarn->factor, yarn->mscale) /
                                   yarn_get_mscale(yarn->factor, yarn->mscale_all_dim))
                           : float(yarn_get_mscale(yarn->factor));
  } else {
    for (int i = 0; i < half; ++i) inv[i] = 1.0f / float(std::pow(theta, double(float(2 * i) / float(rot_dim))));
  }
  RopeTable t;
  t.rot_dim = rot_dim;
  t.interleaved = interleaved;
  t.cos = Tensor::empty(DType::F32, {max_positions, half});
  t.sin = Tensor::empty(DType::F32, {max_positions, half});
  for (int p = 0; p < max_positions; ++p)
    for (int i = 0; i < half; ++i) {
      float angle = float(p) * inv[i];  // f32 product, as the reference computes it
      t.cos.data<float>()[p * half + i] = float(std::cos(double(angle))) * attention_factor;
      t.sin.data<float>()[p * half + i] = float(std::sin(double(angle))) * attention_factor;
    }
  return t;
}

}  // namespace ms
