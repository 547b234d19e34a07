// The FP8 block-scaled linear against the path it replaced and the bf16 matrix rate, at 4096
// rows on DeepSeek-V3 shapes (random data): per shape, the median time of the activation
// quantisation alone, the cuBLASLt block-scaled GEMM alone (when cuBLASLt has an algorithm),
// cuda::linear with the FP8 GEMM (quantisation included) by cuBLASLt and by the own kernel, the
// old path (fp8 weight dequantised to a bf16 scratch, then the bf16 GEMM) and the bf16 GEMM on
// an already-bf16 weight. TFLOP/s = 2 M N K / time. Prints a table and one JSON line per shape.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "cuda_bench_timing.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"

namespace ms::cuda {
namespace {

__device__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint32_t x = uint32_t(i) * 2654435761u ^ seed;
  x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
  return x;
}

__global__ void fill_bf16(bf16* p, int64_t n, uint32_t seed) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = __float2bfloat16_rn(float(mix(i, seed) & 0xffff) / 32768.0f - 1.0f);
}

__global__ void fill_fp8(uint8_t* p, int64_t n, uint32_t seed) {  // finite e4m3 codes only
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) {
    const uint32_t h = mix(i, seed);
    p[i] = uint8_t((h % 126) | ((h >> 16) & 0x80));
  }
}

__global__ void fill_scales(float* p, int64_t n, uint32_t seed) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) p[i] = 0.002f * (0.5f + float(mix(i, seed) & 0xffff) / 65536.0f);
}


void bench_shape(int64_t M, int64_t K, int64_t N) {
  Tensor x = scratch(DType::BF16, {M, K}), out = scratch(DType::BF16, {M, N});
  ops::Weight w;
  w.w = scratch(DType::F8_E4M3, {N, K});
  w.scale_inv = scratch(DType::F32, {(N + 127) / 128, (K + 127) / 128});
  fill_bf16<<<blocks_for(M * K, 256), 256, 0, stream()>>>(x.data<bf16>(), M * K, 1u);
  fill_fp8<<<blocks_for(N * K, 256), 256, 0, stream()>>>(w.w.data<uint8_t>(), N * K, 2u);
  fill_scales<<<blocks_for(w.scale_inv.numel(), 256), 256, 0, stream()>>>(w.scale_inv.data<float>(),
                                                                          w.scale_inv.numel(), 3u);
  MS_CUDA_LAUNCHED("fill");
  const int warm = 3, reps = 20;
  const float quant_ms = median_ms([&] { quantize_rows(x); }, warm, reps);
  Fp8Rows xq = quantize_rows(x);
  const bool lt = K % 512 == 0 && matmul_fp8_blocks(N, M, K, w.w.raw(), K, w.scale_inv.data<float>(), xq.q.raw(),
                                                    xq.scales.data<float>(), out.raw(), DType::BF16, N);
  const float lt_ms = lt ? median_ms([&] {
    matmul_fp8_blocks(N, M, K, w.w.raw(), K, w.scale_inv.data<float>(), xq.q.raw(), xq.scales.data<float>(), out.raw(),
                      DType::BF16, N);
  }, warm, reps) : 0.f;
  set_fp8_mode(Fp8Mode::Fp8GemmAllRows);
  const float linear_ms = median_ms([&] { cuda::linear(x, w, nullptr, out); }, warm, reps);
  set_fp8_mode(Fp8Mode::OwnKernel);
  const float own_ms = median_ms([&] { cuda::linear(x, w, nullptr, out); }, warm, reps);
  set_fp8_mode(Fp8Mode::Dequant);
  const float old_ms = median_ms([&] { gemm_xwT(x, weight_bf16(w), out.raw(), DType::BF16, N); }, warm, reps);
  Tensor wb = weight_bf16(w);
  const float bf16_ms = median_ms([&] { gemm_xwT(x, wb, out.raw(), DType::BF16, N); }, warm, reps);
  MS_CUDA(cudaStreamSynchronize(stream()));
  const double flop = 2.0 * double(M) * double(N) * double(K);
  auto tf = [&](float ms) { return ms > 0.f ? flop / (double(ms) * 1e-3) / 1e12 : 0.0; };
  std::printf("%6lld %6lld %6lld | %7.3f | %8.1f %8.1f %8.1f | %8.1f %8.1f\n", static_cast<long long>(M),
              static_cast<long long>(K), static_cast<long long>(N), quant_ms, tf(lt_ms), tf(linear_ms), tf(own_ms),
              tf(old_ms), tf(bf16_ms));
  std::printf("{\"M\": %lld, \"K\": %lld, \"N\": %lld, \"quant_ms\": %.4f, \"cublaslt_fp8_ms\": %.4f, "
              "\"linear_fp8_ms\": %.4f, \"own_kernel_linear_ms\": %.4f, \"old_dequant_bf16_ms\": %.4f, "
              "\"bf16_gemm_ms\": %.4f}\n",
              static_cast<long long>(M), static_cast<long long>(K), static_cast<long long>(N), quant_ms, lt_ms,
              linear_ms, own_ms, old_ms, bf16_ms);
}

void run() {
  init();
  cudaDeviceProp prop{};
  MS_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s; TFLOP/s (cuBLASLt 0.0 = no algorithm for the shape)\n", prop.name);
  std::printf("     M      K      N | quantms | cublasLt  lin-fp8  lin-own | old-deq  bf16mm\n");
  const int64_t M = 4096;
  for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{7168, 2112}, {7168, 4096}, {2048, 7168},
                                                               {16384, 7168}, {7168, 18432}})
    bench_shape(M, K, N);
}

}  // namespace
}  // namespace ms::cuda

int main() {
  try {
    ms::cuda::run();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fp8_gemm_bench: %s\n", e.what());
    return 1;
  }
}
