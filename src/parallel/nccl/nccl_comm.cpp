#include "parallel/nccl/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace ms {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  MS_CHECK(r == ncclSuccess, what, " failed: ", ncclGetErrorString(r));
}
void check_cuda(cudaError_t e, const char* what) { MS_CHECK(e == cudaSuccess, what, " failed: ", cudaGetErrorString(e)); }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8:
    case DType::F8_E4M3: return ncclUint8;
  }
  return ncclUint8;
}

size_t row_elems(const Tensor& t) {
  size_t n = 1;
  for (int d = 1; d < t.dim(); ++d) n *= size_t(t.size(d));
  return n;
}

Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

char* at_row(const Tensor& t, int64_t row) {
  return static_cast<char*>(t.raw()) + size_t(row) * row_elems(t) * dtype_size(t.dtype());
}

}  // namespace

NcclId nccl_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  NcclId out;
  std::memcpy(out.data(), id.internal, sizeof id.internal);
  return out;
}

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int device = 0;
  std::atomic<bool> aborted{false};
  std::once_flag abort_once;
  bool timing = false;
  int depth = 0;  // collectives in progress on this thread (nested ones are not timed apart)
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> spans;  // recorded since the last reading
  std::vector<cudaEvent_t> spare;

  cudaEvent_t event() {
    if (spare.empty()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreate(&e), "cudaEventCreate");
      return e;
    }
    cudaEvent_t e = spare.back();
    spare.pop_back();
    return e;
  }
};

// Only the outermost collective is timed (all_gather_v exchanges its row counts with another).
NcclComm::Timed::Timed(Impl& i) : impl(i) {
  if (!impl.timing || impl.depth++ > 0) return;
  impl.spans.push_back({impl.event(), impl.event()});
  check_cuda(cudaEventRecord(impl.spans.back().first, impl.stream), "cudaEventRecord");
}

NcclComm::Timed::~Timed() {
  if (impl.timing && --impl.depth == 0) (void)cudaEventRecord(impl.spans.back().second, impl.stream);
}

void NcclComm::time_collectives(bool on) {
  impl_->timing = on;
  impl_->depth = 0;
}

double NcclComm::collective_seconds() {
  double total = 0;
  for (auto [start, stop] : impl_->spans) {
    float ms = 0;
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    total += ms * 1e-3;
    impl_->spare.push_back(start), impl_->spare.push_back(stop);
  }
  impl_->spans.clear();
  return total;
}

NcclComm::NcclComm(const NcclId& id, int size, int rank, int device, void* stream)
    : impl_(std::make_unique<Impl>()), size_(size), rank_(rank) {
  impl_->stream = static_cast<cudaStream_t>(stream);
  impl_->device = device;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), sizeof uid.internal);
  check_nccl(ncclCommInitRank(&impl_->comm, size, uid, rank), "ncclCommInitRank");
}

NcclComm::~NcclComm() {
  if (impl_->comm && !impl_->aborted) ncclCommDestroy(impl_->comm);
  for (auto [start, stop] : impl_->spans) impl_->spare.push_back(start), impl_->spare.push_back(stop);
  for (cudaEvent_t e : impl_->spare) cudaEventDestroy(e);
}

void NcclComm::abort() {
  std::call_once(impl_->abort_once, [this] {
    impl_->aborted = true;
    (void)ncclCommAbort(impl_->comm);  // also frees the communicator
  });
}

void NcclComm::check_alive() const {
  if (impl_->aborted) throw PeerAborted();
}

// A call that fails because another rank aborted the communicator reports PeerAborted, so the
// runner names the rank that failed first rather than NCCL's "internal error" here.
void NcclComm::check(int result, const char* what) const {
  if (result != ncclSuccess) check_alive();
  check_nccl(ncclResult_t(result), what);
}

void NcclComm::all_reduce(Tensor& x) {
  check_alive();
  Timed timed(*impl_);
  MS_CHECK(x.device() == Device::CUDA && x.is_contiguous(), "NCCL all_reduce needs a contiguous CUDA tensor");
  if (x.numel() == 0) return;  // the same shape on every rank: all skip (IDLE batches)
  check(ncclAllReduce(x.raw(), x.raw(), size_t(x.numel()), nccl_type(x.dtype()), ncclSum, impl_->comm, impl_->stream),
             "ncclAllReduce");
}

