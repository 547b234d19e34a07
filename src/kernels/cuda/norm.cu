// RMSNorm, alone or fused with the residual add before it (add_rms_norm: a decoder block's
// x += f; h = norm(x), one launch that reads the residual and the addend once). Rows may be
// strided as in elementwise.cu; arithmetic is f32. The fused form stores the sum in the
// residual's dtype and normalises that stored value, so it gives the bits of add_inplace
// followed by rms_norm.
#include <algorithm>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

struct Rows {
  int64_t n, width, stride;
};

// A tensor seen as rows [size(0), numel / size(0)] with row stride strides[0], contiguous inside.
Rows rows_of(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.device() == Device::CUDA && t.dim() >= 1, op, ": ", what, " ", t.describe(), " must be CUDA rows");
  int64_t expect = 1;
  for (int d = t.dim() - 1; d >= 1; --d) {
    MS_CHECK(t.size(d) == 1 || t.strides()[d] == expect, op, ": ", what, " ", t.describe(),
             " must have contiguous rows");
    expect *= t.size(d);
  }
  return {t.size(0), expect, t.strides()[0]};
}

// Whether rows starting at `p`, `stride` elements of 2 bytes apart, are all 16-byte aligned.
bool wide(const void* p, int64_t stride) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 8 == 0; }

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += shared[w];
  return total;
}

// A block a row, any widths and dtypes. With y, the row is x + y, stored into x first; the
// stored value is what is squared and normalised (thread i reads back its own elements).
template <class T, class TY, class TW>
__global__ void rms_norm_kernel(T* x, int64_t xs, const TY* y, int64_t ys, const TW* w, float eps, int64_t D, T* out,
                                int64_t os) {
  __shared__ float partial[32];
  pdl_trigger();  // the product after a norm may start fetching its weights now
  T* xr = x + int64_t(blockIdx.x) * xs;
  T* orow = out + int64_t(blockIdx.x) * os;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    if (y) store_f(xr + i, load_f(xr + i) + load_f(y + int64_t(blockIdx.x) * ys + i));
    float v = load_f(xr + i);
    ss += v * v;
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, partial) / float(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) store_f(orow + i, load_f(xr + i) * inv * load_f(w + i));
}

constexpr int kNormPieces = 2;          // 16-byte pieces a thread, at most
constexpr int kNormMaxGroup = 1024;     // threads a row, at most: widths up to 16384
constexpr int kNormMinBlock = 128;

