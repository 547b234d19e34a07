// Rotary embedding on [T, H, D] views (strided tokens and heads, contiguous head dims), NeoX or
// interleaved pairs. One warp per (token, head): each lane reads its pairs into registers
// before any lane writes, because the interleaved form writes its result de-interleaved
// (i, i + half) over the inputs (2i, 2i + 1), as the CPU op and the reference do.
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

constexpr int kMaxPairsPerLane = 8;  // rot_dim up to 512

template <class T>
__global__ void rope_kernel(T* x, int64_t s0, int64_t s1, int64_t T_, int64_t H, int offset, int half,
                            const int32_t* positions, const float* cos, const float* sin, bool interleaved) {
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= T_ * H) return;
  const int64_t t = row / H, h = row % H;
  T* v = x + t * s0 + h * s1 + offset;
  const float* c = cos + int64_t(positions[t]) * half;
  const float* s = sin + int64_t(positions[t]) * half;
  float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      float a = load_f(v + (interleaved ? 2 * i : i)), b = load_f(v + (interleaved ? 2 * i + 1 : i + half));
      lo[p] = a * c[i] - b * s[i];
      hi[p] = b * c[i] + a * s[i];
    }
  }
  __syncwarp();
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      store_f(v + i, lo[p]);
      store_f(v + i + half, hi[p]);
    }
  }
}

}  // namespace

void rope(Tensor& x, int offset, int rot_dim, std::span<const int32_t> positions, const Tensor& cos,
          const Tensor& sin, bool interleaved) {
  MS_CHECK(x.device() == Device::CUDA && x.dim() == 3, "rope: x ", x.describe(), " must be a CUDA [T, H, D] tensor");
  const int64_t T = x.size(0), H = x.size(1), half = rot_dim / 2;
  MS_CHECK(int64_t(positions.size()) == T && cos.size(1) == half && rot_dim % 2 == 0, "rope: ", x.describe(),
           " with ", positions.size(), " positions and a table of ", cos.describe());
  MS_CHECK(offset >= 0 && offset + rot_dim <= x.size(2) && x.strides()[2] == 1, "rope: dims [", offset, ", ",
           offset + rot_dim, ") of ", x.describe(), " (head dims must be contiguous)");
  MS_CHECK(half <= 32 * kMaxPairsPerLane, "rope: rot_dim ", rot_dim, " exceeds ", 64 * kMaxPairsPerLane);
  check_device_tensor(cos, {DType::F32}, "rope", "cos table");
  check_device_tensor(sin, {DType::F32}, "rope", "sin table");
  MS_CHECK(cos.is_contiguous() && sin.is_contiguous(), "rope: tables must be contiguous");
  for (int32_t p : positions)
    MS_CHECK(p >= 0 && p < cos.size(0), "position ", p, " is beyond the rope table (max_position_embeddings ",
             cos.size(0), ")");
  if (T * H == 0) return;
  Tensor pos = upload_i32(positions);
  const int warps = 8;
  MS_FLOAT_DISPATCH(x.dtype(), TX,
    rope_kernel<TX><<<blocks_for(T * H, warps), warps * 32, 0, stream()>>>(
        x.data<TX>(), x.strides()[0], x.strides()[1], T, H, offset, int(half), pos.data<int32_t>(),
        cos.data<float>(), sin.data<float>(), interleaved));
  MS_CUDA_LAUNCHED("rope_kernel");
}

}  // namespace ms::cuda
