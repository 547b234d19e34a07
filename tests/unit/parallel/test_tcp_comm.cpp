// The multi-node backend in one process: ranks as threads that talk to an in-process hub over
// loopback TCP, checked against the shared-memory results; and a failed rank releasing peers.
#include <gtest/gtest.h>

#include <thread>

#include "parallel/tcp_comm.h"

namespace ms {
namespace {

TEST(TcpComm, CollectivesThroughTheHubMatchTheirDefinitions) {
  TcpHub hub(net::Address{"127.0.0.1", 0});  // a free port, whatever else runs beside
  const net::Address addr{"127.0.0.1", hub.port()};
  const int n = 3;
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        TcpComm c(addr, "g", n, r);
        Tensor x = Tensor::from_vector({float(r), float(10 * r)}, {1, 2});
        c.all_reduce(x);
        EXPECT_EQ(x.to_vector(), (std::vector<float>{3, 30}));
        Tensor rows = Tensor::from_vector(std::vector<float>(size_t(2 * r), float(r)), {r, 2});  // rank 0: none
        Tensor all = c.all_gather_v(rows);
        EXPECT_EQ(all.size(0), 0 + 1 + 2);
        Tensor part = c.reduce_scatter_v(Tensor::from_vector({1, 1, 2, 2, 3, 3}, {3, 2}), {1, 2, 0});
        EXPECT_EQ(part.size(0), r == 0 ? 1 : r == 1 ? 2 : 0);
        if (r == 1) EXPECT_EQ(part.to_vector(), (std::vector<float>{6, 6, 9, 9}));
        std::vector<int64_t> send = {1, 1, 1}, recv;
        Tensor a2a = c.all_to_all_v(Tensor::from_vector({float(r), float(r), float(r), float(r), float(r), float(r)}, {3, 2}),
                                    send, &recv);
        EXPECT_EQ(recv, (std::vector<int64_t>{1, 1, 1}));
        EXPECT_EQ(a2a.to_vector(), (std::vector<float>{0, 0, 1, 1, 2, 2}));
        EXPECT_EQ(c.all_gather_values(r + 5), (std::vector<int64_t>{5, 6, 7}));
        Tensor b = Tensor::from_vector({float(r)}, {1});
        c.broadcast(b, 2);
        EXPECT_EQ(b.to_vector(), std::vector<float>{2});
        c.barrier();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpComm, ARankThatDisconnectsReleasesItsPeers) {
  TcpHub hub(net::Address{"127.0.0.1", 0});  // a free port, whatever else runs beside
  const net::Address addr{"127.0.0.1", hub.port()};
  std::string error;
  std::thread waiting([&] {
    try {
      TcpComm c(addr, "g", 2, 1);
      Tensor x = Tensor::from_vector({1}, {1, 1});
      c.all_reduce(x);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  {
    TcpComm gone(addr, "g", 2, 0);  // joins, then leaves without calling
  }
  waiting.join();
  EXPECT_NE(error.find("peer rank failed"), std::string::npos) << error;
}

}  // namespace
}  // namespace ms
