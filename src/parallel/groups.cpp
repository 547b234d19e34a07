#include "parallel/groups.h"

#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/device_memory.h"
#include "parallel/shm_comm.h"
#include "parallel/tcp_comm.h"
#if MOESERVE_WITH_NCCL
#include "parallel/nccl/nccl_comm.h"
#endif

namespace ms {

namespace {

// One group a rank belongs to: its name (the same on every node), its size, the rank's index in
// it (members are the group's global ranks in ascending order) and where ParallelGroups keeps it.
struct GroupSpec {
  std::string name;
  int size, member;
  DeviceComm* ParallelGroups::*slot;
};

std::vector<GroupSpec> groups_of(const ParallelConfig& c, int r) {
  const int n = c.tp_size, attn = c.attn_tp_size();
  return {{"world", n, r, &ParallelGroups::world},
          {fmt("attn_tp/", r / attn), attn, r % attn, &ParallelGroups::attn_tp},
          {fmt("dp/", r % attn), n / attn, r / attn, &ParallelGroups::dp}};
}

}  // namespace

std::unique_ptr<LocalGroups> LocalGroups::create(const ParallelConfig& config, Device device) {
  config.validate();
  auto g = std::unique_ptr<LocalGroups>(new LocalGroups());
  g->config_ = config;
  g->device_ = device;
  // NVLink multicast (NVLS) stays off whatever the environment says: on shared hosts a program
  // that uses it can take the GPUs out of service. Set before any rank thread starts NCCL.
  if (device == Device::CUDA) ::setenv("NCCL_NVLS_ENABLE", "0", 1);
  if (config.nnodes > 1) g->create_tcp();  // on CUDA: the host channel that carries NCCL's ids
  else if (device == Device::CPU) g->create_shm();
  else g->create_nccl_ids();
  return g;
}

LocalGroups::~LocalGroups() = default;

void LocalGroups::create_shm() {
  const int n = config_.tp_size;
  ranks_.resize(size_t(n));
  struct Members {
    DeviceComm* ParallelGroups::*slot;
    std::vector<std::pair<int, int>> list;  // (member, rank)
  };
  std::map<std::string, Members> groups;
  for (int r = 0; r < n; ++r) {
    ranks_[r].config = config_, ranks_[r].layout = RankLayout::of(config_, r);
    for (const GroupSpec& g : groups_of(config_, r)) {
      groups[g.name].slot = g.slot;
      groups[g.name].list.push_back({g.member, r});
    }
  }
  for (auto& [name, m] : groups) {
    owned_.push_back(ShmComm::create_group(int(m.list.size())));
    for (auto [member, r] : m.list) ranks_[r].*m.slot = owned_.back()[size_t(member)].get();
  }
}

void LocalGroups::create_tcp() {
  const net::Address addr = net::Address::parse(config_.dist_init_addr);
  if (config_.node_rank == 0) hub_ = std::make_unique<TcpHub>(addr);
  const int local = config_.ranks_per_node();
  for (int i = 0; i < local; ++i) {
    const int r = config_.node_rank * local + i;
    ParallelGroups pg;
    pg.config = config_, pg.layout = RankLayout::of(config_, r);
    std::vector<std::unique_ptr<DeviceComm>> comms;
    for (const GroupSpec& g : groups_of(config_, r)) {
      comms.push_back(std::make_unique<TcpComm>(addr, g.name, g.size, g.member));
      pg.*g.slot = comms.back().get();
    }
    owned_.push_back(std::move(comms));
    ranks_.push_back(pg);
  }
}

// One node on CUDA: every group's NCCL unique id is made here and handed to its members.
void LocalGroups::create_nccl_ids() {
#if MOESERVE_WITH_NCCL
  const int n = config_.tp_size;
  ranks_.resize(size_t(n));
  for (int r = 0; r < n; ++r) {
    ranks_[r].config = config_, ranks_[r].layout = RankLayout::of(config_, r);
    for (const GroupSpec& g : groups_of(config_, r))
      if (!nccl_ids_.count(g.name)) nccl_ids_[g.name] = nccl_unique_id();
  }
#else
  fail("GPU ranks need the NCCL backend; this build has none (NCCL was not found at configure time)");
#endif
}

void LocalGroups::connect(int i) {
  if (device_ != Device::CUDA) return;
#if MOESERVE_WITH_NCCL
  ParallelGroups& pg = ranks_.at(size_t(i));
  void* stream = device_memory(Device::CUDA)->stream();
  std::vector<std::unique_ptr<DeviceComm>> comms;
  for (const GroupSpec& g : groups_of(config_, pg.layout.rank)) {
    NcclId id{};
    if (config_.nnodes == 1) {
      id = nccl_ids_.at(g.name);
    } else {  // the group's first member makes the id; the hub hands it to the others
      Tensor bytes = Tensor::empty(DType::U8, {int64_t(id.size())});
      if (g.member == 0) id = nccl_unique_id(), std::memcpy(bytes.raw(), id.data(), id.size());
      (pg.*g.slot)->broadcast(bytes, 0);
      std::memcpy(id.data(), bytes.raw(), id.size());
    }
    comms.push_back(std::make_unique<NcclComm>(id, g.size, g.member, config_.gpu_of(i), stream));
    pg.*g.slot = comms.back().get();
  }
  std::lock_guard<std::mutex> lock(mu_);
  owned_.push_back(std::move(comms));
#else
  (void)i;
  fail("GPU ranks need the NCCL backend; this build has none (NCCL was not found at configure time)");
#endif
}

void LocalGroups::abort() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& group : owned_)
    for (auto& comm : group) {
      if (auto* s = dynamic_cast<ShmComm*>(comm.get())) s->abort();
      if (auto* t = dynamic_cast<TcpComm*>(comm.get())) t->abort();
#if MOESERVE_WITH_NCCL
      if (auto* c = dynamic_cast<NcclComm*>(comm.get())) c->abort();
#endif
    }
}

}  // namespace ms
