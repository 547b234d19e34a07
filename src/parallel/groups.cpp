#include "parallel/groups.h"

#include <map>

#include "core/check.h"
#include "parallel/shm_comm.h"
#include "parallel/tcp_comm.h"

namespace ms {

namespace {
// The group each rank belongs to, as (kind, group key): members of a group are its ranks in
// ascending order, so a rank's index in it follows from the key.
struct GroupOf {
  int world(int) const { return 0; }
  int attn_tp(int r) const { return r / attn; }
  int dp(int r) const { return r % attn; }
  int attn;
};
}  // namespace

std::unique_ptr<LocalGroups> LocalGroups::create(const ParallelConfig& config) {
  config.validate();
  auto g = std::unique_ptr<LocalGroups>(new LocalGroups());
  g->config_ = config;
  if (config.nnodes == 1) g->create_shm();
  else g->create_tcp();
  return g;
}

LocalGroups::~LocalGroups() = default;

void LocalGroups::create_shm() {
  const int n = config_.tp_size;
  const GroupOf of{config_.attn_tp_size()};
  ranks_.resize(size_t(n));
  for (int r = 0; r < n; ++r) ranks_[r].config = config_, ranks_[r].layout = RankLayout::of(config_, r);
  auto make = [&](auto key_of, DeviceComm* ParallelGroups::*slot) {
    std::map<int, std::vector<int>> members;
    for (int r = 0; r < n; ++r) members[key_of(r)].push_back(r);
    for (auto& [key, ranks] : members) {
      owned_.push_back(ShmComm::create_group(int(ranks.size())));
      for (size_t i = 0; i < ranks.size(); ++i) ranks_[ranks[i]].*slot = owned_.back()[i].get();
    }
  };
  make([&](int r) { return of.world(r); }, &ParallelGroups::world);
  make([&](int r) { return of.attn_tp(r); }, &ParallelGroups::attn_tp);
  make([&](int r) { return of.dp(r); }, &ParallelGroups::dp);
}

void LocalGroups::create_tcp() {
  const net::Address addr = net::Address::parse(config_.dist_init_addr);
  if (config_.node_rank == 0) hub_ = std::make_unique<TcpHub>(addr);
  const int n = config_.tp_size, local = n / config_.nnodes, attn = config_.attn_tp_size(), dp = n / attn;
  for (int i = 0; i < local; ++i) {
    const int r = config_.node_rank * local + i;
    ParallelGroups pg;
    pg.config = config_, pg.layout = RankLayout::of(config_, r);
    std::vector<std::unique_ptr<DeviceComm>> comms;
    comms.push_back(std::make_unique<TcpComm>(addr, "world", n, r));
    comms.push_back(std::make_unique<TcpComm>(addr, fmt("attn_tp/", r / attn), attn, r % attn));
    comms.push_back(std::make_unique<TcpComm>(addr, fmt("dp/", r % attn), dp, r / attn));
    pg.world = comms[0].get(), pg.attn_tp = comms[1].get(), pg.dp = comms[2].get();
    owned_.push_back(std::move(comms));
    ranks_.push_back(pg);
  }
}

void LocalGroups::abort() {
  for (auto& group : owned_)
    for (auto& comm : group) {
      if (auto* s = dynamic_cast<ShmComm*>(comm.get())) s->abort();
      if (auto* t = dynamic_cast<TcpComm*>(comm.get())) t->abort();
    }
}

}  // namespace ms
