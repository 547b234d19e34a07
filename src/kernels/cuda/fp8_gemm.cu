// Activation quantisation and the FP8 block-scaled product (fp8_gemm.h). The own kernel: a
// 128x128 output tile per block of 8 warps, K walked in the 128-wide scale blocks through a
// two-stage cp.async pipeline; each block's partial sums come from mma.sync m16n8k32 e4m3 and
// are scaled into the f32 total with that block's activation and weight scales.
#include "kernels/cuda/fp8_gemm.h"

#include <atomic>

#include "kernels/cuda/gemm.h"

namespace ms::cuda {
namespace {

std::atomic<Fp8Mode> g_mode{Fp8Mode::Dequant};

constexpr int kGroup = 128;  // activation group = weight block along K

// One warp per (row, 128-wide group): 32 lanes x 4 elements. Row r reads x[src] (src < 0: a
// pad row of zeros) and writes its group scale at scales[sbase + g * sld]. Without a row table,
// src = r (pad rows past T), sbase = r, sld = the padded row count.
__global__ void quantize_kernel(const bf16* x, int64_t xs, int64_t T, int64_t K, int64_t rows,
                                const int32_t* table, uint8_t* q, float* scales) {
  const int64_t warp = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t groups = (K + kGroup - 1) / kGroup;
  if (warp >= rows * groups) return;
  const int64_t r = warp / groups, g = warp % groups;
  int64_t src = r < T ? r : -1, sbase = r, sld = rows;
  if (table) src = table[3 * r], sbase = table[3 * r + 1], sld = table[3 * r + 2];
  const int64_t k = g * kGroup + lane * 4;
  const bool live = k < K;
  float v[4] = {0.f, 0.f, 0.f, 0.f};
  if (src >= 0 && live) {
    const bf16* p = x + src * xs + k;
    for (int i = 0; i < 4; ++i) v[i] = __bfloat162float(p[i]);
  }
  float scale;
  const uint32_t packed = quantize_e4m3_group4(v, scale);
  if (live) *reinterpret_cast<uint32_t*>(q + r * K + k) = packed;
  if (lane == 0) scales[sbase + g * sld] = scale;
}

Fp8Rows quantize(const Tensor& x, int64_t T, int64_t rows, const Tensor* table) {
  MS_CHECK(x.device() == Device::CUDA && x.dtype() == DType::BF16 && x.strides()[1] == 1,
           "fp8 quantisation: input ", x.describe(), " must be BF16 CUDA rows");
  const int64_t K = x.size(1);
  MS_CHECK(K % 16 == 0, "fp8 quantisation: ", K, " features (a multiple of 16 needed)");
  Fp8Rows out;
  out.rows = rows, out.K = K;
  out.q = scratch(DType::F8_E4M3, {std::max<int64_t>(rows, 1), K});
  out.scales = scratch(DType::F32, {std::max<int64_t>(rows * out.groups(), 1)});
  if (rows == 0) return out;
  const int threads = 256;
  quantize_kernel<<<blocks_for(rows * out.groups() * 32, threads), threads, 0, stream()>>>(
      x.data<bf16>(), x.strides()[0], T, K, rows, table ? table->data<int32_t>() : nullptr, out.q.data<uint8_t>(),
      out.scales.data<float>());
  MS_CUDA_LAUNCHED("quantize_kernel");
  return out;
}

// ---- The own kernel ----------------------------------------------------------------------

constexpr int kTile = 128;             // output rows and columns per block, and K per stage
constexpr int kPitch = kTile + 16;     // bytes per shared row: fragment loads hit 32 distinct banks
constexpr int kThreads = 256;          // 8 warps: 2 along M (64 rows each) x 4 along N (32 columns)
constexpr size_t kStageBytes = size_t(2) * kTile * kPitch;
constexpr size_t kSmemBytes = 2 * kStageBytes;

struct MmaArgs {
  const uint8_t* x;    // [M, K] rows, stride K
  const float* xs;     // xs[kb * xs_ld + m]
  const uint8_t* w;    // [N, K] rows, stride w_ld
  const float* ws;     // ws[(n / block_n) * ws_ld + kb]
  int64_t xs_ld, w_ld, ws_ld, M, N, K, os;
  int block_n;
};

__device__ __forceinline__ void cp_async16(uint8_t* dst, const uint8_t* src, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}

// Rows [r0, r0 + 128) of a [rows, K] byte matrix, K columns [k0, k0 + 128), into shared memory;
// what lies outside is zero-filled (a zero contributes nothing to the sums).
__device__ __forceinline__ void load_tile(uint8_t* dst, const uint8_t* src, int64_t ld, int64_t r0, int64_t rows,
                                          int64_t k0, int64_t K) {
  for (int c = threadIdx.x; c < kTile * kTile / 16; c += kThreads) {
    const int row = c / (kTile / 16), col = (c % (kTile / 16)) * 16;
    const bool valid = r0 + row < rows && k0 + col < K;
    cp_async16(dst + row * kPitch + col, valid ? src + (r0 + row) * ld + k0 + col : src, valid);
  }
}

__device__ __forceinline__ uint32_t lds32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }

__device__ __forceinline__ void mma_e4m3(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Fragments of mma.m16n8k32 (g = lane / 4, t = lane % 4): A regs = (row g, k 4t), (row g + 8,
// k 4t), (row g, k 16 + 4t), (row g + 8, k 16 + 4t), 4 bytes each; B regs = (column g, k 4t),
// (column g, k 16 + 4t); D = (row g, columns 2t, 2t + 1), (row g + 8, the same columns).
template <class TO>
__global__ void __launch_bounds__(kThreads, 1) fp8_mma_kernel(MmaArgs p, TO* out) {
  extern __shared__ __align__(16) uint8_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = (warp % 2) * 64, wn = (warp / 2) * 32;
  const int64_t m0 = int64_t(blockIdx.y) * kTile, n0 = int64_t(blockIdx.x) * kTile;
  const int64_t nkb = (p.K + kTile - 1) / kTile;
  float acc[4][4][4] = {};
  auto stage = [&](int s) { return smem + s * kStageBytes; };
  load_tile(stage(0), p.x, p.K, m0, p.M, 0, p.K);
  load_tile(stage(0) + kTile * kPitch, p.w, p.w_ld, n0, p.N, 0, p.K);
  asm volatile("cp.async.commit_group;\n" ::);
  for (int64_t kb = 0; kb < nkb; ++kb) {
    if (kb + 1 < nkb) {
      load_tile(stage((kb + 1) % 2), p.x, p.K, m0, p.M, (kb + 1) * kTile, p.K);
      load_tile(stage((kb + 1) % 2) + kTile * kPitch, p.w, p.w_ld, n0, p.N, (kb + 1) * kTile, p.K);
    }
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 1;\n" ::);
    __syncthreads();
    const uint8_t* As = stage(kb % 2);
    const uint8_t* Bs = As + kTile * kPitch;
    float part[4][4][4] = {};
#pragma unroll
    for (int ks = 0; ks < kTile; ks += 32) {
      uint32_t a[4][4], b[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint8_t* r = As + (wm + i * 16 + g) * kPitch + ks + t * 4;
        a[i][0] = lds32(r), a[i][1] = lds32(r + 8 * kPitch), a[i][2] = lds32(r + 16), a[i][3] = lds32(r + 8 * kPitch + 16);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint8_t* c = Bs + (wn + j * 8 + g) * kPitch + ks + t * 4;
        b[j][0] = lds32(c), b[j][1] = lds32(c + 16);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_e4m3(part[i][j], a[i], b[j]);
    }
    float sa[4][2], sb[4][2];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t m = m0 + wm + i * 16 + g + h * 8;
        sa[i][h] = m < p.M ? p.xs[kb * p.xs_ld + m] : 0.f;
      }
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t n = n0 + wn + j * 8 + t * 2 + e;
        sb[j][e] = n < p.N ? p.ws[(n / p.block_n) * p.ws_ld + kb] : 0.f;
      }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][j][c] += part[i][j][c] * sa[i][c / 2] * sb[j][c % 2];
    __syncthreads();  // the next iteration's loads overwrite the other stage only after all reads
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int64_t m = m0 + wm + i * 16 + g + (c / 2) * 8, n = n0 + wn + j * 8 + t * 2 + c % 2;
        if (m < p.M && n < p.N) store_f(out + m * p.os + n, acc[i][j][c]);
      }
}

template <class TO>
void launch_mma(const MmaArgs& a, TO* out) {
  static PerDeviceOnce raise_smem_limit;
  raise_smem_limit(
      [] { MS_CUDA(cudaFuncSetAttribute(fp8_mma_kernel<TO>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes))); });
  dim3 grid(unsigned((a.N + kTile - 1) / kTile), unsigned((a.M + kTile - 1) / kTile));
  fp8_mma_kernel<TO><<<grid, kThreads, kSmemBytes, stream()>>>(a, out);
  MS_CUDA_LAUNCHED("fp8_mma_kernel");
}

}  // namespace

