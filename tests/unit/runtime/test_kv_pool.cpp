// Token-slot pool: allocation and frees (a double free is caught, since it would hand one slot
// to two requests), req_to_token rows, and the pool size from a memory budget.
#include <gtest/gtest.h>

#include "core/check.h"
#include "runtime/kv_pool.h"

namespace ms {
namespace {

TEST(SlotAllocator, AllocatesFreesAndCatchesDoubleFrees) {
  SlotAllocator pool(8);
  std::vector<int32_t> a, b;
  ASSERT_TRUE(pool.alloc(5, a));
  EXPECT_EQ(a, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(pool.alloc(4, b));
  EXPECT_TRUE(b.empty()) << "a failed allocation takes nothing";
  EXPECT_EQ(pool.available(), 3);
  pool.free(std::span<const int32_t>(a.data() + 1, 2));
  EXPECT_EQ(pool.used(), 3);
  EXPECT_THROW(pool.free(std::span<const int32_t>(a.data() + 1, 1)), Error);
  EXPECT_THROW(pool.free(std::vector<int32_t>{8}), Error);
  ASSERT_TRUE(pool.alloc(5, b));
  std::sort(b.begin(), b.end());
  EXPECT_EQ(b, (std::vector<int32_t>{1, 2, 5, 6, 7}));
}

// A request's freed slots come back in their order, so consecutive slots stay consecutive for
// the next request (the prefill attention copies a run of 128 as one box).
TEST(SlotAllocator, FreedRunsComeBackInOrder) {
  SlotAllocator pool(16);
  std::vector<int32_t> a, b, c;
  ASSERT_TRUE(pool.alloc(6, a));
  ASSERT_TRUE(pool.alloc(10, b));
  pool.free(b);
  ASSERT_TRUE(pool.alloc(4, c));
  EXPECT_EQ(c, (std::vector<int32_t>{6, 7, 8, 9}));
}

TEST(ReqToTokenTable, RowsAreHandedOutOnceAndCleared) {
  ReqToTokenTable t(2, 4);
  int r0 = t.alloc_row(), r1 = t.alloc_row();
  EXPECT_NE(r0, r1);
  EXPECT_THROW(t.alloc_row(), Error);
  t.row(r0)[3] = 17;
  t.free_row(r0);
  EXPECT_EQ(t.alloc_row(), r0);
  EXPECT_EQ(t.row(r0)[3], -1);
}

TEST(KvPoolSlots, FromTokensOrFromAMemoryFraction) {
  KvBudget b;
  b.max_total_tokens = 1000;
  EXPECT_EQ(kv_pool_slots(b, 4096, {}), 1000);
  b.max_total_tokens = 0;
  b.mem_fraction_static = 0.5;
  b.max_running_requests = 1000;
  b.context_len = 1000;
  // 1 GiB total, 700 MiB free: KV gets 700 - 512 = 188 MiB.
  MemoryInfo m{700ull << 20, 1ull << 30};
  EXPECT_EQ(kv_pool_slots(b, 1 << 10, m), (188ll << 20) >> 10);
  b.max_running_requests = 2;  // no more than two full-length sequences can use
  EXPECT_EQ(kv_pool_slots(b, 1 << 10, m), 2000);
  b.mem_fraction_static = 0.2;  // 800 MiB kept for the rest: nothing left
  EXPECT_THROW(kv_pool_slots(b, 1 << 10, m), Error);
  b.mem_fraction_static = 1.5;
  EXPECT_THROW(kv_pool_slots(b, 1 << 10, m), Error);
  MemoryInfo host = host_memory_info();
  EXPECT_GT(host.total_bytes, 0u);
  EXPECT_LE(host.free_bytes, host.total_bytes);
}

}  // namespace
}  // namespace ms
