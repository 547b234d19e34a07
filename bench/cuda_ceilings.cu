// The two ceilings the benchmarks are read against, measured on the GPU they run on: the
// device-to-device copy bandwidth (bytes read + written per second, a few GB so the L2 does not
// help) and the bf16 matrix rate through the engine's own cuBLASLt path (8192^3, random data).
// Prints one JSON line.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda_bench_timing.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"

namespace ms::cuda {
namespace {

__global__ void fill_random(bf16* p, int64_t n, uint32_t seed) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  uint32_t x = uint32_t(i) * 2654435761u ^ seed;
  x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
  p[i] = __float2bfloat16_rn(float(x & 0xffff) / 32768.0f - 1.0f);
}


void run() {
  init();
  const int64_t copy_bytes = int64_t(4) << 30;
  Tensor src = scratch(DType::U8, {copy_bytes}), dst = scratch(DType::U8, {copy_bytes});
  MS_CUDA(cudaMemsetAsync(src.raw(), 1, size_t(copy_bytes), stream()));
  float copy_ms = median_ms(
      [&] { MS_CUDA(cudaMemcpyAsync(dst.raw(), src.raw(), size_t(copy_bytes), cudaMemcpyDeviceToDevice, stream())); },
      2, 10);
  const int64_t n = 8192;
  Tensor a = scratch(DType::BF16, {n, n}), b = scratch(DType::BF16, {n, n}), c = scratch(DType::BF16, {n, n});
  fill_random<<<blocks_for(n * n, 256), 256, 0, stream()>>>(a.data<bf16>(), n * n, 1u);
  fill_random<<<blocks_for(n * n, 256), 256, 0, stream()>>>(b.data<bf16>(), n * n, 2u);
  MS_CUDA_LAUNCHED("fill_random");
  float gemm_ms = median_ms(
      [&] { matmul(n, n, n, MatRef{a.raw(), n, 0, true}, MatRef{b.raw(), n, 0, false}, c.raw(), DType::BF16, n); }, 3,
      20);
  cudaDeviceProp prop{};
  MS_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("{\"gpu\": \"%s\", \"copy_GBps\": %.1f, \"bf16_gemm_TFLOPs\": %.1f, \"gemm_ms\": %.3f}\n", prop.name,
              2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9, 2.0 * double(n) * n * n / (gemm_ms * 1e-3) / 1e12,
              gemm_ms);
}

}  // namespace
}  // namespace ms::cuda

int main() {
  try {
    ms::cuda::run();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_ceilings: %s\n", e.what());
    return 1;
  }
}