void set_fp8_mode(Fp8Mode mode) { g_mode.store(mode); }
Fp8Mode fp8_mode() { return g_mode.load(); }

Fp8Rows quantize_rows(const Tensor& x) {
  const int64_t T = x.size(0);
  return quantize(x, T, (T + 3) / 4 * 4, nullptr);
}

Fp8Rows quantize_segments(const Tensor& x, const std::vector<int32_t>& src, const std::vector<int64_t>& seg_start) {
  const int64_t rows = int64_t(src.size()), groups = (x.size(1) + kGroup - 1) / kGroup;
  MS_CHECK(!seg_start.empty() && seg_start.back() == rows, "fp8 quantisation: segments end at ", seg_start.back(),
           ", rows ", rows);
  std::vector<int32_t> table(size_t(3 * rows));
  for (size_t s = 0; s + 1 < seg_start.size(); ++s) {
    const int64_t a = seg_start[s], n = seg_start[s + 1] - a;
    MS_CHECK(n % 4 == 0, "fp8 quantisation: segment of ", n, " rows (a multiple of 4 needed)");
    for (int64_t r = a; r < a + n; ++r) {
      table[3 * r] = src[r], table[3 * r + 1] = int32_t(a * groups + (r - a)), table[3 * r + 2] = int32_t(n);
    }
  }
  Tensor dev = upload_i32(table);
  return quantize(x, x.size(0), rows, &dev);
}

