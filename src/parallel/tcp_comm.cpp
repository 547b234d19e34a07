#include "parallel/tcp_comm.h"

#include <sys/socket.h>

#include <cstring>

#include "core/check.h"
#include "parallel/shm_comm.h"

namespace ms {
namespace {

enum Op : uint32_t { kAllReduce, kAllGatherV, kReduceScatterV, kAllToAllV, kBroadcast, kBarrier, kAllGatherValues };

// One message: an op, a root, a host tensor (dtype, shape, bytes) and a list of integers.
struct Wire {
  uint32_t op = 0;
  int32_t root = 0;
  Tensor tensor;
  std::vector<int64_t> ints;
};

template <class T>
void put(int fd, const T& v) { net::write_all(fd, &v, sizeof v); }
template <class T>
T get(int fd) {
  T v{};
  MS_CHECK(net::read_all(fd, &v, sizeof v), "a peer node closed the connection");
  return v;
}

void send_wire(int fd, const Wire& w) {
  Tensor t = w.tensor.defined() ? w.tensor.to(Device::CPU) : Tensor::empty(DType::F32, {0});
  put(fd, w.op), put(fd, w.root), put(fd, uint32_t(t.dtype())), put(fd, uint32_t(t.dim()));
  for (auto d : t.shape()) put(fd, d);
  put(fd, uint32_t(w.ints.size()));
  for (auto v : w.ints) put(fd, v);
  if (t.nbytes()) net::write_all(fd, t.raw(), t.nbytes());
}

bool recv_wire(int fd, Wire& w) {
  if (!net::read_all(fd, &w.op, sizeof w.op)) return false;
  w.root = get<int32_t>(fd);
  auto dtype = DType(get<uint32_t>(fd));
  Shape shape(get<uint32_t>(fd));
  for (auto& d : shape) d = get<int64_t>(fd);
  w.ints.resize(get<uint32_t>(fd));
  for (auto& v : w.ints) v = get<int64_t>(fd);
  w.tensor = Tensor::empty(dtype, shape);
  if (w.tensor.nbytes()) MS_CHECK(net::read_all(fd, w.tensor.raw(), w.tensor.nbytes()), "a peer node closed the connection");
  return true;
}

void send_string(int fd, const std::string& s) {
  put(fd, uint32_t(s.size()));
  net::write_all(fd, s.data(), s.size());
}
std::string recv_string(int fd) {
  std::string s(get<uint32_t>(fd), '\0');
  if (!s.empty()) MS_CHECK(net::read_all(fd, s.data(), s.size()), "a peer node closed the connection");
  return s;
}

// Runs one collective with the hub-side shared-memory communicator of the calling rank.
Wire perform(DeviceComm& c, Wire& in) {
  Wire out;
  out.op = in.op;
  switch (in.op) {
    case kAllReduce: c.all_reduce(in.tensor), out.tensor = in.tensor; break;
    case kAllGatherV: out.tensor = c.all_gather_v(in.tensor); break;
    case kReduceScatterV: out.tensor = c.reduce_scatter_v(in.tensor, in.ints); break;
    case kAllToAllV: out.tensor = c.all_to_all_v(in.tensor, in.ints, &out.ints); break;
    case kBroadcast: c.broadcast(in.tensor, in.root), out.tensor = in.tensor; break;
    case kBarrier: c.barrier(); break;
    case kAllGatherValues: out.ints = c.all_gather_values(in.ints.at(0)); break;
    default: fail("multi-node hub: unknown collective ", in.op);
  }
  return out;
}

}  // namespace

TcpHub::TcpHub(const net::Address& address) : listener_(net::listen_on(address)) {
  acceptor_ = std::thread([this] { accept_loop(); });
}

int TcpHub::port() const { return net::local_port(listener_); }

// The other nodes' ranks may still be reading the reply to their last collective when this node
// is done: they close their connections once they have it. Only connections still open after a
// grace period (a node that hangs) are cut; cutting at once made a finished run fail on node 1.
TcpHub::~TcpHub() {
  stopping_ = true;
  net::close_fd(listener_);
  acceptor_.join();
  std::unique_lock lock(mu_);
  served_.wait_for(lock, std::chrono::seconds(5), [&] { return open_ == 0; });
  for (int fd : fds_) ::shutdown(fd, 2);
  lock.unlock();
  for (auto& t : servers_) t.join();
}

void TcpHub::accept_loop() {
  while (!stopping_) {
    int fd = net::accept_one(listener_);
    if (fd < 0) return;
    std::lock_guard lock(mu_);
    fds_.push_back(fd);
    ++open_;
    servers_.emplace_back([this, fd] { serve(fd); });
  }
}

DeviceComm& TcpHub::join(const std::string& key, int size, int member) {
  std::lock_guard lock(mu_);
  auto& group = groups_[key];
  if (group.empty()) group = ShmComm::create_group(size);
  MS_CHECK(int(group.size()) == size && member >= 0 && member < size, "multi-node: group ", key,
           " has ", group.size(), " ranks, a node claims ", size, " (are --tp and --nnodes the same on every node?)");
  return *group[size_t(member)];
}

void TcpHub::serve(int fd) {
  DeviceComm* comm = nullptr;
  try {
    std::string key = recv_string(fd);
    int size = int(get<uint32_t>(fd)), member = int(get<uint32_t>(fd));
    comm = &join(key, size, member);
    Wire in;
    while (recv_wire(fd, in)) {
      Wire out;
      try {
        out = perform(*comm, in);
      } catch (const std::exception& e) {
        put(fd, uint32_t(1));
        send_string(fd, e.what());
        continue;
      }
      put(fd, uint32_t(0));
      send_wire(fd, out);
    }
  } catch (const std::exception&) {
    // The connection broke: the rank is gone. Its peers must not wait for it.
  }
  if (comm) static_cast<ShmComm*>(comm)->abort();
  std::lock_guard lock(mu_);
  std::erase(fds_, fd);  // closed here: the destructor must not shut down a reused number
  net::close_fd(fd);
  --open_;
  served_.notify_all();
}

TcpComm::TcpComm(const net::Address& hub, const std::string& key, int size, int member)
    : fd_(net::connect_to(hub, 120.0)), size_(size), member_(member) {
  send_string(fd_, key);
  put(fd_, uint32_t(size)), put(fd_, uint32_t(member));
}

TcpComm::~TcpComm() { net::close_fd(fd_); }

void TcpComm::abort() { ::shutdown(fd_, 2); }

TcpComm::Reply TcpComm::call(uint32_t op, const Tensor& t, const std::vector<int64_t>& ints, int root) {
  Wire w;
  w.op = op, w.root = root, w.tensor = t, w.ints = ints;
  send_wire(fd_, w);
  if (get<uint32_t>(fd_) != 0) {
    std::string msg = recv_string(fd_);
    if (msg == PeerAborted().what()) throw PeerAborted();
    fail(msg);
  }
  Wire r;
  MS_CHECK(recv_wire(fd_, r), "node 0 closed the connection");
  return {r.tensor, r.ints};
}

void TcpComm::all_reduce(Tensor& x) { x.copy_from(call(kAllReduce, x, {}).tensor); }
Tensor TcpComm::all_gather_v(const Tensor& in) { return call(kAllGatherV, in, {}).tensor; }
Tensor TcpComm::reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts) {
  return call(kReduceScatterV, in, counts).tensor;
}
Tensor TcpComm::all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts, std::vector<int64_t>* recv) {
  Reply r = call(kAllToAllV, in, send_counts);
  if (recv) *recv = r.ints;
  return r.tensor;
}
void TcpComm::broadcast(Tensor& x, int root) { x.copy_from(call(kBroadcast, x, {}, root).tensor); }
void TcpComm::barrier() { call(kBarrier, Tensor{}, {}); }
std::vector<int64_t> TcpComm::all_gather_values(int64_t value) { return call(kAllGatherValues, Tensor{}, {value}).ints; }

}  // namespace ms
