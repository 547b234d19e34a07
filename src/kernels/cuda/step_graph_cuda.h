// The CUDA side of kernels/step_graph.h, and the thread's staged step that upload_i32 and
// attention consult while a step is being captured.
#pragma once
#include <vector>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {

struct StagedStep {
  struct Array {
    const int32_t* host;
    Tensor device;
  };
  std::vector<Array> arrays;             // ids, positions, out_cache_loc, kv_slots
  const ops::AttentionLayout* layout = nullptr;
  Tensor begin, visible;                 // per query: first kv index, visible keys
  int max_kv = 0;
  // Constant uploads made during capture (e.g. last-token rows) copy from here at every replay.
  char* pinned = nullptr;
  size_t pinned_used = 0, pinned_capacity = 0;
};

// This thread's step under capture, or null.
StagedStep* staged_step();

// The pool this thread's allocations come from while it captures (null: the shared cache).
void set_capture_pool(ops::GraphPool* pool);

}  // namespace ms::cuda
