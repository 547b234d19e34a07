// The GPU backend of DeviceComm: NCCL collectives on device tensors, enqueued on the rank's
// compute stream (so they can sit inside captured CUDA graphs). One communicator per group and
// rank thread; the group's unique id travels over the host (in-process, or the multi-node hub).
// Uneven row counts are exchanged first, then served with grouped broadcast / reduce /
// send-recv calls. NVLink multicast (NVLS) must stay off: set NCCL_NVLS_ENABLE=0.
#pragma once
#include <array>
#include <memory>

#include "parallel/device_comm.h"

namespace ms {

using NcclId = std::array<char, 128>;
NcclId nccl_unique_id();  // on one rank, then shared with the group's other ranks

class NcclComm : public DeviceComm {
 public:
  // Joins the group (blocks until all `size` ranks joined). `device` is this rank's GPU and
  // `stream` its cudaStream_t (nullptr: the default stream).
  NcclComm(const NcclId& id, int size, int rank, int device, void* stream);
  ~NcclComm() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce(Tensor& x) override;
  Tensor all_gather_v(const Tensor& in) override;
  Tensor reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts) override;
  Tensor all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts,
                      std::vector<int64_t>* recv_counts) override;
  void broadcast(Tensor& x, int root) override;
  void barrier() override;
  std::vector<int64_t> all_gather_values(int64_t value) override;
  // Aborts the communicator (another rank failed): enqueued collectives end, and this and
  // later calls throw PeerAborted instead of waiting for the failed rank.
  void abort();
  void time_collectives(bool on) override;
  double collective_seconds() override;

 private:
  struct Impl;
  void check_alive() const;
  void check(int result, const char* what) const;  // an ncclResult_t
  // Brackets one collective's enqueue with timing events while timing is on.
  struct Timed {
    explicit Timed(Impl& impl);
    ~Timed();
    Impl& impl;
  };
  std::vector<int64_t> all_gather_vector(const std::vector<int64_t>& mine);  // every rank's list
  std::unique_ptr<Impl> impl_;
  int size_, rank_;
};

}  // namespace ms
