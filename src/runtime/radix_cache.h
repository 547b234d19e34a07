// Radix tree over token ids whose edges carry the KV slots of those tokens, so a request whose
// prompt starts like an earlier one reuses its keys and values. The life of a prefix:
// match -> lock while a request reads it -> insert the request's tokens when it finishes (or at
// a chunk boundary) -> unlock -> evict, least recently used unlocked leaves first, when the
// pool needs slots. Evicted slots go back to the SlotAllocator.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "runtime/kv_pool.h"

namespace ms {

class RadixNode {
 public:
  std::vector<int32_t> key;    // the tokens of the edge into this node
  std::vector<int32_t> slots;  // their KV slots, one per token
  std::map<int32_t, std::unique_ptr<RadixNode>> children;  // by first token of the child's key
  RadixNode* parent = nullptr;
  int lock_ref = 0;
  uint64_t last_access = 0;
};

struct PrefixMatch {
  std::vector<int32_t> slots;  // slots of the matched prefix, in order
  RadixNode* last_node;        // deepest node of the match (the root when nothing matched)
};

class RadixCache {
 public:
  explicit RadixCache(SlotAllocator& pool);
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  // Longest cached prefix of `key`. A match ending inside an edge splits it, so the returned
  // node covers exactly the matched tokens and can be locked on its own.
  PrefixMatch match_prefix(std::span<const int32_t> key);
  // Adds key -> slots. Returns how many leading tokens were cached already: for those the tree
  // keeps its own slots, and the caller still owns (and must free) its slots[0, returned).
  int insert(std::span<const int32_t> key, std::span<const int32_t> slots);

  // A locked node and its ancestors are never evicted. Locks nest.
  void lock(RadixNode* node);
  void unlock(RadixNode* node);
  // Frees at least `num_tokens` slots (fewer when not enough are unlocked) from LRU leaves;
  // returns how many were freed.
  int64_t evict(int64_t num_tokens);
  // Drops every entry; only valid while nothing is locked.
  void reset();

  RadixNode* root() { return root_.get(); }
  int64_t evictable_size() const { return evictable_; }
  int64_t protected_size() const { return protected_; }
  int64_t total_size() const { return evictable_ + protected_; }

 private:
  RadixNode* split(RadixNode* child, size_t at);
  void free_subtree(RadixNode* node);

  SlotAllocator& pool_;
  std::unique_ptr<RadixNode> root_;
  uint64_t clock_ = 0;
  int64_t evictable_ = 0, protected_ = 0;
};

}  // namespace ms
