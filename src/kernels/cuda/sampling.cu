// Greedy choice on the GPU: the argmax of each row of logits, so that a batch of greedy requests
// copies one id per row to the host instead of the whole [rows, vocab] logits. Ties go to the
// lower index, as std::max_element on the host does (the sampler's greedy rule).
#include <cfloat>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = 1024;

// (value, index) with the larger value winning and the lower index breaking ties.
__device__ __forceinline__ void keep_better(float& v, int& i, float ov, int oi) {
  if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
}

template <class T>
__global__ void argmax_rows_kernel(const T* logits, int64_t stride, int vocab, int32_t* out) {
  const T* row = logits + int64_t(blockIdx.x) * stride;
  float v = -FLT_MAX;
  int idx = -1;
  for (int j = int(threadIdx.x); j < vocab; j += int(blockDim.x)) keep_better(v, idx, load_f(row + j), j);
  for (int o = 16; o > 0; o >>= 1) keep_better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32, warps = int(blockDim.x) / 32;
  if (lane == 0) sv[warp] = v, si[warp] = idx;
  __syncthreads();
  if (warp != 0) return;
  v = lane < warps ? sv[lane] : -FLT_MAX;
  idx = lane < warps ? si[lane] : -1;
  for (int o = 16; o > 0; o >>= 1) keep_better(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  // A row of NaNs has no larger value: index 0, as max_element gives.
  if (lane == 0) out[blockIdx.x] = idx < 0 ? 0 : idx;
}

}  // namespace

std::vector<int32_t> argmax_rows(const Tensor& logits) {
  check_device_tensor(logits, {DType::BF16, DType::F32}, "argmax_rows", "logits");
  MS_CHECK(logits.dim() == 2 && (logits.size(1) <= 1 || logits.strides()[1] == 1), "argmax_rows: ", logits.describe(),
           " must be [rows, vocab] with contiguous rows");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  MS_CHECK(vocab > 0 && vocab < (int64_t(1) << 31), "argmax_rows: vocabulary of ", vocab);
  std::vector<int32_t> out(size_t(rows), 0);
  if (rows == 0) return out;
  Tensor ids = scratch(DType::I32, {rows});
  MS_FLOAT_DISPATCH(logits.dtype(), T, {
    argmax_rows_kernel<T><<<unsigned(rows), kThreads, 0, stream()>>>(logits.data<T>(), logits.strides()[0], int(vocab),
                                                                     ids.data<int32_t>());
  });
  MS_CUDA_LAUNCHED("argmax_rows_kernel");
  download(out.data(), ids.raw(), out.size() * sizeof(int32_t));
  return out;
}

}  // namespace ms::cuda