bool fp8_gemm_supported(const ops::Weight& w) {
  const Tensor& t = w.w;
  return w.is_fp8() && t.device() == Device::CUDA && t.dim() == 2 && t.strides()[1] == 1 &&
         t.strides()[0] % 16 == 0 && reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0 && t.size(1) % 16 == 0 &&
         w.block_k == kGroup && w.block_n > 0 && w.scale_inv.dtype() == DType::F32 &&
         w.scale_inv.device() == Device::CUDA && w.scale_inv.strides()[1] == 1;
}

void fp8_gemm(const Fp8Rows& x, int64_t row0, int64_t rows, const ops::Weight& w, void* out, DType out_dtype,
              int64_t os) {
  const int64_t N = w.out_features(), K = w.in_features(), groups = x.groups();
  MS_CHECK(fp8_gemm_supported(w), "fp8_gemm: weight ", w.w.describe(), " (block ", w.block_n, "x", w.block_k,
           ") is not e4m3 rows with 128-wide K blocks and F32 scales");
  MS_CHECK(K == x.K && rows % 4 == 0 && row0 + rows <= x.rows, "fp8_gemm: rows [", row0, ", ", row0 + rows, ") of ",
           x.rows, " x ", x.K, " against weight ", w.w.describe());
  if (rows == 0 || N == 0) return;
  const uint8_t* xq = x.q.data<uint8_t>() + row0 * K;
  const float* xs = x.scales.data<float>() + row0 * groups;
  const int64_t ws_ld = w.scale_inv.strides()[0];
  // cuBLASLt infers the scale tensors' strides; take it only where they cannot be ambiguous.
  const bool lt_layout = w.block_n == kGroup && K % 512 == 0 && ws_ld == groups;
  if (fp8_mode() != Fp8Mode::OwnKernel && lt_layout &&
      matmul_fp8_blocks(N, rows, K, w.w.raw(), w.w.strides()[0], w.scale_inv.data<float>(), xq, xs, out, out_dtype, os))
    return;
  MmaArgs a{xq, xs, w.w.data<uint8_t>(), w.scale_inv.data<float>(), rows, w.w.strides()[0], ws_ld, rows, N, K, os,
            w.block_n};
  MS_FLOAT_DISPATCH(out_dtype, TO, launch_mma<TO>(a, static_cast<TO*>(out)));
}

}  // namespace ms::cuda
