// Internals shared by the CUDA kernels: error checks that turn CUDA and cuBLAS failures into
// ms::Error naming the call, the calling thread's GPU's stream and cuBLASLt handle, uninitialised scratch
// tensors from the caching allocator, metadata upload through pinned staging, and the
// device-side element conversions (bf16 / f32 activations, fp8 weights).
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <array>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/tensor.h"
#include "kernels/ops.h"

namespace ms::cuda {

void check_cuda(cudaError_t err, const char* call, const char* file, int line);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);

#define MS_CUDA(call) ::ms::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define MS_CUBLAS(call) ::ms::cuda::check_cublas((call), #call, __FILE__, __LINE__)
// After a kernel launch: reports a bad launch configuration with the kernel's name.
#define MS_CUDA_LAUNCHED(name) ::ms::cuda::check_cuda(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

// The calling thread's GPU (its CUDA current device) and that GPU's stream, cuBLASLt handle
// and workspace (at least `bytes`), and multiprocessor count.
int current_device();
cudaStream_t stream();
cublasLtHandle_t lt_handle();
void* lt_workspace(size_t bytes);
int sm_count();
// Whether that GPU is a Hopper (sm_90), where the build's sm_90a kernels (wgmma) run.
bool hopper();
// Programmatic dependent launch (Hopper): a kernel launched by launch_pdl may start while the
// kernel before it in the stream finishes, so it can fetch its weights meanwhile; it calls
// pdl_wait() before it reads anything an earlier kernel wrote. MOESERVE_PDL=0 turns it off.
bool pdl_enabled();
// Whether the weights a decode step streams once (the batch-1 products, the router and the
// experts) are read under an L2 policy that evicts them first. A layer streams more weight than
// L2 holds (Qwen3-30B-A3B: ~120 MB against 50 MB), which otherwise flushes what the small kernels
// between the products come back for: their code, their parameters, the activations. Batch-1
// steps were 3 % faster with it, batch 64 2-3 % (BENCHMARKS.md, session 22). MOESERVE_L2_STREAM=0:
// the normal policy.
bool weights_evict_first();
// Whether a product asked to run beside the kernel before it (ops::Overlap::BesideLast) does so.
// MOESERVE_BESIDE=0 (read once): every product waits for the kernel before.
bool beside_allowed();

// Runs a callable the first time the calling thread's GPU reaches it: state such as a kernel's
// dynamic shared-memory limit (cudaFuncSetAttribute) belongs to one device.
class PerDeviceOnce {
 public:
  template <class F>
  void operator()(F&& fn) {
    std::call_once(flags_.at(size_t(current_device())), std::forward<F>(fn));
  }

 private:
  std::array<std::once_flag, 64> flags_;
};

// A contiguous device tensor whose contents are undefined (kernel scratch, outputs that are
// fully written), from the caching allocator.
Tensor scratch(DType dtype, Shape shape);

// A device I32 copy of host metadata, staged through pinned memory (stream-ordered).
Tensor upload_i32(std::span<const int32_t> host);
// Whether this thread's stream is being captured into a CUDA graph (no host syncs allowed).
bool capturing();
// Copies `bytes` from device memory to host memory and waits for it.
void download(void* host, const void* device, size_t bytes);

// Between one step's graph and the next, a decode step's ids go to the host and its metadata to
// the device. Done by the copy engine, each transfer started several microseconds after the
// work before it (the engine's overlapped decode: 7-8 us from the argmax's end to its ids' copy,
// then as long to the next graph; BENCHMARKS, session 25). So they are kernels instead, reading
// or writing pinned host memory mapped into the device's address space: a kernel follows a
// kernel within about a microsecond. MOESERVE_COPY_KERNELS=0 (read once): the copy engine.
bool copy_kernels();
// Pinned host memory of `bytes`, mapped for the device (cudaHostAllocMapped); its device address.
void* alloc_mapped(size_t bytes);
void* mapped_device_ptr(void* host);
// Stream-ordered copy of words [at, at + n) of each of two ranges (4-byte words) by one kernel,
// a word a thread; either side may be mapped host memory. copy_words: the first `words`.
struct WordRange {
  int64_t at, n;
};
void copy_word_ranges(const void* src, void* dst, WordRange a, WordRange b);
void copy_words(const void* src, void* dst, int64_t words);

