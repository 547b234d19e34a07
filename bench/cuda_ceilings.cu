// The two ceilings the benchmarks are read against, measured on the GPU they run on: the
// device-to-device copy bandwidth (bytes read + written per second, a few GB so the L2 does not
// help) and the bf16 matrix rate through the engine's own cuBLASLt path (8192^3, random data).
// And what a kernel boundary costs a batch-1 decode step, which runs ~10 dependent kernels a
// layer: microseconds a launch in a captured chain of 100 empty kernels of 132 blocks, and of 50
// kernels that each stream 16 MiB (a batch-1 product's weight) from 50 distinct buffers, both
// plainly launched and launched early (launch_pdl), against 16 MiB over the copy bandwidth; and
// what a change of shared-memory need between kernels costs (smem_kernel); and, against the kernel
// boundary, what the other way to order dependent steps costs: a barrier of every block inside one
// persistent kernel (barrier_kernel), as a whole-step kernel would cross between its steps.
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

// Every kernel of a chain waits for the one before (pdl_wait) and lets the next launch at once.
__global__ void empty_kernel(int* flag) {
  pdl_wait();
  pdl_trigger();
  if (threadIdx.x == 0 && blockIdx.x == 0) ++*flag;
}

// empty_kernel with `dynamic` bytes of shared memory in use: between kernels of different
// shared-memory needs an SM may have to change its L1 / shared-memory split, which it can only do
// once the blocks of the kernel before have left it.
__global__ void smem_kernel(int* flag) {
  extern __shared__ int scratch_smem[];
  pdl_wait();
  pdl_trigger();
  scratch_smem[threadIdx.x] = threadIdx.x;
  __syncthreads();
  if (threadIdx.x == 0 && blockIdx.x == 0) *flag += scratch_smem[5];
}

// Reads n16 16-byte pieces grid-stride (the loads issued before pdl_wait: they depend on nothing)
// and keeps a sum so that they are not dropped.
__global__ void stream_kernel(const uint4* __restrict__ p, int64_t n16, uint32_t* sink) {
  uint32_t acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4 first = i < n16 ? p[i] : make_uint4(0, 0, 0, 0);
  pdl_wait();
  pdl_trigger();
  acc ^= first.x ^ first.w;
  for (i += stride; i < n16; i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc;
}

// One persistent grid crossing `rounds` grid barriers, as a kernel that ran a layer's dependent
// steps itself would. Before each barrier every block stores a value; after it, every block reads
// the one its neighbour stored: the dependent trip through L2 that a kernel reading its
// predecessor's output makes. The barrier: thread 0 of each block adds itself to a device counter
// (release) and spins until the counter reaches the round's total (acquire); the values are double
// buffered (a block storing round r + 2's value has passed barrier r + 1, so every block has read
// round r's). `count` is zero at the launch.
__global__ void barrier_kernel(unsigned* count, unsigned* values, int rounds, unsigned* sink) {
  const unsigned blocks = gridDim.x;
  unsigned acc = 0;
  for (int r = 0; r < rounds; ++r) {
    if (threadIdx.x == 0) {
      unsigned* round_values = values + (r & 1) * blocks;
      round_values[blockIdx.x] = acc + unsigned(r);
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count) : "memory");
      const unsigned target = unsigned(r + 1) * blocks;
      unsigned seen;
      do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
      while (seen < target);
      acc += __ldcg(round_values + (blockIdx.x + 1) % blocks);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && acc == 0xffffffffu) *sink = acc;  // keeps the loads
}

// Microseconds a barrier of barrier_kernel over `blocks` blocks: the launch of 1001 rounds less
// that of one, over 1000.
double barrier_us(int blocks) {
  Tensor count = scratch(DType::I32, {1}), values = scratch(DType::I32, {2 * int64_t(blocks)}),
         sink = scratch(DType::I32, {1});
  auto* c = reinterpret_cast<unsigned*>(count.raw());
  auto* v = reinterpret_cast<unsigned*>(values.raw());
  auto* s = reinterpret_cast<unsigned*>(sink.raw());
  auto ms = [&](int rounds) {
    return median_ms(
        [&] {
          MS_CUDA(cudaMemsetAsync(c, 0, sizeof(unsigned), stream()));
          barrier_kernel<<<blocks, 128, 0, stream()>>>(c, v, rounds, s);
        },
        2, 9);
  };
  const double one = ms(1), many = ms(1001);
  MS_CUDA_LAUNCHED("barrier_kernel");
  return (many - one) * 1e3 / 1000;
}

