// Multi-node collectives over TCP (--nnodes N --dist-init-addr host:port), for the CPU
// backend. Node 0 runs a hub at the address; every rank of every node connects to it once per
// group it belongs to, and the hub performs each collective with the shared-memory backend on
// the ranks' behalf — so the arithmetic (and its rank-order summation) is the same code as on
// one node, and results are bit-identical to a single process with the same ranks.
#pragma once
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "parallel/device_comm.h"
#include "parallel/socket_io.h"

namespace ms {

class TcpHub {
 public:
  explicit TcpHub(const net::Address& address);  // port 0: any free port (tests)
  ~TcpHub();
  int port() const;
  TcpHub(const TcpHub&) = delete;
  TcpHub& operator=(const TcpHub&) = delete;

 private:
  void accept_loop();
  void serve(int fd);
  DeviceComm& join(const std::string& key, int size, int member);

  int listener_ = -1;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable served_;  // a connection ended
  std::vector<std::thread> servers_;
  std::vector<int> fds_;
  int open_ = 0;  // connections still served
  std::map<std::string, std::vector<std::unique_ptr<DeviceComm>>> groups_;
};

class TcpComm : public DeviceComm {
 public:
  // Member `member` of the `size`-rank group named `key` (the same key on every node).
  TcpComm(const net::Address& hub, const std::string& key, int size, int member);
  ~TcpComm() override;
  int rank() const override { return member_; }
  int size() const override { return size_; }
  void all_reduce(Tensor& x) override;
  Tensor all_gather_v(const Tensor& in) override;
  Tensor reduce_scatter_v(const Tensor& in, const std::vector<int64_t>& counts) override;
  Tensor all_to_all_v(const Tensor& in, const std::vector<int64_t>& send_counts,
                      std::vector<int64_t>* recv_counts) override;
  void broadcast(Tensor& x, int root) override;
  void barrier() override;
  std::vector<int64_t> all_gather_values(int64_t value) override;
  void abort();  // pending and later calls fail (a local rank failed)

 private:
  struct Reply {
    Tensor tensor;
    std::vector<int64_t> ints;
  };
  Reply call(uint32_t op, const Tensor& t, const std::vector<int64_t>& ints, int root = 0);
  int fd_;
  int size_, member_;
};

}  // namespace ms
