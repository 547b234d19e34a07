// Captured steps on the GPU. The arena holds one step's metadata at fixed addresses
// (ids, positions, slots, per-query kv begin and visible count, then the kv slots); a replay
// writes the new step into pinned memory, copies it over in one upload and launches the graph.
#include <algorithm>
#include <cstring>

#include "kernels/cuda/step_graph_cuda.h"

namespace ms::cuda {
namespace {

thread_local StagedStep* t_staged = nullptr;

constexpr size_t kPinnedConstants = size_t(1) << 20;

// Per query of the layout: its sequence's first kv index and how many keys it sees (causal).
void query_ranges(const ops::AttentionLayout& l, int32_t* begin, int32_t* visible) {
  int t = 0;
  for (int s = 0; s < l.num_seqs(); ++s) {
    const int nq = l.q_start[s + 1] - l.q_start[s], nk = l.kv_start[s + 1] - l.kv_start[s];
    MS_CHECK(nq <= nk, "captured step: sequence ", s, " has ", nq, " queries but only ", nk, " keys");
    for (int i = 0; i < nq; ++i, ++t) begin[t] = l.kv_start[s], visible[t] = nk - nq + i + 1;
  }
}

class CudaStepGraph final : public ops::StepGraph {
 public:
  CudaStepGraph(const ops::StepArrays& a, int64_t kv_capacity)
      : tokens_(int64_t(a.input_ids.size())), seqs_(a.layout->num_seqs()), capacity_(kv_capacity) {
    MS_CHECK(a.positions.size() == size_t(tokens_) && a.out_cache_loc.size() == size_t(tokens_) &&
                 a.layout->q_start.back() == tokens_ && int64_t(a.layout->kv_slots.size()) <= capacity_,
             "captured step: ", tokens_, " ids, ", a.positions.size(), " positions, ", a.out_cache_loc.size(),
             " slots, ", a.layout->kv_slots.size(), " kv slots for a capacity of ", capacity_);
    const int64_t n = 5 * tokens_ + capacity_;
    arena_ = scratch(DType::I32, {n});
    host_ = static_cast<int32_t*>(alloc_mapped(size_t(n) * sizeof(int32_t)));
    mapped_ = mapped_device_ptr(host_);
    MS_CUDA(cudaMallocHost(&staged_.pinned, kPinnedConstants));
    staged_.pinned_capacity = kPinnedConstants;
    MS_CUDA(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
  }
  ~CudaStepGraph() override {
    if (exec_) cudaGraphExecDestroy(exec_);
    cudaEventDestroy(copied_);
    cudaFreeHost(host_);
    cudaFreeHost(staged_.pinned);
  }

  void capture(const ops::StepArrays& a, int max_kv, ops::GraphPool& pool, const std::function<void()>& body) {
    const std::span<const int32_t> host[4] = {a.input_ids, a.positions, a.out_cache_loc, a.layout->kv_slots};
    const int64_t sizes[4] = {tokens_, tokens_, tokens_, capacity_};
    int64_t off = 0;
    for (int i = 0; i < 4; ++i) {
      staged_.arrays.push_back({host[i].data(), arena_.slice(0, off, off + sizes[i])});
      off += sizes[i] + (i == 2 ? 2 * tokens_ : 0);  // begin and visible follow the slots
    }
    staged_.begin = arena_.slice(0, 3 * tokens_, 4 * tokens_);
    staged_.visible = arena_.slice(0, 4 * tokens_, 5 * tokens_);
    staged_.layout = a.layout, staged_.max_kv = max_kv;
    upload(a);  // the first replay finds the capture's own step in place
    t_staged = &staged_;
    set_capture_pool(&pool);
    MS_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      body();
    } catch (...) {
      t_staged = nullptr;
      set_capture_pool(nullptr);
      (void)cudaStreamEndCapture(stream(), &graph);
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    t_staged = nullptr;
    set_capture_pool(nullptr);
    MS_CUDA(cudaStreamEndCapture(stream(), &graph));
    const cudaError_t err = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    MS_CUDA(err);
  }

  void replay(const ops::StepArrays& a) override {
    MS_CHECK(int64_t(a.input_ids.size()) == tokens_ && a.layout->num_seqs() == seqs_ &&
                 a.layout->q_start.back() == tokens_ && int64_t(a.layout->kv_slots.size()) <= capacity_,
             "captured step of ", tokens_, " tokens, ", seqs_, " sequences and ", capacity_,
             " kv slots cannot replay ", a.input_ids.size(), " tokens, ", a.layout->num_seqs(), " sequences, ",
             a.layout->kv_slots.size(), " kv slots");
    upload(a);
    MS_CUDA(cudaGraphLaunch(exec_, stream()));
  }

 private:
  // One copy of the step's metadata into the arena, through pinned memory that the previous
  // copy has finished reading. host_ keeps what the arena holds, so the kv slots the last upload
  // brought and this step keeps (a decode step's sequences only grow: at batch 1 all but the
  // new one) are not copied again: the copy is the per-token words and the slots from the first
  // that changed.
  void upload(const ops::StepArrays& a) {
    MS_CUDA(cudaEventSynchronize(copied_));
    std::memcpy(host_, a.input_ids.data(), size_t(tokens_) * 4);
    std::memcpy(host_ + tokens_, a.positions.data(), size_t(tokens_) * 4);
    std::memcpy(host_ + 2 * tokens_, a.out_cache_loc.data(), size_t(tokens_) * 4);
    query_ranges(*a.layout, host_ + 3 * tokens_, host_ + 4 * tokens_);
    const auto& slots = a.layout->kv_slots;
    int32_t* held = host_ + 5 * tokens_;
    const size_t kept = std::min(slots.size(), uploaded_slots_);
    size_t same = 0;
    while (same < kept && held[same] == slots[same]) ++same;
    std::memcpy(held + same, slots.data() + same, (slots.size() - same) * 4);
    uploaded_slots_ = slots.size();
    const int64_t head = 5 * tokens_;
    if (copy_kernels())  // why a kernel: copy_kernels
      copy_word_ranges(mapped_, arena_.raw(), {0, head}, {head + int64_t(same), int64_t(slots.size() - same)});
    else
      MS_CUDA(cudaMemcpyAsync(arena_.raw(), host_, (size_t(head) + slots.size()) * 4, cudaMemcpyHostToDevice, stream()));
    MS_CUDA(cudaEventRecord(copied_, stream()));
  }

  int64_t tokens_;
  int seqs_;
  int64_t capacity_;
  Tensor arena_;
  int32_t* host_ = nullptr;  // pinned, mapped: the arena's contents as last uploaded
  size_t uploaded_slots_ = 0;  // kv slots of the last upload
  void* mapped_ = nullptr;    // host_'s device address
  cudaEvent_t copied_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
  StagedStep staged_;
};

}  // namespace

StagedStep* staged_step() { return t_staged; }

std::unique_ptr<ops::StepGraph> capture_step(const ops::StepArrays& arrays, int64_t kv_capacity, int max_kv,
                                             ops::GraphPool& pool, const std::function<void()>& body) {
  MS_CHECK(arrays.layout != nullptr, "captured step: no attention layout");
  auto g = std::make_unique<CudaStepGraph>(arrays, kv_capacity);
  g->capture(arrays, max_kv, pool, body);
  return g;
}

}  // namespace ms::cuda
