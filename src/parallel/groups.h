// The communicators one rank uses, derived from the flags: the whole TP world, its attention
// TP group, and its DP group (the ranks that hold the same attention-TP slot in every
// attention-DP group: gathering over it assembles the global batch).
#pragma once
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <string>
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

// Owns the communicators of this process's ranks (threads): all tp_size ranks on one node, or
// this node's tp_size / nnodes ranks. On the CPU the collectives are shared memory (one node)
// or TCP through node 0's hub; on CUDA they are NCCL, one communicator per group and rank,
// whose unique ids travel in-process (one node) or through the hub.
class LocalGroups {
 public:
  static std::unique_ptr<LocalGroups> create(const ParallelConfig& config, Device device = Device::CPU);
  ~LocalGroups();
  // Local rank i (global rank node_rank * size() + i).
  const ParallelGroups& rank(int i) const { return ranks_.at(size_t(i)); }
  int size() const { return int(ranks_.size()); }
  // CUDA: joins local rank i's NCCL communicators, on rank i's own thread once it is bound to
  // its GPU (ops::init_backend(Device::CUDA, config.gpu_of(i))); blocks until every member of
  // each group has joined, so all local ranks must connect concurrently. CPU: nothing to do.
  void connect(int i);
  // Every collective of every group throws PeerAborted from now on (a rank failed).
  void abort();

 private:
  void create_shm();
  void create_tcp();
  void create_nccl_ids();

  ParallelConfig config_;
  Device device_ = Device::CPU;
  std::unique_ptr<TcpHub> hub_;                                   // node 0 of a multi-node run
  std::vector<std::vector<std::unique_ptr<DeviceComm>>> owned_;  // each group's comms held here
  std::vector<ParallelGroups> ranks_;
  std::map<std::string, std::array<char, 128>> nccl_ids_;        // one node: each group's unique id
  std::mutex mu_;                                                 // owned_ while ranks connect
};

}  // namespace ms
