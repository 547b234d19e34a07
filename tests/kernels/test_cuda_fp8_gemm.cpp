// The FP8 block-scaled GEMM (per-token 1x128 e4m3 activations times 128x128-block weights) on
// DeepSeek-V3's linear shapes, through cuda::linear with the GEMM forced at every row count
// (Fp8GemmAllRows), by cuBLASLt where it takes the shape and by the own kernel. Two references on sampled rows: the
// CPU op on the BF16 activations (the FP8 bound: e4m3 keeps 3 mantissa bits, so rounding the
// activations moves each product by up to 2^-4 relative, about 2.5% rms, and sums of random
// terms keep that ratio: 5e-2 holds it with margin), and the CPU op on the activations quantised
// as the GPU does (only bf16 output rounding and summation order remain: 1e-2).
#include <cmath>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/fp8_gemm.h"

namespace ms {
namespace {
using namespace test;

constexpr double kFp8Tol = 5e-2;
constexpr double kSameInputsTol = 1e-2;

// x [T, K] as quantize_rows sees it: per row and 128-wide group, scale = amax / 448, values
// divided by it, rounded to e4m3 (nearest even, saturating) and multiplied back.
Tensor quantised_like_gpu(const Tensor& x) {
  Tensor out = x.clone();
  const int64_t T = x.size(0), K = x.size(1);
  for (int64_t t = 0; t < T; ++t) {
    float* row = out.data<float>() + t * K;
    for (int64_t k0 = 0; k0 < K; k0 += 128) {
      const int64_t k1 = std::min<int64_t>(K, k0 + 128);
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(row[k]));
      const float scale = amax > 0.f ? amax / 448.0f : 1.0f;
      for (int64_t k = k0; k < k1; ++k) row[k] = fp8_e4m3_to_f32(f32_to_fp8_e4m3(row[k] / scale)) * scale;
    }
  }
  return out;
}

Tensor cpu_linear(const Tensor& x, const ops::Weight& w) {
  Tensor out = Tensor::empty(DType::F32, {x.size(0), w.out_features()});
  cpu::linear(x, w, nullptr, out);
  return out;
}

struct ModeGuard {
  explicit ModeGuard(cuda::Fp8Mode m) : previous(cuda::fp8_mode()) { cuda::set_fp8_mode(m); }
  ~ModeGuard() { cuda::set_fp8_mode(previous); }
  cuda::Fp8Mode previous;
};

bool all_finite(const Tensor& f32) {
  for (float v : f32.span<float>())
    if (!std::isfinite(v)) return false;
  return true;
}

// q_b / kv_a-like (7168 -> 2112, half a block at the N edge), a fused projection (7168 -> 4096)
// and an expert's down projection (2048 -> 7168); a decode-sized, a chunk-sized and a prefill
// batch of rows.
TEST(CudaFp8Gemm, MatchesCpuOnDeepSeekV3Shapes) {
  MS_REQUIRE_CUDA();
  struct Shape {
    int64_t K, N;
  };
  for (Shape s : {Shape{7168, 2112}, Shape{7168, 4096}, Shape{2048, 7168}}) {
    Fp8Weight w = random_fp8(s.N, s.K);
    for (int64_t T : {9, 512, 4096}) {
      Tensor x = randn({T, s.K});
      std::vector<int64_t> rows;
      for (int64_t t = 0; t < T; t += std::max<int64_t>(1, T / 24)) rows.push_back(t);
      Tensor xs = select_rows(x, rows);
      Tensor ref = cpu_linear(xs, w.cpu), ref_q = cpu_linear(quantised_like_gpu(xs), w.cpu);
      Tensor xg = gpu(x);
      for (cuda::Fp8Mode mode : {cuda::Fp8Mode::Fp8GemmAllRows, cuda::Fp8Mode::OwnKernel}) {
        ModeGuard guard(mode);
        Tensor out = poisoned(DType::BF16, {T, s.N});
        cuda::linear(xg, w.gpu, nullptr, out);
        Tensor host = out.to_f32();
        const char* name = mode == cuda::Fp8Mode::OwnKernel ? "own" : "gemm";
        ASSERT_TRUE(all_finite(host)) << name << " K=" << s.K << " N=" << s.N << " T=" << T << ": unwritten output";
        Tensor got = select_rows(host, rows);
        const double err = rel_error(got, ref), err_q = rel_error(got, ref_q);
        EXPECT_LT(err, kFp8Tol) << name << " K=" << s.K << " N=" << s.N << " T=" << T;
        EXPECT_LT(err_q, kSameInputsTol) << name << " K=" << s.K << " N=" << s.N << " T=" << T;
        std::printf("[ fp8 ] %-4s K=%lld N=%lld T=%lld: rel error %.3e (bf16 input), %.3e (same quantised input)\n",
                    name, static_cast<long long>(s.K), static_cast<long long>(s.N), static_cast<long long>(T), err,
                    err_q);
      }
    }
  }
}

// The quantiser alone: every group's scale is its amax / 448 and every value the e4m3 rounding
// of value / scale; pad rows (T = 5 rounds to 8) are zero.
TEST(CudaFp8Gemm, QuantizeRowsMatchesCpuRounding) {
  MS_REQUIRE_CUDA();
  const int64_t T = 5, K = 320;  // a partial last group
  Tensor x = randn({T, K}, 3.0f);
  cuda::Fp8Rows q = cuda::quantize_rows(gpu(x));
  ASSERT_EQ(q.rows, 8);
  Tensor codes = q.q.to(Device::CPU), scales = q.scales.to(Device::CPU);
  int64_t mismatched = 0;
  for (int64_t t = 0; t < q.rows; ++t)
    for (int64_t g = 0; g < q.groups(); ++g) {
      const float scale = scales.data<float>()[g * q.rows + t];
      float amax = 0.f;
      for (int64_t k = g * 128; k < std::min<int64_t>(K, (g + 1) * 128); ++k) {
        const float v = t < T ? x.data<float>()[t * K + k] : 0.f;
        amax = std::max(amax, std::fabs(v));
        const uint8_t want = t < T ? f32_to_fp8_e4m3(v / scale) : 0;
        mismatched += codes.data<uint8_t>()[t * K + k] != want;
      }
      if (t < T) {
        EXPECT_FLOAT_EQ(scale, amax / 448.0f) << "row " << t << " group " << g;
      }
    }
  EXPECT_EQ(mismatched, 0);
}

}  // namespace
}  // namespace ms