// RMSNorm of bf16 rows (width a multiple of 8, 16-byte aligned rows and weight) by groups of
// `group` threads a row (a power of two: a part of a warp for narrow rows such as per-head
// q/k norms, up to a whole block for wide ones), so that a handful of rows, or one, still spreads
// over many threads. Each thread keeps its 16-byte pieces (and their weights, loaded at once so
// both reads are in flight together) in registers from the sum of squares to the write, so a row
// is read once and in place is safe. With y (kAdd), a piece is x + y rounded to bf16, written
// back to x, and that rounded value is normalised, as rms_norm_kernel does.
template <class TW, bool kAdd>
__global__ void rms_norm_rows_kernel(bf16* x, int64_t xs, const bf16* y, int64_t ys, const TW* w, float eps, int D,
                                     int64_t rows, int group, bf16* out, int64_t os) {
  __shared__ float warp_ss[32];
  pdl_trigger();  // the product after a norm may start fetching its weights now
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
  const int g = int(threadIdx.x) % group, n = D / 8;
  const bool live = row < rows;  // threads past the last row still join the reductions
  float v[kNormPieces][8], wt[kNormPieces][8], ss = 0.f;
#pragma unroll
  for (int i = 0; i < kNormPieces; ++i) {
    const int c = g + group * i;
    if (!live || c >= n) break;
    uint4* xp = reinterpret_cast<uint4*>(x + row * xs) + c;
    unpack8(*xp, v[i]);
    if constexpr (kAdd) {
      float add[8];
      unpack8(reinterpret_cast<const uint4*>(y + row * ys)[c], add);
#pragma unroll
      for (int j = 0; j < 8; ++j) add[j] += v[i][j];
      const uint4 sum = pack8(add);
      *xp = sum;
      unpack8(sum, v[i]);
    }
    load8(w + c * 8, wt[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
  }
  for (int o = min(group, 32) / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (group > 32) {  // the row's warps meet in shared memory
    if (threadIdx.x % 32 == 0) warp_ss[threadIdx.x / 32] = ss;
    __syncthreads();
    const int first = int(threadIdx.x) / group * (group / 32);
    ss = 0.f;
    for (int k = 0; k < group / 32; ++k) ss += warp_ss[first + k];
  }
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
#pragma unroll
  for (int i = 0; i < kNormPieces; ++i) {
    const int c = g + group * i;
    if (!live || c >= n) break;
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = v[i][j] * inv * wt[i][j];
    reinterpret_cast<uint4*>(out + row * os)[c] = pack8(o);
  }
}

// out = norm(x), or with y: x += y, out = norm(x). x and out share a dtype; y may differ.
void norm_rows(const char* op, const Tensor& x, const Tensor* y, const Tensor& weight, float eps, const Tensor& out) {
  Rows xr = rows_of(x, op, "input"), orow = rows_of(out, op, "output");
  Rows yr = y ? rows_of(*y, op, "addend") : xr;
  MS_CHECK(weight.numel() == xr.width && orow.n == xr.n && orow.width == xr.width && x.dtype() == out.dtype() &&
               yr.n == xr.n && yr.width == xr.width,
           op, ": ", x.describe(), y ? " + " + y->describe() : "", " -> ", out.describe(), " with weight ",
           weight.describe());
  check_device_tensor(weight, {DType::BF16, DType::F32}, op, "weight");
  MS_CHECK(weight.is_contiguous(), op, ": weight must be contiguous");
  if (xr.n == 0) return;
  bf16* yb = y && y->dtype() == DType::BF16 ? y->data<bf16>() : nullptr;
  if (x.dtype() == DType::BF16 && (!y || (yb && wide(yb, yr.stride))) && xr.width % 8 == 0 &&
      xr.width <= 8 * kNormPieces * kNormMaxGroup && wide(x.raw(), xr.stride) && wide(out.raw(), orow.stride) &&
      wide(weight.raw(), 0)) {
    // A thread a 16-byte piece (threads a row: a power of two), two pieces each past 8192 wide.
    int group = 1;
    while (group < kNormMaxGroup && group < xr.width / 8) group *= 2;
    const int block = std::max(group, kNormMinBlock), rows_per_block = block / group;
    MS_FLOAT_DISPATCH(weight.dtype(), TW, {
      auto kernel = y ? rms_norm_rows_kernel<TW, true> : rms_norm_rows_kernel<TW, false>;
      kernel<<<blocks_for(xr.n, rows_per_block), block, 0, stream()>>>(x.data<bf16>(), xr.stride, yb, yr.stride,
                                                                        weight.data<TW>(), eps, int(xr.width), xr.n,
                                                                        group, out.data<bf16>(), orow.stride);
    });
    MS_CUDA_LAUNCHED("rms_norm_rows_kernel");
    return;
  }
  const int threads = xr.width >= 1024 ? 256 : 128;
  const DType ydt = y ? y->dtype() : x.dtype();
  MS_FLOAT_DISPATCH(x.dtype(), T, MS_FLOAT_DISPATCH(ydt, TY, MS_FLOAT_DISPATCH(weight.dtype(), TW,
    rms_norm_kernel<T, TY, TW><<<unsigned(xr.n), threads, 0, stream()>>>(
        x.data<T>(), xr.stride, y ? y->data<TY>() : nullptr, yr.stride, weight.data<TW>(), eps, xr.width,
        out.data<T>(), orow.stride))));
  MS_CUDA_LAUNCHED("rms_norm_kernel");
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  norm_rows("rms_norm", x, nullptr, weight, eps, out);
}

void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, Tensor& out) {
  MS_CHECK(residual.shape() == y.shape(), "add_rms_norm: ", residual.describe(), " + ", y.describe());
  norm_rows("add_rms_norm", residual, &y, weight, eps, out);
}

}  // namespace ms::cuda
