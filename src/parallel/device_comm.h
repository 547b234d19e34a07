// Collectives among the ranks of one group, on tensors of the ranks' device. Backends: the
// in-process shared-memory one (ranks are threads, CPU tensors) and NCCL (GPU). Every rank of
// a group makes the same calls in the same order. Row counts may differ per rank where a call
// says so — including zero rows, for a rank with an IDLE batch. Tensors are contiguous with
// rows along dimension 0.
#pragma once
#include <cstdint>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"

namespace ms {

// Thrown by a collective when another rank of the process failed and aborted the groups.
class PeerAborted : public Error {
 public:
  PeerAborted() : Error("a peer rank failed; this collective was abandoned") {}
};

class DeviceComm {
 public:
  virtual ~DeviceComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // x = the sum over ranks of x (same shape everywhere); every rank gets the identical sum.
  virtual void all_reduce(Tensor& x) = 0;
  // The ranks' `in` [rows_r, ...] stacked in rank order; rows_r may differ per rank.
  virtual Tensor all_gather_v(const Tensor& in) = 0;
  // Sums `in` [sum(counts), ...] (same shape on all ranks); rank r gets rows
  // [counts[0] + ... + counts[r-1], + counts[r]) of the sum.
  virtual Tensor reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts) = 0;
  // Sends rows of `in` to each rank d in rank order (send_counts[d] rows each); returns what
  // every rank sent this one, stacked in rank order, and its row counts in `recv_counts`.
  virtual Tensor all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts,
                              std::vector<int64_t>* recv_counts) = 0;
  // x becomes root's x on every rank (same shape everywhere).
  virtual void broadcast(Tensor& x, int root) = 0;
  virtual void barrier() = 0;
  // One integer from every rank, in rank order (e.g. DP ranks' token counts).
  virtual std::vector<int64_t> all_gather_values(int64_t value) = 0;

  // Measuring: while on, a backend that can times its collectives on the device (waiting for a
  // slower peer included); collective_seconds() returns the time since the last call (waiting
  // for the device) and restarts the count. Backends that do not measure return 0.
  virtual void time_collectives(bool on) {}
  virtual double collective_seconds() { return 0; }
};

}  // namespace ms
