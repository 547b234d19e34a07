// Every collective of the shared-memory backend, with uneven row counts (including an empty
// rank), against the result computed directly from all ranks' inputs.
#include <gtest/gtest.h>

#include <thread>

#include "parallel/groups.h"
#include "core/check.h"
#include "parallel/shm_comm.h"

namespace ms {
namespace {

constexpr int kWidth = 3;

// Rank r's input: (r + 1) rows when uneven (rank 2 has none), row i filled with 100r + 10i + column.
Tensor rank_rows(int r, int rows) {
  Tensor t = Tensor::empty(DType::F32, {rows, kWidth});
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < kWidth; ++c) t.data<float>()[i * kWidth + c] = float(100 * r + 10 * i + c);
  return t;
}
int rows_of(int r) { return r == 2 ? 0 : r + 1; }

void run_ranks(int n, const std::function<void(DeviceComm&)>& body) {
  auto comms = ShmComm::create_group(n);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(ShmComm, AllReduceSumsIdenticallyOnEveryRank) {
  run_ranks(4, [](DeviceComm& c) {
    Tensor x = rank_rows(c.rank(), 2);
    c.all_reduce(x);
    for (int i = 0; i < 2; ++i)
      for (int col = 0; col < kWidth; ++col)
        EXPECT_EQ(x.data<float>()[i * kWidth + col], float(100 * 6 + 4 * (10 * i + col)));
  });
}

TEST(ShmComm, AllGatherVStacksUnevenRowsInRankOrder) {
  run_ranks(4, [](DeviceComm& c) {
    Tensor out = c.all_gather_v(rank_rows(c.rank(), rows_of(c.rank())));
    ASSERT_EQ(out.size(0), 1 + 2 + 0 + 4);
    int row = 0;
    for (int r = 0; r < 4; ++r)
      for (int i = 0; i < rows_of(r); ++i, ++row) EXPECT_EQ(out.data<float>()[row * kWidth + 1], float(100 * r + 10 * i + 1));
  });
}

TEST(ShmComm, ReduceScatterVGivesEachRankItsSlice) {
  const std::vector<int64_t> counts = {1, 2, 0, 4};
  run_ranks(4, [&](DeviceComm& c) {
    Tensor x = rank_rows(c.rank(), 7);
    Tensor out = c.reduce_scatter_v(x, counts);
    int64_t first = 0;
    for (int r = 0; r < c.rank(); ++r) first += counts[r];
    ASSERT_EQ(out.size(0), counts[c.rank()]);
    for (int i = 0; i < counts[c.rank()]; ++i)
      EXPECT_EQ(out.data<float>()[i * kWidth], float(600 + 4 * 10 * (first + i)));
  });
}

TEST(ShmComm, AllToAllVRoutesRowsToTheirDestinations) {
  // Rank s sends (s + d) % 3 rows to rank d; row j of that block is tagged 1000s + 10d + j.
  run_ranks(3, [](DeviceComm& c) {
    const int s = c.rank();
    std::vector<int64_t> send;
    std::vector<float> vals;
    for (int d = 0; d < 3; ++d) {
      send.push_back((s + d) % 3);
      for (int j = 0; j < (s + d) % 3; ++j)
        for (int col = 0; col < kWidth; ++col) vals.push_back(float(1000 * s + 10 * d + j));
    }
    Tensor in = Tensor::from_vector(vals, {int64_t(vals.size()) / kWidth, kWidth});
    std::vector<int64_t> recv;
    Tensor out = c.all_to_all_v(in, send, &recv);
    int row = 0;
    for (int src = 0; src < 3; ++src) {
      ASSERT_EQ(recv[src], (src + s) % 3);
      for (int j = 0; j < recv[src]; ++j, ++row) EXPECT_EQ(out.data<float>()[row * kWidth], float(1000 * src + 10 * s + j));
    }
  });
}

TEST(ShmComm, BroadcastAndValues) {
  run_ranks(3, [](DeviceComm& c) {
    Tensor x = rank_rows(c.rank(), 2);
    c.broadcast(x, 1);
    EXPECT_EQ(x.data<float>()[kWidth], 110.0f);
    auto v = c.all_gather_values(c.rank() * 7);
    EXPECT_EQ(v, (std::vector<int64_t>{0, 7, 14}));
    c.barrier();
  });
}

TEST(ShmComm, MismatchedAllReduceIsAnError) {
  auto comms = ShmComm::create_group(2);
  std::string err0, err1;
  std::thread a([&] {
    try {
      Tensor x = rank_rows(0, 1);
      comms[0]->all_reduce(x);
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  std::thread b([&] {
    try {
      Tensor x = rank_rows(1, 2);
      comms[1]->all_reduce(x);
    } catch (const std::exception& e) {
      err1 = e.what();
    }
  });
  a.join(), b.join();
  EXPECT_NE(err0.find("all_reduce"), std::string::npos);
  EXPECT_NE(err1.find("all_reduce"), std::string::npos);
}

TEST(ShmComm, AbortReleasesRanksWaitingForAFailedPeer) {
  auto comms = ShmComm::create_group(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> threads;
  for (int r = 1; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        Tensor x = rank_rows(r, 1);
        comms[r]->all_reduce(x);  // rank 0 never comes
      } catch (const PeerAborted& e) {
        errors[r] = e.what();
      }
    });
  static_cast<ShmComm*>(comms[0].get())->abort();  // what a failing rank's runner does
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[1].find("peer rank failed"), std::string::npos);
  EXPECT_NE(errors[2].find("peer rank failed"), std::string::npos);
}

TEST(ParallelGroups, FollowSglangRankLayout) {
  ParallelConfig c;
  c.tp_size = 4, c.dp_size = 2, c.enable_dp_attention = true, c.ep_size = 2;
  auto g = LocalGroups::create(c);
  EXPECT_EQ(c.attn_tp_size(), 2);
  EXPECT_EQ(c.moe_tp_size(), 2);
  const auto& r3 = g->rank(3);
  EXPECT_EQ(r3.layout.attn_tp_rank, 1);
  EXPECT_EQ(r3.layout.attn_dp_rank, 1);
  EXPECT_EQ(r3.layout.ep_rank, 1);
  EXPECT_EQ(r3.layout.moe_tp_rank, 1);
  EXPECT_EQ(r3.attn_tp->size(), 2);
  EXPECT_EQ(r3.attn_tp->rank(), 1);
  EXPECT_EQ(r3.dp->size(), 2);
  EXPECT_EQ(r3.dp->rank(), 1);
  EXPECT_EQ(r3.world->size(), 4);
  ParallelConfig bad = c;
  bad.dp_size = 3;
  EXPECT_THROW(bad.validate(), Error);
}

}  // namespace
}  // namespace ms
