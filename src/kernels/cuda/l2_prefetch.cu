// L2 prefetches on a side stream (l2_prefetch.h).
#include "kernels/cuda/l2_prefetch.h"

#include "kernels/cuda/cuda_ops.h"

#include <cstdlib>
#include <map>
#include <memory>

namespace ms::cuda {
namespace {

// Bytes one cp.async.bulk.prefetch asks for: small enough that a few dozen blocks share a
// matrix of megabytes, so the requests leave from many multiprocessors at once (one SM's TMA
// unit alone issues far below HBM's rate).
constexpr int64_t kPiece = 16 * 1024;
constexpr int kThreads = 64;

__device__ __forceinline__ void bulk_prefetch(const char* p, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(unsigned(bytes)) : "memory");
#else
  (void)p, (void)bytes;
#endif
}

// Pieces of [p, p + bytes) spread over the `parts` x kThreads threads; bytes a multiple of 16.
__device__ __forceinline__ void prefetch_range(const char* p, int64_t bytes, int part, int parts) {
  const int64_t pieces = (bytes + kPiece - 1) / kPiece;
  for (int64_t i = int64_t(part) * kThreads + threadIdx.x; i < pieces; i += int64_t(parts) * kThreads)
    bulk_prefetch(p + i * kPiece, min(kPiece, bytes - i * kPiece));
}

__global__ void __launch_bounds__(kThreads) prefetch_kernel(const char* a, int64_t a_bytes, const char* b,
                                                            int64_t b_bytes) {
  prefetch_range(a, a_bytes, blockIdx.x, gridDim.x);
  if (b) prefetch_range(b, b_bytes, blockIdx.x, gridDim.x);
}

// Block (x, y): part y of the weights of the x-th active group.
__global__ void __launch_bounds__(kThreads) prefetch_groups_kernel(const void* const* w, const void* const* w2,
                                                                   int64_t bytes, const int32_t* active,
                                                                   const int32_t* n_active) {
  if (int(blockIdx.x) >= *n_active) return;
  const int g = active[blockIdx.x];
  prefetch_range(static_cast<const char*>(w[g]), bytes, blockIdx.y, gridDim.y);
  if (w2) prefetch_range(static_cast<const char*>(w2[g]), bytes, blockIdx.y, gridDim.y);
}

// A thread's side stream on one GPU: high priority, so its few blocks are placed ahead of the
// main stream's queued ones.
struct Side {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, done = nullptr;
  bool pending = false;
  std::vector<Tensor> keep;  // device arrays read by prefetches not yet joined
};

Side& side() {
  thread_local std::map<int, std::unique_ptr<Side>> sides;
  auto& s = sides[current_device()];
  if (!s) {
    s = std::make_unique<Side>();
    int least = 0, greatest = 0;
    MS_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    MS_CUDA(cudaStreamCreateWithPriority(&s->stream, cudaStreamNonBlocking, greatest));
    MS_CUDA(cudaEventCreateWithFlags(&s->fork, cudaEventDisableTiming));
    MS_CUDA(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
  }
  return *s;
}

void join(Side& s) {
  if (!s.pending) return;
  MS_CUDA(cudaStreamWaitEvent(stream(), s.done, 0));
  s.pending = false;
  s.keep.clear();
}

// The side stream, waiting for the work queued so far on this thread's stream. Outside capture
// the previous prefetch is joined first, so that the arrays it read can be released (a capture
// keeps them until it ends: its pool never hands a block out twice).
cudaStream_t fork() {
  Side& s = side();
  if (!capturing()) join(s);
  MS_CUDA(cudaEventRecord(s.fork, stream()));
  MS_CUDA(cudaStreamWaitEvent(s.stream, s.fork, 0));
  return s.stream;
}

void forked(std::vector<Tensor> keep) {
  Side& s = side();
  MS_CUDA(cudaEventRecord(s.done, s.stream));
  s.pending = true;
  for (Tensor& t : keep) s.keep.push_back(std::move(t));
}

int64_t whole16(int64_t bytes) { return bytes / 16 * 16; }

int64_t l2_bytes() {
  static const int64_t bytes = [] {
    int v = 0;
    MS_CUDA(cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, current_device()));
    return int64_t(v);
  }();
  return bytes;
}

}  // namespace

bool l2_prefetch_on(unsigned site) {
  static const unsigned mask = [] {
    const char* env = std::getenv("MOESERVE_L2_PREFETCH");
    return env ? unsigned(std::strtoul(env, nullptr, 0)) : unsigned(kPrefetchAskedWeights | kPrefetchExpertDown);
  }();
  return hopper() && (mask & site) != 0;
}

void l2_prefetch_weight(const ops::Weight& w) {
  const char* a = static_cast<const char*>(w.w.raw());
  const int64_t a_bytes = whole16(w.w.numel() * int64_t(dtype_size(w.w.dtype())));
  const char* b = w.scale_inv.defined() ? static_cast<const char*>(w.scale_inv.raw()) : nullptr;
  const int64_t b_bytes = b ? whole16(w.scale_inv.numel() * 4) : 0;
  if (!w.w.is_contiguous() || reinterpret_cast<uintptr_t>(a) % 16 || reinterpret_cast<uintptr_t>(b) % 16 ||
      a_bytes == 0)
    return;
  const int blocks = int(std::min<int64_t>(64, (a_bytes + 8 * kPiece - 1) / (8 * kPiece)));
  prefetch_kernel<<<blocks, kThreads, 0, fork()>>>(a, a_bytes, b_bytes ? b : nullptr, b_bytes);
  MS_CUDA_LAUNCHED("prefetch_kernel");
  forked({});
}

void l2_prefetch_groups(const GemvWeights& w, bool pair, int64_t n, const GemvRows& rows, bool must_fit,
                        std::vector<Tensor> keep) {
  MS_CHECK(w.w && rows.active && rows.n_active, "l2_prefetch_groups: needs grouped weights and active groups");
  // Weight rows are 16-byte aligned (gemv_supported), so each group's matrix is too.
  const int64_t bytes = whole16(n * w.ld * (w.fp8 ? 1 : 2));
  if (bytes == 0 || (must_fit && int64_t(rows.max_groups) * bytes * (pair ? 2 : 1) > l2_bytes() * 3 / 4)) return;
  const int parts = int(std::max<int64_t>(1, std::min<int64_t>(16, 64 / rows.max_groups)));
  const dim3 grid(unsigned(rows.max_groups), unsigned(parts));
  prefetch_groups_kernel<<<grid, kThreads, 0, fork()>>>(w.w, pair ? w.w2 : nullptr, bytes, rows.active,
                                                        rows.n_active);
  MS_CUDA_LAUNCHED("prefetch_groups_kernel");
  forked(std::move(keep));
}

void join_l2_prefetches() { join(side()); }

void prefetch_weight(const ops::Weight& w) {
  if (l2_prefetch_on(kPrefetchAskedWeights)) l2_prefetch_weight(w);
}

}  // namespace ms::cuda
