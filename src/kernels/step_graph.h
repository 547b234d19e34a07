// Captured steps (CUDA graphs): a step's launches recorded once and replayed with new metadata.
// While a step is captured, the ops that receive exactly the host arrays named here read fixed
// device copies of them instead of uploading their own, and attention sizes its split-KV work
// from `max_kv` rather than from this batch's lengths; a replay refreshes the copies in one
// upload and launches the graph, with no other host work and no host sync.
#pragma once
#include <functional>
#include <memory>
#include <span>

#include "kernels/ops.h"

namespace ms::ops {

struct StepArrays {
  std::span<const int32_t> input_ids, positions, out_cache_loc;
  const AttentionLayout* layout = nullptr;
};

class StepGraph {
 public:
  virtual ~StepGraph() = default;
  // Same token and sequence counts as captured, at most the captured KV-slot capacity.
  virtual void replay(const StepArrays& arrays) = 0;
};

// Device memory that captured steps own. What a capture allocates comes from its pool and goes
// back to it, never to the rest of the program: every replay rewrites the capture's
// intermediates, so no block of them may be handed to a tensor that lives across a replay (an
// expert table or a cache made after the capture, a result kept from step to step). Graphs may
// share a pool when they never run at the same time and each one's outputs are read before
// another of them replays (its outputs may lie in the others' intermediates). The blocks return
// to the shared cache when the pool is destroyed, after its graphs.
class GraphPool {
 public:
  virtual ~GraphPool() = default;
};
std::shared_ptr<GraphPool> make_graph_pool(Device device);

// Captures `body`, which runs the step over `arrays` (already run once eagerly at this size, so
// that every allocation, GEMM plan and table it needs exists), on `device`'s stream in this
// thread's capture mode (ranks are threads), allocating from `pool`. kv_capacity: the most KV
// slots a replay may name.
std::unique_ptr<StepGraph> capture_step(Device device, const StepArrays& arrays, int64_t kv_capacity, int max_kv,
                                        GraphPool& pool, const std::function<void()>& body);

}  // namespace ms::ops
