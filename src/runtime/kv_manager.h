// The KV bookkeeping of requests: slot pool, req_to_token rows and the radix cache, kept
// consistent. Every slot is owned by exactly one of: the free list, the radix tree, or the
// request whose row holds it at a position >= its prefix_len. Tests check that invariant.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/kv_pool.h"
#include "runtime/radix_cache.h"
#include "runtime/request.h"

namespace ms {

class KvManager {
 public:
  KvManager(int64_t num_slots, int rows, int context_len, bool enable_radix_cache);

  // Slots a new allocation can get: free ones plus unlocked cached ones (evicted on demand).
  int64_t available() const { return pool_.available() + (radix_ ? radix_->evictable_size() : 0); }
  int64_t capacity() const { return pool_.capacity(); }
  int context_len() const { return table_.context_len(); }
  int free_rows() const { return table_.available_rows(); }

  // Gives r a row and, with the radix cache, the longest cached prefix of its tokens (all but
  // the last, whose logits must be computed), locked. Sets kv_len = prefix_len.
  void admit(Request& r);
  // Appends n fresh slots for positions [kv_len, kv_len + n) to r's row and to `out`, evicting
  // cached prefixes when needed; false (nothing taken) when even that is not enough.
  bool extend(Request& r, int n, std::vector<int32_t>& out);
  // extend for a speculative verify: slots for r's last token and n - 1 draft tokens that are
  // not among its tokens yet (up to the end of its row).
  bool extend_speculative(Request& r, int n, std::vector<int32_t>& out);
  // Frees the slots of positions [kv_len, r.kv_len) (rejected drafts) and sets r.kv_len.
  void rollback(Request& r, int kv_len);
  // After a chunk of r was computed (kv_len advanced): caches its tokens so far, so the next
  // chunk and other requests can match them, and locks the new prefix in place of the old.
  void cache_chunk(Request& r);
  // Gives back all r holds: with `cache`, its computed tokens go into the radix cache (the
  // duplicates of what is there already are freed); otherwise its own slots are freed.
  void release(Request& r, bool cache);
  // Drops the radix cache; only valid while no request holds a prefix.
  void flush();

  const SlotAllocator& pool() const { return pool_; }
  const ReqToTokenTable& table() const { return table_; }
  const RadixCache* radix() const { return radix_.get(); }
  RadixCache* radix() { return radix_.get(); }

 private:
  bool take_slots(Request& r, int n, std::vector<int32_t>& out);

  SlotAllocator pool_;
  ReqToTokenTable table_;
  std::unique_ptr<RadixCache> radix_;
};

}  // namespace ms
