#include "layers/forward.h"

#include "core/check.h"

namespace ms {

KvCache::KvCache(int num_layers, const std::vector<Shape>& per_token, int64_t num_slots, DType dtype, Device device)
    : num_slots_(num_slots) {
  MS_CHECK(num_slots > 0, "KV cache needs at least one slot");
  buffers_.resize(size_t(num_layers));
  for (auto& layer : buffers_)
    for (const Shape& s : per_token) {
      Shape full{num_slots};
      full.insert(full.end(), s.begin(), s.end());
      layer.push_back(Tensor::empty(dtype, full, device));
      bytes_per_slot_ += layer.back().nbytes() / size_t(num_slots);
    }
}

}  // namespace ms
