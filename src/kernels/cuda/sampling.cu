// Greedy choice on the GPU: the argmax of each row of logits, so that a batch of greedy requests
// copies one id per row to the host instead of the whole [rows, vocab] logits. Ties go to the
// lower index, as std::max_element on the host does (the sampler's greedy rule).
//
// A row of 152k logits is too much for one block (batch-1 decode had a single block scan it), so
// a row is cut into chunks: a first kernel reduces each chunk to its (value, index) with one
// block, a second merges a row's chunk results with one warp. Chunk counts depend only on the
// shape, so the scratch and the launches are the same at every replay of a captured step.
#include <algorithm>
#include <cfloat>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMinChunk = 4 * kThreads;  // at least 4 logits a thread

// (value, index) with the larger value winning and the lower index breaking ties; index < 0 is
// "no candidate yet". Merging is associative and order-free, so chunks may be merged in any order.
__device__ __forceinline__ void keep_better(float& v, int& i, float ov, int oi) {
  if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
}
__device__ __forceinline__ void warp_keep_better(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) keep_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// Block (r, c) reduces logits [c * chunk, (c + 1) * chunk) of row r into part_v/part_i[r * chunks + c];
// with one chunk a row (part_v null) it writes the row's answer to part_i[r] directly.
template <class T>
__global__ void argmax_chunks_kernel(const T* logits, int64_t stride, int vocab, int chunk, float* part_v,
                                     int32_t* part_i) {
  const T* row = logits + int64_t(blockIdx.x) * stride;
  const int begin = int(blockIdx.y) * chunk, end = min(vocab, begin + chunk);
  float v = -FLT_MAX;
  int idx = -1;
#pragma unroll 4
  for (int j = begin + int(threadIdx.x); j < end; j += kThreads) keep_better(v, idx, load_f(row + j), j);
  warp_keep_better(v, idx);
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) sv[warp] = v, si[warp] = idx;
  __syncthreads();
  if (warp != 0) return;
  v = lane < kThreads / 32 ? sv[lane] : -FLT_MAX;
  idx = lane < kThreads / 32 ? si[lane] : -1;
  warp_keep_better(v, idx);
  if (lane != 0) return;
  const int64_t at = int64_t(blockIdx.x) * gridDim.y + blockIdx.y;
  if (part_v) part_v[at] = v, part_i[at] = idx;
  else part_i[at] = idx < 0 ? 0 : idx;  // a row of NaNs has no larger value: index 0, as max_element gives
}

// One warp a row merges the row's `chunks` partial results.
__global__ void argmax_merge_kernel(const float* part_v, const int32_t* part_i, int chunks, int32_t* out) {
  const int64_t base = int64_t(blockIdx.x) * chunks;
  float v = -FLT_MAX;
  int idx = -1;
  for (int c = int(threadIdx.x); c < chunks; c += 32) keep_better(v, idx, part_v[base + c], part_i[base + c]);
  warp_keep_better(v, idx);
  if (threadIdx.x == 0) out[blockIdx.x] = idx < 0 ? 0 : idx;
}

}  // namespace

void argmax_rows_into(const Tensor& logits, Tensor& ids) {
  check_device_tensor(logits, {DType::BF16, DType::F32}, "argmax_rows", "logits");
  MS_CHECK(logits.dim() == 2 && (logits.size(1) <= 1 || logits.strides()[1] == 1), "argmax_rows: ", logits.describe(),
           " must be [rows, vocab] with contiguous rows");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  MS_CHECK(vocab > 0 && vocab < (int64_t(1) << 31), "argmax_rows: vocabulary of ", vocab);
  if (rows == 0) return;
  // Enough chunks for two blocks a multiprocessor over all rows, none shorter than kMinChunk.
  const int64_t want = std::max<int64_t>(1, (2 * int64_t(sm_count()) + rows - 1) / rows);
  const int64_t by_len = std::max<int64_t>(1, vocab / kMinChunk);
  int chunks = int(std::min(want, by_len));
  const int chunk = int((vocab + chunks - 1) / chunks);
  chunks = int((vocab + chunk - 1) / chunk);  // every chunk non-empty
  Tensor part_v, part_i;
  if (chunks > 1) part_v = scratch(DType::F32, {rows, chunks}), part_i = scratch(DType::I32, {rows, chunks});
  MS_FLOAT_DISPATCH(logits.dtype(), T, {
    argmax_chunks_kernel<T><<<dim3(unsigned(rows), unsigned(chunks)), kThreads, 0, stream()>>>(
        logits.data<T>(), logits.strides()[0], int(vocab), chunk, chunks > 1 ? part_v.data<float>() : nullptr,
        chunks > 1 ? part_i.data<int32_t>() : ids.data<int32_t>());
  });
  MS_CUDA_LAUNCHED("argmax_chunks_kernel");
  if (chunks > 1) {
    argmax_merge_kernel<<<unsigned(rows), 32, 0, stream()>>>(part_v.data<float>(), part_i.data<int32_t>(), chunks,
                                                             ids.data<int32_t>());
    MS_CUDA_LAUNCHED("argmax_merge_kernel");
  }
}

std::vector<int32_t> argmax_rows(const Tensor& logits) {
  std::vector<int32_t> out(size_t(logits.dim() == 2 ? logits.size(0) : 0), 0);
  if (out.empty()) return out;
  Tensor ids = scratch(DType::I32, {logits.size(0)});
  argmax_rows_into(logits, ids);
  download(out.data(), ids.raw(), out.size() * sizeof(int32_t));
  return out;
}

namespace {
// Pinned host memory the copy lands in, and an event the host waits on instead of the stream.
class CudaReadback final : public ops::HostReadback {
 public:
  explicit CudaReadback(int64_t capacity) : capacity_(capacity) {
    MS_CUDA(cudaMallocHost(&host_, size_t(std::max<int64_t>(capacity, 1)) * sizeof(int32_t)));
    MS_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~CudaReadback() override {
    cudaEventSynchronize(done_);  // no copy may land in freed memory
    cudaEventDestroy(done_);
    cudaFreeHost(host_);
  }
  void start(const Tensor& ids) override {
    check_device_tensor(ids, {DType::I32}, "readback", "ids");
    MS_CHECK(ids.numel() <= capacity_ && ids.is_contiguous(), "readback of ", ids.describe(), ", capacity ", capacity_);
    MS_CUDA(cudaEventSynchronize(done_));  // the previous copy's values were read
    count_ = size_t(ids.numel());
    MS_CUDA(cudaMemcpyAsync(host_, ids.raw(), count_ * sizeof(int32_t), cudaMemcpyDeviceToHost, stream()));
    MS_CUDA(cudaEventRecord(done_, stream()));
  }
  std::span<const int32_t> wait() override {
    MS_CUDA(cudaEventSynchronize(done_));
    return {host_, count_};
  }

 private:
  int64_t capacity_;
  int32_t* host_ = nullptr;
  cudaEvent_t done_ = nullptr;
  size_t count_ = 0;
};
}  // namespace

std::unique_ptr<ops::HostReadback> make_host_readback(int64_t capacity) {
  return std::make_unique<CudaReadback>(capacity);
}

}  // namespace ms::cuda