std::vector<int64_t> NcclComm::all_gather_vector(const std::vector<int64_t>& mine) {
  check_alive();
  Timed timed(*impl_);
  const size_t n = mine.size();
  Tensor send = Tensor::empty(DType::I64, {int64_t(n)});
  std::memcpy(send.raw(), mine.data(), n * 8);
  Tensor dsend = send.to(Device::CUDA), drecv = Tensor::empty(DType::I64, {int64_t(n) * size_}, Device::CUDA);
  check(ncclAllGather(dsend.raw(), drecv.raw(), n, ncclInt64, impl_->comm, impl_->stream), "ncclAllGather");
  const cudaError_t synced = cudaStreamSynchronize(impl_->stream);
  check_alive();  // an abort ends the wait with an error that is not this rank's
  check_cuda(synced, "cudaStreamSynchronize");
  Tensor host = drecv.to(Device::CPU);
  return {host.data<int64_t>(), host.data<int64_t>() + host.numel()};
}

std::vector<int64_t> NcclComm::all_gather_values(int64_t value) { return all_gather_vector({value}); }

void NcclComm::barrier() { all_gather_values(0); }

// Every rank broadcasts its rows to all: an all-gather with uneven counts.
Tensor NcclComm::all_gather_v(const Tensor& in) {
  check_alive();
  Timed timed(*impl_);
  std::vector<int64_t> rows = all_gather_values(in.size(0));
  int64_t total = 0;
  for (auto r : rows) total += r;
  Tensor out = Tensor::empty(in.dtype(), with_rows(in, total), Device::CUDA);
  const size_t per_row = row_elems(in);
  check(ncclGroupStart(), "ncclGroupStart");
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    if (rows[r] > 0)  // every rank knows every count, so all skip the same empty ones
      check(ncclBroadcast(in.raw(), at_row(out, offset), size_t(rows[r]) * per_row, nccl_type(in.dtype()), r,
                          impl_->comm, impl_->stream),
            "ncclBroadcast");
    offset += rows[r];
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  return out;
}

// Each rank's slice of the sum is reduced onto that rank.
Tensor NcclComm::reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts) {
  check_alive();
  Timed timed(*impl_);
  MS_CHECK(int(counts.size()) == size_, "reduce_scatter_v: ", counts.size(), " counts for ", size_, " ranks");
  Tensor out = Tensor::empty(in.dtype(), with_rows(in, counts[size_t(rank_)]), Device::CUDA);
  const size_t per_row = row_elems(in);
  check(ncclGroupStart(), "ncclGroupStart");
  int64_t offset = 0;
  for (int r = 0; r < size_; ++r) {
    if (counts[r] > 0)
      check(ncclReduce(at_row(in, offset), out.raw(), size_t(counts[r]) * per_row, nccl_type(in.dtype()), ncclSum, r,
                       impl_->comm, impl_->stream),
            "ncclReduce");
    offset += counts[r];
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  return out;
}

Tensor NcclComm::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts,
                              std::vector<int64_t>* recv_counts) {
  check_alive();
  Timed timed(*impl_);
  MS_CHECK(int(send_counts.size()) == size_, "all_to_all_v: ", send_counts.size(), " send counts for ", size_, " ranks");
  std::vector<int64_t> all = all_gather_vector(send_counts);  // all[s * size + d]: rows s sends d
  std::vector<int64_t> recv(static_cast<size_t>(size_));
  int64_t total = 0;
  for (int s = 0; s < size_; ++s) total += (recv[s] = all[size_t(s * size_ + rank_)]);
  Tensor out = Tensor::empty(in.dtype(), with_rows(in, total), Device::CUDA);
  const size_t per_row = row_elems(in);
  const ncclDataType_t type = nccl_type(in.dtype());
  check(ncclGroupStart(), "ncclGroupStart");
  int64_t soff = 0, roff = 0;
  for (int p = 0; p < size_; ++p) {
    if (send_counts[p] > 0)
      check(ncclSend(at_row(in, soff), size_t(send_counts[p]) * per_row, type, p, impl_->comm, impl_->stream),
                 "ncclSend");
    if (recv[p] > 0)
      check(ncclRecv(at_row(out, roff), size_t(recv[p]) * per_row, type, p, impl_->comm, impl_->stream), "ncclRecv");
    soff += send_counts[p], roff += recv[p];
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  if (recv_counts) *recv_counts = std::move(recv);
  return out;
}

void NcclComm::broadcast(Tensor& x, int root) {
  check_alive();
  if (x.numel() == 0) return;
  Timed timed(*impl_);
  check(ncclBroadcast(x.raw(), x.raw(), size_t(x.numel()), nccl_type(x.dtype()), root, impl_->comm, impl_->stream),
             "ncclBroadcast");
}

}  // namespace ms
