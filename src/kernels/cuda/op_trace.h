// Where a stretch of GPU work loses its time (bench-one-batch --trace-ops): every op of
// kernels/ops.h dispatched to CUDA records an event before and after its kernels, so a report can
// split the stretch's wall time into each op's GPU time and the GPU's idle time before it, when
// the stream had drained and waited for the host to enqueue the op. The events break programmatic
// dependent launch between the ops they separate, so a traced run is a little slower than an
// untraced one; its purpose is to find gaps, not to time kernels.
#pragma once
#include <string>

namespace ms::cuda {

// Marks one op call; a no-op unless tracing (an atomic load, no lock), and during a stream capture.
class OpScope {
 public:
  explicit OpScope(const char* call);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  bool counted_ = false;  // this call is inside the trace (its nesting depth counted)
  int index_ = -1;        // its entry in the trace, -1 for none
};

// Starts tracing the ops this process dispatches to its current GPU's stream (one stream: rank
// threads are not traced apart).
void op_trace_start();
// Waits for the traced work, stops tracing and returns its table: per op name, calls, GPU time,
// the GPU's idle time before the op, and the host's time inside the call; then the largest gaps.
std::string op_trace_report();

}  // namespace ms::cuda
