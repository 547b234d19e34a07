// Radix cache: match / insert / lock / evict, on hand-made cases and randomized against a
// naive model (a map from every cached prefix to the slot of its last token).
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "core/check.h"
#include "runtime/radix_cache.h"

namespace ms {
namespace {

using Ids = std::vector<int32_t>;
using Naive = std::map<Ids, int32_t>;

Ids take(SlotAllocator& pool, int n) {
  Ids s;
  EXPECT_TRUE(pool.alloc(n, s));
  return s;
}

// Every cached prefix (root to each token of each edge) and its slot.
void enumerate(const RadixNode* node, Ids& path, Naive& out) {
  const size_t base = path.size();
  for (size_t i = 0; i < node->key.size(); ++i) {
    path.push_back(node->key[i]);
    out[path] = node->slots[i];
  }
  for (const auto& [tok, child] : node->children) {
    EXPECT_EQ(child->parent, node);
    EXPECT_EQ(child->key.at(0), tok);
    enumerate(child.get(), path, out);
  }
  path.resize(base);
}

Naive contents(RadixCache& c) {
  Naive out;
  Ids path;
  enumerate(c.root(), path, out);
  return out;
}

TEST(RadixCache, MatchInsertAndSplit) {
  SlotAllocator pool(64);
  RadixCache c(pool);
  Ids a = take(pool, 4);
  EXPECT_EQ(c.insert(Ids{1, 2, 3, 4}, a), 0);
  PrefixMatch m = c.match_prefix(Ids{1, 2, 3, 9});
  EXPECT_EQ(m.slots, Ids(a.begin(), a.begin() + 3));
  EXPECT_EQ(m.last_node->key, (Ids{1, 2, 3}));  // the edge was split at the mismatch
  EXPECT_EQ(c.total_size(), 4);

  Ids b = take(pool, 5);
  EXPECT_EQ(c.insert(Ids{1, 2, 7, 8, 9}, b), 2);  // [1, 2] was cached: the caller keeps b[0..2)
  pool.free(std::span<const int32_t>(b.data(), 2));
  EXPECT_EQ(c.total_size(), 7);
  EXPECT_EQ(c.match_prefix(Ids{1, 2, 7, 8, 9, 10}).slots, (Ids{a[0], a[1], b[2], b[3], b[4]}));
  EXPECT_TRUE(c.match_prefix(Ids{5, 1}).slots.empty());
  EXPECT_EQ(c.match_prefix(Ids{5}).last_node, c.root());
  EXPECT_EQ(pool.used(), 7);
}

TEST(RadixCache, LockedPrefixesSurviveEviction) {
  SlotAllocator pool(64);
  RadixCache c(pool);
  c.insert(Ids{1, 2, 3, 4}, take(pool, 4));
  Ids dup = take(pool, 4);
  EXPECT_EQ(c.insert(Ids{1, 2, 5, 6}, dup), 2);
  pool.free(std::span<const int32_t>(dup.data(), 2));
  PrefixMatch m = c.match_prefix(Ids{1, 2, 3, 4});
  c.lock(m.last_node);
  EXPECT_EQ(c.protected_size(), 4);
  EXPECT_EQ(c.evictable_size(), 2);
  EXPECT_EQ(c.evict(100), 2);  // only [5, 6] may go
  EXPECT_EQ(c.match_prefix(Ids{1, 2, 3, 4}).slots.size(), 4u);
  EXPECT_EQ(c.match_prefix(Ids{1, 2, 5}).slots.size(), 2u);
  // A split of a locked edge keeps both halves locked, and one unlock releases both.
  c.match_prefix(Ids{1, 2, 3});
  EXPECT_EQ(c.protected_size(), 4);
  c.unlock(m.last_node);
  EXPECT_EQ(c.protected_size(), 0);
  EXPECT_EQ(c.evictable_size(), 4);
  EXPECT_EQ(c.evict(100), 4);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(c.total_size(), 0);
}

TEST(RadixCache, EvictsLeastRecentlyUsedLeavesFirst) {
  SlotAllocator pool(64);
  RadixCache c(pool);
  c.insert(Ids{1, 1}, take(pool, 2));
  c.insert(Ids{2, 2}, take(pool, 2));
  c.insert(Ids{3, 3}, take(pool, 2));
  c.match_prefix(Ids{1, 1});  // now [2, 2] is the oldest, then [3, 3]
  EXPECT_EQ(c.evict(1), 2);   // whole leaves go
  EXPECT_TRUE(c.match_prefix(Ids{2, 2}).slots.empty());
  EXPECT_EQ(c.evict(1), 2);
  EXPECT_TRUE(c.match_prefix(Ids{3, 3}).slots.empty());
  EXPECT_EQ(c.match_prefix(Ids{1, 1}).slots.size(), 2u);
  // A parent becomes evictable once its last child is gone.
  c.insert(Ids{1, 1, 4}, take(pool, 3));  // caller keeps the first two slots it passed
  EXPECT_EQ(c.total_size(), 3);
  EXPECT_EQ(c.evict(3), 3);
  EXPECT_EQ(c.total_size(), 0);
}

TEST(RadixCache, ResetRefusesWhileLockedAndFreesEverything) {
  SlotAllocator pool(16);
  RadixCache c(pool);
  c.insert(Ids{1, 2}, take(pool, 2));
  PrefixMatch m = c.match_prefix(Ids{1, 2});
  c.lock(m.last_node);
  EXPECT_THROW(c.reset(), Error);
  c.unlock(m.last_node);
  c.reset();
  EXPECT_EQ(pool.used(), 0);
  EXPECT_TRUE(c.match_prefix(Ids{1, 2}).slots.empty());
}

struct Locked {
  RadixNode* node;
  Ids path;
};

// Prefixes that some lock protects (every prefix of a locked path).
int64_t protected_count(const Naive& naive, const std::vector<Locked>& locks) {
  int64_t n = 0;
  for (const auto& [prefix, slot] : naive)
    for (const Locked& l : locks)
      if (prefix.size() <= l.path.size() && std::equal(prefix.begin(), prefix.end(), l.path.begin())) {
        ++n;
        break;
      }
  return n;
}

Ids expected_match(const Naive& naive, const Ids& key) {
  Ids out;
  for (size_t i = 1; i <= key.size(); ++i) {
    auto it = naive.find(Ids(key.begin(), key.begin() + std::ptrdiff_t(i)));
    if (it == naive.end()) break;
    out.push_back(it->second);
  }
  return out;
}

TEST(RadixCache, RandomizedAgainstNaiveModel) {
  std::mt19937 rng(1234);
  SlotAllocator pool(96);
  RadixCache c(pool);
  Naive naive;
  std::vector<Locked> locks;
  auto random_key = [&] {
    Ids k(size_t(std::uniform_int_distribution<int>(1, 10)(rng)));
    for (auto& t : k) t = std::uniform_int_distribution<int>(0, 3)(rng);
    return k;
  };
  int evictions = 0, splits_seen = 0;
  for (int step = 0; step < 4000; ++step) {
    const int op = std::uniform_int_distribution<int>(0, 99)(rng);
    if (op < 40) {
      Ids key = random_key();
      if (pool.available() < int64_t(key.size())) {
        c.evict(int64_t(key.size()) - pool.available());
        Naive after = contents(c);
        for (const auto& [prefix, slot] : after) ASSERT_EQ(naive.at(prefix), slot);
        naive = std::move(after);
      }
      if (pool.available() < int64_t(key.size())) continue;
      Ids slots = take(pool, int(key.size()));
      const size_t expect_present = expected_match(naive, key).size();
      const int present = c.insert(key, slots);
      ASSERT_EQ(size_t(present), expect_present) << "step " << step;
      pool.free(std::span<const int32_t>(slots.data(), size_t(present)));
      for (size_t i = size_t(present) + 1; i <= key.size(); ++i)
        naive[Ids(key.begin(), key.begin() + std::ptrdiff_t(i))] = slots[i - 1];
    } else if (op < 65) {
      Ids key = random_key();
      const size_t nodes_before = contents(c).size();
      PrefixMatch m = c.match_prefix(key);
      ASSERT_EQ(m.slots, expected_match(naive, key)) << "step " << step;
      ASSERT_EQ(contents(c).size(), nodes_before);
      splits_seen += m.last_node != c.root() && m.slots.size() < key.size();
      if (rng() % 2 && m.last_node != c.root()) {
        c.lock(m.last_node);
        locks.push_back({m.last_node, Ids(key.begin(), key.begin() + std::ptrdiff_t(m.slots.size()))});
      }
    } else if (op < 80) {
      if (locks.empty()) continue;
      const size_t i = rng() % locks.size();
      c.unlock(locks[i].node);
      locks.erase(locks.begin() + std::ptrdiff_t(i));
    } else {
      const int64_t want = std::uniform_int_distribution<int64_t>(0, 20)(rng);
      const int64_t evictable_before = c.evictable_size();
      const int64_t freed = c.evict(want);
      Naive after = contents(c);
      ASSERT_EQ(int64_t(naive.size() - after.size()), freed);
      for (const auto& [prefix, slot] : after) ASSERT_EQ(naive.at(prefix), slot);
      if (freed < want) ASSERT_EQ(c.evictable_size(), 0) << "eviction stopped early";
      ASSERT_EQ(c.evictable_size(), evictable_before - freed);
      naive = std::move(after);
      ++evictions;
    }
    ASSERT_EQ(contents(c), naive) << "step " << step << " op " << op;
    ASSERT_EQ(pool.used(), int64_t(naive.size()));
    ASSERT_EQ(c.total_size(), int64_t(naive.size()));
    ASSERT_EQ(c.protected_size(), protected_count(naive, locks)) << "step " << step;
    for (const Locked& l : locks) ASSERT_EQ(expected_match(naive, l.path).size(), l.path.size());
  }
  EXPECT_GT(evictions, 100);
  EXPECT_GT(splits_seen, 100);
  for (const Locked& l : locks) c.unlock(l.node);
  EXPECT_EQ(c.protected_size(), 0);
  c.evict(1 << 20);
  EXPECT_EQ(pool.used(), 0);
}

}  // namespace
}  // namespace ms