// Checks that a tensor is on the GPU with one of the dtypes the kernel supports.
void check_device_tensor(const Tensor& t, std::initializer_list<DType> allowed, const char* op, const char* what);

inline unsigned blocks_for(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }
// Whether rows starting at `p`, `stride_bytes` apart, are all 16-byte aligned (vector accesses).
inline bool aligned16(const void* p, int64_t stride_bytes) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride_bytes % 16 == 0;
}

}  // namespace ms::cuda

#ifdef __CUDACC__
namespace ms::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float load_f(const float* p) { return *p; }
__device__ __forceinline__ float load_f(const bf16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
// Eight consecutive values as f32 through 16-byte accesses (one for bf16, two for f32): the
// vectorised element-wise kernels' loads and stores. `p` must be 16-byte aligned.
__device__ __forceinline__ void unpack8(uint4 u, float f[8]) {
  const uint32_t words[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[j]));
    f[2 * j] = p.x, f[2 * j + 1] = p.y;
  }
}
__device__ __forceinline__ uint4 pack8(const float f[8]) {  // rounded to bf16
  uint32_t res[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const __nv_bfloat162 r = __floats2bfloat162_rn(f[2 * j], f[2 * j + 1]);
    res[j] = *reinterpret_cast<const uint32_t*>(&r);
  }
  return make_uint4(res[0], res[1], res[2], res[3]);
}
__device__ __forceinline__ void load8(const bf16* p, float v[8]) { unpack8(*reinterpret_cast<const uint4*>(p), v); }
__device__ __forceinline__ void load8(const float* p, float v[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void store8(bf16* p, const float v[8]) { *reinterpret_cast<uint4*>(p) = pack8(v); }
__device__ __forceinline__ void store8(float* p, const float v[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// pdl_wait: blocks until the kernels this one depends on have finished and their writes are
// visible (returns at once when it was not launched early). pdl_trigger: lets the next kernel,
// if launched by launch_pdl, start as soon as every block of this one has triggered or exited.
// The kernels of moe_route and moe_expert_rows trigger only after they have waited: a product
// beside them (ops::Overlap::BesideLast) then starts only once their inputs' writers are done.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Asynchronous 16-byte copies from global to shared memory (cp.async, L2 only: the KV cache is
// streamed once), so that a kernel keeps several steps of loads in flight without holding them
// in registers (the decode attention's keys, the one-token experts' weights). `valid` false
// copies nothing and zero-fills the 16 bytes: keys past a split's end must read as zeros, since a
// zero probability times a stale NaN is NaN.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}
// A 4-byte cp.async (through L1: .cg takes only 16), zero-filled when !valid.
__device__ __forceinline__ void cp_async4(uint32_t smem_addr, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(valid ? 4 : 0)
               : "memory");
}
// An L2 policy for the loads of data read once (weights_evict_first) or of any other.
__device__ __forceinline__ uint64_t l2_policy(bool evict_first) {
  uint64_t policy;
  if (evict_first) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  else asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// cp_async16 under an L2 policy (l2_policy).
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid, uint64_t policy) {
  const uint32_t dst = uint32_t(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(gmem),
               "r"(valid ? 16 : 0), "l"(policy)
               : "memory");
}
// A 16-byte read-only load (as __ldg) under an L2 policy.
__device__ __forceinline__ uint4 ldg16(const void* p, uint64_t policy) {
  uint4 v;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(policy));
  return v;
}
// Closes the group of copies issued since the last commit (an empty group when none were).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Launches `kernel` on this thread's stream, allowed to overlap the tail of the kernel before it.
// shared_carveout: the launch asks for the whole L1 / shared-memory array as shared memory. For a
// kernel that needs little shared memory but is followed by one that needs much, whose blocks
// (launched early) should find room on its multiprocessors while it runs: an SM changes its split
// of L1 and shared memory only once it has drained, so under the driver's split for this kernel
// (most of the array as L1) the next kernel's blocks wait for all of its blocks on an SM to end,
// and so do their loads before pdl_wait.
template <class... Params, class... Args>
void launch_pdl_with(bool shared_carveout, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                     Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributePreferredSharedMemoryCarveout;
  attrs[1].val.sharedMemCarveout = 100;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem, config.stream = stream();
  const bool pdl = pdl_enabled();
  config.attrs = pdl ? attrs : attrs + 1, config.numAttrs = (pdl ? 1 : 0) + (shared_carveout ? 1 : 0);
  MS_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args&&... args) {
  launch_pdl_with(false, kernel, grid, block, smem, std::forward<Args>(args)...);
}

// launch_pdl for a grid of thread-block clusters of `cluster` blocks (each grid dimension a
// multiple of the cluster's); more than 8 blocks need the kernel's non-portable size allowed.
template <class... Params, class... Args>
void launch_pdl_cluster(void (*kernel)(Params...), dim3 grid, dim3 cluster, dim3 block, size_t smem, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  attrs[0].id = cudaLaunchAttributeClusterDimension;
  attrs[0].val.clusterDim.x = cluster.x, attrs[0].val.clusterDim.y = cluster.y, attrs[0].val.clusterDim.z = cluster.z;
  attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = block, config.dynamicSmemBytes = smem, config.stream = stream();
  config.attrs = attrs, config.numAttrs = pdl_enabled() ? 2 : 1;
  MS_CUDA(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// DeepSeek's activation quantisation of one 128-wide group by a warp, 4 values a lane: returns
// this lane's e4m3 codes of v / scale (IEEE division, nearest, saturating; the first value in the
// low byte) and sets scale to the group's largest magnitude / 448 (1 for a group of zeros). Every
// lane of the warp must call it (the magnitude is a warp maximum).
__device__ __forceinline__ uint32_t quantize_e4m3_group4(const float (&v)[4], float& scale) {
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  scale = amax > 0.f ? amax / 448.0f : 1.0f;
  uint32_t packed = 0;
  for (int i = 0; i < 4; ++i) packed |= uint32_t(__nv_cvt_float_to_fp8(v[i] / scale, __NV_SATFINITE, __NV_E4M3)) << (8 * i);
  return packed;
}

__device__ __forceinline__ float fp8_to_f(uint8_t byte) {
  __nv_fp8_e4m3 v;
  v.__x = byte;
  return float(v);
}

// Four e4m3 codes (the bytes of `four`) as two bf16 pairs, each the code's value times 2^-120
// exactly: bf16 takes e4m3's sign, 4 exponent and 3 mantissa bits at the bottom of its own
// fields, and e4m3's subnormals land on bf16's. lo holds bytes 0 and 1, hi bytes 2 and 3 (the
// lower byte in the lower half). Three integer instructions a pair, where e4m3 -> f16 -> f32,
// times the block scale, -> bf16 took six; the products that use it apply the block's scale
// (times kE4m3Unscale) to their f32 sums instead, so a weight counts as float(e4m3) * scale
// unrounded; ops::check_fp8_scales keeps scale x 2^120 finite.
constexpr float kE4m3Unscale = 0x1p120f;
__device__ __forceinline__ void e4m3x4_bf16(uint32_t four, uint32_t& lo, uint32_t& hi) {
  uint32_t a, b;  // each byte sign-extended to 16 bits (prmt selectors with the sign bit set)
  asm("prmt.b32 %0, %1, 0, 0x9180;" : "=r"(a) : "r"(four));
  asm("prmt.b32 %0, %1, 0, 0xB3A2;" : "=r"(b) : "r"(four));
  lo = (a << 4) & 0x87f087f0u;
  hi = (b << 4) & 0x87f087f0u;
}

}  // namespace ms::cuda

// Runs `body` with `T` bound to the element type of a BF16 or F32 tensor.
#define MS_FLOAT_DISPATCH(dtype, T, ...)                                           \
  do {                                                                            \
    if ((dtype) == ::ms::DType::BF16) {                                           \
      using T = ::ms::cuda::bf16;                                                 \
      __VA_ARGS__;                                                                \
    } else if ((dtype) == ::ms::DType::F32) {                                     \
      using T = float;                                                            \
      __VA_ARGS__;                                                                \
    } else {                                                                      \
      ::ms::fail("cuda: unsupported activation dtype ", ::ms::dtype_name(dtype)); \
    }                                                                             \
  } while (0)
#endif
