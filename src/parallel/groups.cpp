#include "parallel/groups.h"

#include <map>

#include "core/check.h"
#include "parallel/shm_comm.h"

namespace ms {

std::unique_ptr<LocalGroups> LocalGroups::create_shm(const ParallelConfig& config) {
  config.validate();
  MS_CHECK(config.nnodes == 1, "the shared-memory backend runs on one node; --nnodes needs the NCCL backend");
  auto g = std::make_unique<LocalGroups>();
  const int n = config.tp_size, attn_tp = config.attn_tp_size(), dp = n / attn_tp;
  g->ranks_.resize(size_t(n));
  for (int r = 0; r < n; ++r) {
    g->ranks_[r].config = config;
    g->ranks_[r].layout = RankLayout::of(config, r);
  }
  // Builds one group per key; member i of a group is its i-th rank in rank order.
  auto make = [&](auto key_of, DeviceComm* ParallelGroups::*slot) {
    std::map<int, std::vector<int>> members;
    for (int r = 0; r < n; ++r) members[key_of(r)].push_back(r);
    for (auto& [key, ranks] : members) {
      g->owned_.push_back(ShmComm::create_group(int(ranks.size())));
      for (size_t i = 0; i < ranks.size(); ++i) g->ranks_[ranks[i]].*slot = g->owned_.back()[i].get();
    }
  };
  make([](int) { return 0; }, &ParallelGroups::world);
  make([&](int r) { return r / attn_tp; }, &ParallelGroups::attn_tp);
  make([&](int r) { return r % attn_tp; }, &ParallelGroups::dp);
  (void)dp;
  return g;
}

void LocalGroups::abort() {
  for (auto& group : owned_)
    for (auto& comm : group) static_cast<ShmComm*>(comm.get())->abort();
}

}  // namespace ms
