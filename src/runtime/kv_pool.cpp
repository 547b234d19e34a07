#include "runtime/kv_pool.h"

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>

#include "core/check.h"

namespace ms {

SlotAllocator::SlotAllocator(int64_t num_slots) : capacity_(num_slots) {
  MS_CHECK(num_slots > 0 && num_slots <= INT32_MAX, "KV pool: ", num_slots, " slots is out of range");
  free_.resize(size_t(num_slots));
  // Slot 0 on top of the stack, so a fresh pool hands out ascending slots.
  std::iota(free_.rbegin(), free_.rend(), 0);
  in_use_.assign(size_t(num_slots), 0);
}

bool SlotAllocator::alloc(int64_t n, std::vector<int32_t>& out) {
  if (n > available()) return false;
  for (int64_t i = 0; i < n; ++i) {
    int32_t s = free_.back();
    free_.pop_back();
    in_use_[size_t(s)] = 1;
    out.push_back(s);
  }
  return true;
}

void SlotAllocator::free(std::span<const int32_t> slots) {
  // Pushed last to first, so the next allocation takes them back in their order: a run of
  // consecutive slots stays a run, which the prefill attention reads as one box of the cache.
  for (auto it = slots.rbegin(); it != slots.rend(); ++it) {
    const int32_t s = *it;
    MS_CHECK(s >= 0 && s < capacity_ && in_use_[size_t(s)], "KV pool: slot ", s, " freed twice or never allocated");
    in_use_[size_t(s)] = 0;
    free_.push_back(s);
  }
}

ReqToTokenTable::ReqToTokenTable(int rows, int context_len) : context_len_(context_len) {
  MS_CHECK(rows > 0 && context_len > 0, "req_to_token: ", rows, " rows of ", context_len, " positions");
  table_.assign(size_t(rows) * size_t(context_len), -1);
  for (int r = rows - 1; r >= 0; --r) free_rows_.push_back(r);
}

int ReqToTokenTable::alloc_row() {
  MS_CHECK(!free_rows_.empty(), "req_to_token: all ", rows(), " rows are in use");
  int r = free_rows_.back();
  free_rows_.pop_back();
  ++used_;
  return r;
}

void ReqToTokenTable::free_row(int r) {
  MS_ASSERT(r >= 0 && used_ > 0);
  std::fill_n(row(r), context_len_, -1);
  free_rows_.push_back(r);
  --used_;
}

int64_t kv_pool_slots(const KvBudget& b, size_t bytes_per_slot, const MemoryInfo& m) {
  MS_CHECK(bytes_per_slot > 0, "KV pool: zero bytes per token slot");
  if (b.max_total_tokens > 0) return b.max_total_tokens;
  MS_CHECK(b.mem_fraction_static > 0 && b.mem_fraction_static < 1, "--mem-fraction-static must be in (0, 1), got ",
           b.mem_fraction_static);
  MS_CHECK(m.total_bytes > 0, "device memory size is unknown: pass --max-total-tokens");
  const double reserved = (1.0 - b.mem_fraction_static) * double(m.total_bytes);
  const double kv_bytes = double(m.free_bytes) - reserved;
  MS_CHECK(kv_bytes >= double(bytes_per_slot), "no memory left for the KV cache: ", m.free_bytes >> 20,
           " MiB free of ", m.total_bytes >> 20, " MiB and --mem-fraction-static ", b.mem_fraction_static,
           " keeps ", int64_t(reserved) >> 20, " MiB for the rest; raise it or pass --max-total-tokens");
  const double useful = double(std::max(b.max_running_requests, 1)) * double(std::max(b.context_len, 1));
  return int64_t(std::min({kv_bytes / double(bytes_per_slot), useful, double(INT32_MAX)}));
}

MemoryInfo host_memory_info() {
  std::ifstream in("/proc/meminfo");
  MemoryInfo m;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream is(line);
    std::string key;
    size_t kib = 0;
    is >> key >> kib;
    if (key == "MemTotal:") m.total_bytes = kib << 10;
    if (key == "MemAvailable:") m.free_bytes = kib << 10;
  }
  return m;
}

}  // namespace ms
