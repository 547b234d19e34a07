#include "models/sharding.h"

#include "core/check.h"

namespace ms {

std::pair<int, int> Sharding::local_experts(int total) const {
  const int ep = c_.ep_size;
  MS_CHECK(total % ep == 0, total, " experts do not split evenly over --ep-size ", ep,
           ep > 1 ? " (with fusion, --n-share-experts-fusion sets the shared expert's replicas)" : "");
  return {l_.ep_rank * (total / ep), total / ep};
}

Shard Sharding::expert_piece(int dim, int64_t width, int piece) const {
  Shard s = expert(dim, width);
  if (s.whole()) s = Shard::range(dim, 0, width, "--disable-shared-experts-fusion");
  s.begin += piece * width;
  return s;
}

int Sharding::fused_shared_replicas(bool valid, bool by_default) const {
  if (!valid || c_.disable_shared_experts_fusion) return 0;
  if (c_.n_share_experts_fusion > 0) return c_.n_share_experts_fusion;
  return by_default ? c_.ep_size : 0;
}

}  // namespace ms
