// The in-process shared-memory backend of DeviceComm: the ranks of a group are threads of one
// process, and a collective is "publish a pointer, meet at a barrier, read the others, meet
// again". Reductions add in rank order, so every rank gets bit-identical results.
#pragma once
#include <memory>

#include "parallel/device_comm.h"

namespace ms {

struct ShmGroupState;

class ShmComm : public DeviceComm {
 public:
  // One communicator per rank of a new group of `size` ranks; give comms[r] to rank r's thread.
  static std::vector<std::unique_ptr<DeviceComm>> create_group(int size);
  // Makes every waiting and future collective of the group throw PeerAborted.
  void abort();

  ShmComm(std::shared_ptr<ShmGroupState> state, int rank) : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  void all_reduce(Tensor& x) override;
  Tensor all_gather_v(const Tensor& in) override;
  Tensor reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts) override;
  Tensor all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts,
                      std::vector<int64_t>* recv_counts) override;
  void broadcast(Tensor& x, int root) override;
  void barrier() override;  // throws PeerAborted once the group is aborted
  std::vector<int64_t> all_gather_values(int64_t value) override;

 private:
  // Publishes this rank's pointer and count, waits for all ranks, and returns everyone's.
  void publish(const void* ptr, int64_t value);
  std::shared_ptr<ShmGroupState> state_;
  int rank_;
};

}  // namespace ms
