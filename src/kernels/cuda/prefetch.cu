// ops::prefetch_weight on the GPU: asks L2 for a weight a later kernel of the step will stream.
// At batch 1 the kernels between a layer's q/k/v product and its o product (rope, decode
// attention, the split merge) are latency bound and leave HBM mostly idle, while the o product
// itself (16.8 MB for Qwen3-30B-A3B) spends ~10 µs ramping up. Prefetched there, the o product
// reads L2. H200's L2 (50 MB) holds the weight while attention reads its few MB of cache.
//
// The kernel issues the prefetches, lets the next kernel launch at once (launch_pdl), and only
// then waits for the kernel before it: the next kernel's own pdl_wait() waits for this grid to
// finish, so it still sees everything the kernels before this one wrote.
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace ms::cuda {
namespace {

constexpr int kLine = 128;  // bytes a prefetch asks for
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) prefetch_kernel(const char* p, int64_t bytes) {
  pdl_trigger();
  const int64_t stride = int64_t(gridDim.x) * kThreads * kLine;
  for (int64_t off = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kLine; off < bytes; off += stride)
    asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p + off));
  pdl_wait();
}

bool prefetch_enabled() {
  static const bool on = [] {
    const char* env = std::getenv("MOESERVE_L2_PREFETCH");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return on;
}

}  // namespace

void prefetch_weight(const Weight& w) {
  if (!prefetch_enabled() || !pdl_enabled() || w.w.device() != Device::CUDA) return;
  // At most half of L2, so the kernels in between keep room: a larger weight gets its first part.
  static const int64_t l2_bytes = [] {
    int device = 0, bytes = 0;
    MS_CUDA(cudaGetDevice(&device));
    MS_CUDA(cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device));
    return int64_t(bytes);
  }();
  const int64_t bytes = std::min(int64_t(w.w.numel()) * int64_t(dtype_size(w.w.dtype())), l2_bytes / 2);
  launch_pdl(prefetch_kernel, dim3(unsigned(sm_count())), dim3(kThreads), 0, static_cast<const char*>(w.w.raw()),
             bytes);
}

}  // namespace ms::cuda
