#include "runtime/kv_manager.h"

#include <algorithm>

#include "core/check.h"

namespace ms {

KvManager::KvManager(int64_t num_slots, int rows, int context_len, bool enable_radix_cache)
    : pool_(num_slots), table_(rows, context_len) {
  if (enable_radix_cache) radix_ = std::make_unique<RadixCache>(pool_);
}

void KvManager::admit(Request& r) {
  MS_ASSERT(r.row < 0 && r.kv_len == 0 && r.fill_len() > 0);
  MS_CHECK(r.fill_len() <= table_.context_len(), "request ", r.id, " has ", r.fill_len(),
           " tokens, more than the context length ", table_.context_len());
  r.row = table_.alloc_row();
  r.prefix_len = r.kv_len = 0;
  r.last_node = nullptr;
  if (!radix_) return;
  const std::vector<int32_t> ids = r.fill_ids();
  PrefixMatch m = radix_->match_prefix(std::span<const int32_t>(ids.data(), ids.size() - 1));
  radix_->lock(m.last_node);
  r.last_node = m.last_node;
  std::copy(m.slots.begin(), m.slots.end(), table_.row(r.row));
  r.prefix_len = r.kv_len = int(m.slots.size());
}

bool KvManager::extend(Request& r, int n, std::vector<int32_t>& out) {
  MS_ASSERT(r.row >= 0 && n >= 0 && r.kv_len + n <= r.fill_len());
  return take_slots(r, n, out);
}

bool KvManager::extend_speculative(Request& r, int n, std::vector<int32_t>& out) {
  MS_ASSERT(r.row >= 0 && n >= 1 && r.kv_len + 1 == r.fill_len() && r.kv_len + n <= table_.context_len());
  return take_slots(r, n, out);
}

void KvManager::rollback(Request& r, int kv_len) {
  MS_ASSERT(r.row >= 0 && kv_len >= r.prefix_len && kv_len <= r.kv_len);
  int32_t* row = table_.row(r.row);
  pool_.free(std::span<const int32_t>(row + kv_len, size_t(r.kv_len - kv_len)));
  std::fill(row + kv_len, row + r.kv_len, -1);
  r.kv_len = kv_len;
}

bool KvManager::take_slots(Request& r, int n, std::vector<int32_t>& out) {
  if (n > pool_.available() && radix_) radix_->evict(n - pool_.available());
  const size_t before = out.size();
  if (!pool_.alloc(n, out)) return false;
  std::copy(out.begin() + std::ptrdiff_t(before), out.end(), table_.row(r.row) + r.kv_len);
  return true;
}

void KvManager::cache_chunk(Request& r) {
  if (!radix_) return;
  const std::vector<int32_t> ids = r.fill_ids();
  std::span<const int32_t> key(ids.data(), size_t(r.kv_len));
  int32_t* row = table_.row(r.row);
  const int present = radix_->insert(key, std::span<const int32_t>(row, size_t(r.kv_len)));
  MS_ASSERT(present >= r.prefix_len);
  pool_.free(std::span<const int32_t>(row + r.prefix_len, size_t(present - r.prefix_len)));
  // Re-match: the row must now name the tree's slots, and the lock must cover all of them.
  PrefixMatch m = radix_->match_prefix(key);
  MS_ASSERT(int(m.slots.size()) == r.kv_len);
  std::copy(m.slots.begin(), m.slots.end(), row);
  radix_->lock(m.last_node);
  radix_->unlock(r.last_node);
  r.last_node = m.last_node;
  r.prefix_len = r.kv_len;
}

void KvManager::release(Request& r, bool cache) {
  if (r.row < 0) return;
  int32_t* row = table_.row(r.row);
  if (radix_ && cache && r.kv_len > 0) {
    const std::vector<int32_t> ids = r.fill_ids();
    const int present = radix_->insert(std::span<const int32_t>(ids.data(), size_t(r.kv_len)),
                                       std::span<const int32_t>(row, size_t(r.kv_len)));
    MS_ASSERT(present >= r.prefix_len);
    pool_.free(std::span<const int32_t>(row + r.prefix_len, size_t(present - r.prefix_len)));
  } else {
    pool_.free(std::span<const int32_t>(row + r.prefix_len, size_t(r.kv_len - r.prefix_len)));
  }
  if (radix_ && r.last_node) radix_->unlock(r.last_node);
  table_.free_row(r.row);
  r.row = -1;
  r.kv_len = r.prefix_len = 0;
  r.last_node = nullptr;
}

void KvManager::flush() {
  if (radix_) radix_->reset();
}

}  // namespace ms
