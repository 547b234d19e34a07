// The communicators one rank uses, derived from the flags: the whole TP world, its attention
// TP group, and its DP group (the ranks that hold the same attention-TP slot in every
// attention-DP group: gathering over it assembles the global batch).
#pragma once
#include <memory>
#include <vector>

#include "parallel/device_comm.h"
#include "parallel/parallel_config.h"

namespace ms {

struct ParallelGroups {
  ParallelConfig config;
  RankLayout layout;
  DeviceComm* world = nullptr;
  DeviceComm* attn_tp = nullptr;
  DeviceComm* dp = nullptr;
};

// Owns the communicators of all local ranks (threads of this process).
class LocalGroups {
 public:
  // Shared-memory communicators for config.tp_size ranks in this process.
  static std::unique_ptr<LocalGroups> create_shm(const ParallelConfig& config);
  const ParallelGroups& rank(int r) const { return ranks_.at(size_t(r)); }
  int size() const { return int(ranks_.size()); }
  // Every collective of every group throws PeerAborted from now on (a rank failed).
  void abort();

 private:
  std::vector<std::vector<std::unique_ptr<DeviceComm>>> owned_;  // each group's per-rank comms
  std::vector<ParallelGroups> ranks_;
};

}  // namespace ms