// Microseconds a launch of a captured chain: `launches` calls of launch(i), replayed.
template <class Launch>
double chain_us(int launches, Launch launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MS_CUDA(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) launch(i);
  MS_CUDA(cudaStreamEndCapture(stream(), &graph));
  MS_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  const float ms = median_ms([&] { MS_CUDA(cudaGraphLaunch(exec, stream())); }, 2, 9);
  MS_CUDA(cudaGraphExecDestroy(exec));
  MS_CUDA(cudaGraphDestroy(graph));
  return double(ms) * 1e3 / launches;
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
  const double copy_GBps = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9;

  const int sms = sm_count();
  Tensor flag = scratch(DType::I32, {1});
  double empty_us[2], stream_us[2];
  constexpr int64_t kSlab = int64_t(16) << 20, kSlabs = 50;
  Tensor slabs = scratch(DType::U8, {kSlab * kSlabs});
  MS_CUDA(cudaMemsetAsync(slabs.raw(), 1, size_t(kSlab * kSlabs), stream()));
  Tensor sink = scratch(DType::I32, {1});
  for (int pdl = 0; pdl < 2; ++pdl) {
    empty_us[pdl] = chain_us(100, [&](int) {
      if (pdl) launch_pdl(empty_kernel, dim3(unsigned(sms)), dim3(128), 0, flag.data<int32_t>());
      else empty_kernel<<<sms, 128, 0, stream()>>>(flag.data<int32_t>());
    });
    stream_us[pdl] = chain_us(int(kSlabs), [&](int i) {
      const uint4* p = reinterpret_cast<const uint4*>(slabs.data<uint8_t>() + i * kSlab);
      auto* out = reinterpret_cast<uint32_t*>(sink.raw());
      if (pdl) launch_pdl(stream_kernel, dim3(unsigned(4 * sms)), dim3(512), 0, p, kSlab / 16, out);
      else stream_kernel<<<4 * sms, 512, 0, stream()>>>(p, kSlab / 16, out);
    });
  }
  // Launched early, 100 kernels: every one with 96 KB of shared memory (two blocks an SM, as the
  // decode attention kernels), and alternating with the empty kernel (no shared memory), first
  // with the driver's choice of split, then with both kernels preferring the largest shared
  // memory (one split for both).
  constexpr int kBig = 96 * 1024;
  MS_CUDA(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBig));
  auto big = [&] { launch_pdl(smem_kernel, dim3(unsigned(sms)), dim3(128), size_t(kBig), flag.data<int32_t>()); };
  auto small = [&] { launch_pdl(empty_kernel, dim3(unsigned(sms)), dim3(128), 0, flag.data<int32_t>()); };
  const double smem_us = chain_us(100, [&](int) { big(); });
  const double alternate_us = chain_us(100, [&](int i) { i % 2 ? big() : small(); });
  MS_CUDA(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  MS_CUDA(cudaFuncSetAttribute(empty_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  const double alternate_one_split_us = chain_us(100, [&](int i) { i % 2 ? big() : small(); });
  MS_CUDA_LAUNCHED("chain kernels");
  const double barrier_sms_us = barrier_us(sms);
  std::printf("{\"gpu\": \"%s\", \"copy_GBps\": %.1f, \"bf16_gemm_TFLOPs\": %.1f, \"gemm_ms\": %.3f, "
              "\"empty_launch_us\": %.2f, \"empty_launch_pdl_us\": %.2f, \"stream_16MiB_us\": %.2f, "
              "\"stream_16MiB_pdl_us\": %.2f, \"stream_16MiB_at_copy_rate_us\": %.2f, \"smem96K_launch_pdl_us\": %.2f, "
              "\"alternating_0_96K_pdl_us\": %.2f, \"alternating_one_split_pdl_us\": %.2f, \"grid_barrier_us\": %.2f}\n",
              prop.name, copy_GBps, 2.0 * double(n) * n * n / (gemm_ms * 1e-3) / 1e12, gemm_ms, empty_us[0],
              empty_us[1], stream_us[0], stream_us[1], double(kSlab) / (copy_GBps * 1e3), smem_us, alternate_us,
              alternate_one_split_us, barrier_sms_us);
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
