// KV memory as a pool of token slots (page size 1): a free-slot allocator over the model's
// KvCache, the req_to_token table that maps each request's positions to slots, and the rule
// that sizes the pool from a memory budget. Slot bookkeeping only: the slots' contents live in
// the KvCache the model runner owns.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace ms {

class SlotAllocator {
 public:
  explicit SlotAllocator(int64_t num_slots);
  int64_t capacity() const { return capacity_; }
  int64_t available() const { return int64_t(free_.size()); }
  int64_t used() const { return capacity_ - available(); }
  // Takes n slots into `out` (appended); false and nothing taken when fewer are free.
  bool alloc(int64_t n, std::vector<int32_t>& out);
  void free(std::span<const int32_t> slots);

 private:
  int64_t capacity_;
  std::vector<int32_t> free_;  // a stack: recently freed slots are reused first (warm memory)
  std::vector<uint8_t> in_use_;  // catches double frees, which would hand one slot to two requests
};

// req_to_token[row, pos] = slot of position pos of the request that holds the row.
class ReqToTokenTable {
 public:
  ReqToTokenTable(int rows, int context_len);
  int rows() const { return int(free_rows_.size() + used_); }
  int context_len() const { return context_len_; }
  int available_rows() const { return int(free_rows_.size()); }
  int alloc_row();  // throws when none is free (the scheduler caps running requests first)
  void free_row(int row);
  int32_t* row(int r) { return table_.data() + size_t(r) * size_t(context_len_); }
  const int32_t* row(int r) const { return table_.data() + size_t(r) * size_t(context_len_); }

 private:
  int context_len_;
  int used_ = 0;
  std::vector<int32_t> table_;
  std::vector<int> free_rows_;
};

struct KvBudget {
  int64_t max_total_tokens = 0;     // > 0: exactly this many slots
  double mem_fraction_static = 0;   // else: this fraction of device memory holds weights + KV
  int max_running_requests = 0;
  int context_len = 0;              // longest sequence (max_position_embeddings)
};

struct MemoryInfo {
  size_t free_bytes = 0, total_bytes = 0;
};

// Slots for the pool. With a fraction f, KV gets what stays free once (1 - f) of the device's
// memory is left to everything else (SGLang's rule: free - (1 - f) * total, measured after the
// weights are loaded), capped at what max_running_requests full-length sequences could use.
int64_t kv_pool_slots(const KvBudget& budget, size_t bytes_per_slot, const MemoryInfo& memory);

// Host memory from /proc/meminfo (MemAvailable, MemTotal): the CPU backend's device memory.
MemoryInfo host_memory_info();

}  // namespace ms
