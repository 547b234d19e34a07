#include "parallel/shm_comm.h"

#include <condition_variable>
#include <cstring>
#include <mutex>

#include "core/check.h"

namespace ms {

// A reusable barrier that can be aborted (std::barrier cannot): a rank that fails must not
// leave its peers waiting forever.
class AbortableBarrier {
 public:
  explicit AbortableBarrier(int n) : n_(n) {}
  void arrive_and_wait() {
    std::unique_lock lock(mu_);
    if (aborted_) throw PeerAborted();
    uint64_t phase = phase_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++phase_;
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return phase_ != phase || aborted_; });
    if (phase_ == phase) throw PeerAborted();
  }
  void abort() {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int n_, arrived_ = 0;
  uint64_t phase_ = 0;
  bool aborted_ = false;
};

struct ShmGroupState {
  explicit ShmGroupState(int n) : size(n), sync(n), ptrs(size_t(n)), values(size_t(n)), extra(size_t(n)) {}
  int size;
  AbortableBarrier sync;
  std::vector<const void*> ptrs;
  std::vector<int64_t> values;
  std::vector<const int64_t*> extra;  // per-rank arrays (send counts of all_to_all_v)
};

std::vector<std::unique_ptr<DeviceComm>> ShmComm::create_group(int size) {
  MS_CHECK(size >= 1, "a communicator group needs at least one rank");
  auto state = std::make_shared<ShmGroupState>(size);
  std::vector<std::unique_ptr<DeviceComm>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<ShmComm>(state, r));
  return out;
}

int ShmComm::size() const { return state_->size; }

void ShmComm::abort() { state_->sync.abort(); }

void ShmComm::publish(const void* ptr, int64_t value) {
  state_->ptrs[rank_] = ptr;
  state_->values[rank_] = value;
  state_->sync.arrive_and_wait();
}

void ShmComm::barrier() { state_->sync.arrive_and_wait(); }

static size_t row_bytes(const Tensor& t) {
  MS_CHECK(t.device() == Device::CPU && t.is_contiguous(), "shared-memory collectives need contiguous host tensors, got ",
           t.describe());
  int64_t per_row = 1;
  for (int d = 1; d < t.dim(); ++d) per_row *= t.size(d);
  return size_t(per_row) * dtype_size(t.dtype());
}

static Shape with_rows(const Tensor& t, int64_t rows) {
  Shape s = t.shape();
  s[0] = rows;
  return s;
}

void ShmComm::all_reduce(Tensor& x) {
  MS_CHECK(x.dtype() == DType::F32, "all_reduce: shared-memory backend sums F32, got ", x.describe());
  row_bytes(x);
  publish(x.raw(), x.numel());
  for (int r = 0; r < size(); ++r)
    MS_CHECK(state_->values[r] == x.numel(), "all_reduce: rank ", r, " has ", state_->values[r], " elements, rank ",
             rank_, " has ", x.numel());
  Tensor sum = Tensor::empty(DType::F32, x.shape());
  float* s = sum.data<float>();
  for (int r = 0; r < size(); ++r) {
    const float* p = static_cast<const float*>(state_->ptrs[r]);
    for (int64_t i = 0; i < x.numel(); ++i) s[i] += p[i];
  }
  barrier();  // everyone has read every input
  std::memcpy(x.raw(), s, x.nbytes());
  barrier();  // nobody reuses x's memory before all copies are done
}

Tensor ShmComm::all_gather_v(const Tensor& in) {
  const size_t rb = row_bytes(in);
  publish(in.raw(), in.size(0));
  int64_t total = 0;
  for (int r = 0; r < size(); ++r) total += state_->values[r];
  Tensor out = Tensor::empty(in.dtype(), with_rows(in, total));
  char* dst = static_cast<char*>(out.raw());
  for (int r = 0; r < size(); ++r) {
    std::memcpy(dst, state_->ptrs[r], size_t(state_->values[r]) * rb);
    dst += size_t(state_->values[r]) * rb;
  }
  barrier();
  return out;
}

Tensor ShmComm::reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts) {
  MS_CHECK(in.dtype() == DType::F32 && int(counts.size()) == size(), "reduce_scatter_v: ", in.describe(), " with ",
           counts.size(), " counts for ", size(), " ranks");
  const size_t rb = row_bytes(in);
  int64_t offset = 0, total = 0;
  for (int r = 0; r < size(); ++r) total += counts[r], offset += r < rank_ ? counts[r] : 0;
  MS_CHECK(in.size(0) == total, "reduce_scatter_v: ", in.size(0), " rows for counts summing to ", total);
  publish(in.raw(), in.numel());
  Tensor out = Tensor::empty(DType::F32, with_rows(in, counts[rank_]));
  const int64_t first = offset * int64_t(rb / 4), n = out.numel();
  float* o = out.data<float>();
  for (int r = 0; r < size(); ++r) {
    const float* p = static_cast<const float*>(state_->ptrs[r]) + first;
    for (int64_t i = 0; i < n; ++i) o[i] += p[i];
  }
  barrier();
  return out;
}

Tensor ShmComm::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts,
                             std::vector<int64_t>* recv_counts) {
  MS_CHECK(int(send_counts.size()) == size(), "all_to_all_v: ", send_counts.size(), " send counts for ", size(), " ranks");
  const size_t rb = row_bytes(in);
  int64_t sent = 0;
  for (auto c : send_counts) sent += c;
  MS_CHECK(sent == in.size(0), "all_to_all_v: sends ", sent, " rows of ", in.size(0));
  state_->extra[rank_] = send_counts.data();
  publish(in.raw(), in.size(0));
  std::vector<int64_t> recv(static_cast<size_t>(size()));
  int64_t total = 0;
  for (int r = 0; r < size(); ++r) total += (recv[r] = state_->extra[r][rank_]);
  Tensor out = Tensor::empty(in.dtype(), with_rows(in, total));
  char* dst = static_cast<char*>(out.raw());
  for (int r = 0; r < size(); ++r) {
    int64_t skip = 0;
    for (int d = 0; d < rank_; ++d) skip += state_->extra[r][d];
    std::memcpy(dst, static_cast<const char*>(state_->ptrs[r]) + size_t(skip) * rb, size_t(recv[r]) * rb);
    dst += size_t(recv[r]) * rb;
  }
  barrier();
  if (recv_counts) *recv_counts = std::move(recv);
  return out;
}

void ShmComm::broadcast(Tensor& x, int root) {
  row_bytes(x);
  publish(x.raw(), x.numel());
  MS_CHECK(state_->values[root] == x.numel(), "broadcast: root has ", state_->values[root], " elements, rank ", rank_,
           " has ", x.numel());
  if (rank_ != root) std::memcpy(x.raw(), state_->ptrs[root], x.nbytes());
  barrier();
}

std::vector<int64_t> ShmComm::all_gather_values(int64_t value) {
  publish(nullptr, value);
  std::vector<int64_t> out = state_->values;
  barrier();
  return out;
}

}  // namespace ms
