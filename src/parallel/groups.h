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
  RankLayout layout;  // global rank and its place in every group
  DeviceComm* world = nullptr;
  DeviceComm* attn_tp = nullptr;
  DeviceComm* dp = nullptr;
};

class TcpHub;

// Owns the communicators of this process's ranks (threads): all tp_size ranks on one node
// (shared memory), or this node's tp_size / nnodes ranks (TCP through node 0's hub).
class LocalGroups {
 public:
  static std::unique_ptr<LocalGroups> create(const ParallelConfig& config);
  ~LocalGroups();
  // Local rank i (global rank node_rank * size() + i).
  const ParallelGroups& rank(int i) const { return ranks_.at(size_t(i)); }
  int size() const { return int(ranks_.size()); }
  // Every collective of every group throws PeerAborted from now on (a rank failed).
  void abort();

 private:
  void create_shm();
  void create_tcp();

  ParallelConfig config_;
  std::unique_ptr<TcpHub> hub_;                                   // node 0 of a multi-node run
  std::vector<std::vector<std::unique_ptr<DeviceComm>>> owned_;  // each group's comms held here
  std::vector<ParallelGroups> ranks_;
};

}  // namespace ms
