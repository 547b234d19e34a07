// Every dense and element-wise CUDA op against its CPU op on random inputs of realistic shapes
// (Qwen3-30B-A3B / DeepSeek-V2-Lite widths), including the strided views the layers pass.
// Inputs are exact bf16 values; the CPU runs them in f32, the GPU in bf16 with f32 accumulation,
// so the bound is bf16 output rounding plus accumulation order: relative error below 1e-2.
#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"

namespace ms {
namespace {
using namespace test;

constexpr double kBf16Tol = 1e-2;

Tensor cpu_linear(const Tensor& x, const ops::Weight& w, const Tensor* bias) {
  Tensor out = Tensor::empty(DType::F32, {x.size(0), w.out_features()});
  cpu::linear(x, w, bias, out);
  return out;
}

TEST(CudaOps, LinearBf16MatchesCpu) {
  MS_REQUIRE_CUDA();
  for (int64_t T : {1, 5, 8, 77, 512}) {  // up to 8 rows: the weight-streaming kernel
    const int64_t K = 2048, N = 768;
    Tensor x = randn({T, K}), w = randn({N, K}, 0.02f);
    ops::Weight wc{host_as(w, DType::BF16)}, wg{gpu(w)};
    Tensor out = poisoned(DType::BF16, {T, N});
    cuda::linear(gpu(x), wg, nullptr, out);
    EXPECT_LT(rel_error(out, cpu_linear(x, wc, nullptr)), kBf16Tol) << "T=" << T;
  }
}

// A dense gated MLP's silu(x gate^T) * (x up^T) at decode and prefill row counts (the streaming
// product; two cuBLASLt products and the SiLU pass), V2-Lite's shared-expert width.
TEST(CudaOps, GatedLinearMatchesCpu) {
  MS_REQUIRE_CUDA();
  const int64_t K = 2048, I = 2816;
  Tensor gate = randn({I, K}, 0.02f), up = randn({I, K}, 0.02f);
  const ops::Weight gc{host_as(gate, DType::BF16)}, uc{host_as(up, DType::BF16)}, gg{gpu(gate)}, ug{gpu(up)};
  for (int64_t T : {4, 300, 1024}) {
    Tensor x = randn({T, K});
    Tensor want = Tensor::empty(DType::F32, {T, I});
    cpu::gated_linear(x, gc, uc, false, want);
    Tensor act = poisoned(DType::BF16, {T, I});
    cuda::gated_linear(gpu(x), gg, ug, false, act);
    EXPECT_LT(rel_error(act, want), kBf16Tol) << "T=" << T;
  }
}

// Column slices in and out (row stride != width), a bias, and F32 output (router logits).
TEST(CudaOps, LinearStridedBiasAndF32Output) {
  MS_REQUIRE_CUDA();
  for (int64_t T : {3, 45}) {
  const int64_t K = 1024, N = 320;
  Tensor xw = randn({T, K + 64}), w = randn({N, K}, 0.03f), b = randn({N}, 0.5f);
  Tensor x = xw.slice(1, 32, 32 + K).clone();
  ops::Weight wc{host_as(w, DType::BF16)}, wg{gpu(w)};
  Tensor ref = cpu_linear(x, wc, &b);
  Tensor xg = gpu(xw).slice(1, 32, 32 + K);
  Tensor big = poisoned(DType::BF16, {T, N + 128}), view = big.slice(1, 64, 64 + N);
  Tensor bg = b.to(Device::CUDA);
  cuda::linear(xg, wg, &bg, view);
  EXPECT_LT(rel_error(host_block(big, 64, N), ref), kBf16Tol);
  Tensor out32 = poisoned(DType::F32, {T, N});
  cuda::linear(xg, wg, &bg, out32);
  EXPECT_LT(rel_error(out32, ref), 1e-3) << "T=" << T;  // no output rounding: bf16 inputs, f32 sums
  }
}

// FP8 128x128 blocks with partial edge blocks in both dimensions, in both FP8 modes. Dequant
// keeps BF16 activations (the bf16 bound). Fp8Gemm sends more than 8 rows to the FP8 GEMM, whose
// activations are rounded to e4m3 per 1x128 group (about 2.6% rms per product: the FP8 bound,
// 5e-2, test_cuda_fp8_gemm.cpp says more).
TEST(CudaOps, LinearFp8BlocksMatchCpu) {
  MS_REQUIRE_CUDA();
  for (cuda::Fp8Mode mode : {cuda::Fp8Mode::Dequant, cuda::Fp8Mode::Fp8Gemm})
    for (int64_t T : {1, 7, 32, 40, 64, 65, 130}) {  // Dequant: up to 8 rows streamed, then the w8a16 GEMM
      const int64_t K = 1600, N = 704;
      Tensor x = randn({T, K});
      Fp8Weight w = random_fp8(N, K);
      Tensor out = poisoned(DType::BF16, {T, N});
      cuda::set_fp8_mode(mode);
      cuda::linear(gpu(x), w.gpu, nullptr, out);
      cuda::set_fp8_mode(cuda::Fp8Mode::Dequant);
      const double tol = mode == cuda::Fp8Mode::Fp8Gemm && T > 8 ? 5e-2 : kBf16Tol;
      EXPECT_LT(rel_error(out, cpu_linear(x, w.cpu, nullptr)), tol) << "mode " << int(mode) << " T=" << T;
    }
}

// The BF16 copy of FP8 blocks that more rows multiply through cuBLASLt: every element exactly
// bf16(e4m3 value * its block's scale), through the 16-wide kernel (K a multiple of 16, partial
// edge blocks) and the scalar one (K = 1601).
TEST(CudaOps, WeightBf16DequantisesFp8BlocksExactly) {
  MS_REQUIRE_CUDA();
  for (int64_t K : {1600, 1601}) {
    const int64_t N = 300;
    Fp8Weight w = random_fp8(N, K);
    Tensor got = cuda::weight_bf16(w.gpu).to(Device::CPU);
    const uint8_t* q = w.cpu.w.data<uint8_t>();
    const float* s = w.cpu.scale_inv.data<float>();
    const uint16_t* g = got.data<uint16_t>();
    int64_t wrong = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const float v = fp8_e4m3_to_f32(q[n * K + k]) * s[(n / 128) * w.cpu.scale_inv.strides()[0] + k / 128];
        wrong += g[n * K + k] != f32_to_bf16(v);
      }
    EXPECT_EQ(wrong, 0) << "K=" << K;
  }
}

TEST(CudaOps, RmsNormMatchesCpuIncludingColumnSliceInPlace) {
  MS_REQUIRE_CUDA();
  const int64_t T = 33, D = 2048;
  Tensor x = randn({T, D}, 3.0f), w = randn({D}, 0.5f);
  Tensor ref = Tensor::empty(DType::F32, {T, D});
  cpu::rms_norm(x, w, 1e-6f, ref);
  Tensor out = poisoned(DType::BF16, {T, D});
  cuda::rms_norm(gpu(x), gpu(w), 1e-6f, out);
  EXPECT_LT(rel_error(out, ref), kBf16Tol);
  // MLA's latent: the first 512 columns of a [T, 576] row, normalised in place.
  Tensor kv = randn({T, 576}, 2.0f), w2 = randn({512}, 0.5f);
  Tensor lat = kv.slice(1, 0, 512).clone(), ref2 = lat.clone();
  cpu::rms_norm(lat, w2, 1e-6f, ref2);
  Tensor kvg = gpu(kv), latg = kvg.slice(1, 0, 512);
  cuda::rms_norm(latg, gpu(w2, DType::F32), 1e-6f, latg);
  EXPECT_LT(rel_error(host_block(kvg, 0, 512), ref2), kBf16Tol);
  EXPECT_EQ(rel_error(host_block(kvg, 512, 64), kv.slice(1, 512, 576).clone()), 0.0) << "rope columns changed";
  // In place, rows of every width class: per-head q/k norms (128: part of a warp a row), single
  // rows as at batch 1, widths that leave threads of a row idle (1536, 7168), one piece (8), and
  // two pieces a thread (16384).
  for (auto [R, W] : std::vector<std::pair<int64_t, int64_t>>{
           {37, 128}, {32, 128}, {1, 2048}, {1, 7168}, {37, 7168}, {9, 1536}, {3, 8}, {5, 16384}}) {
    Tensor h = randn({R, W}, 2.0f), hw = randn({W}, 0.5f), href = Tensor::empty(DType::F32, {R, W});
    cpu::rms_norm(h, hw, 1e-6f, href);
    Tensor hg = gpu(h);
    cuda::rms_norm(hg, gpu(hw), 1e-6f, hg);
    EXPECT_LT(rel_error(hg, href), kBf16Tol) << R << " rows of " << W;
  }
}

TEST(CudaOps, ElementwiseOpsMatchCpu) {
  MS_REQUIRE_CUDA();
  const int64_t T = 57, D = 2048, I = 768;
  Tensor x = randn({T, D}), y = randn({T, D});
  Tensor xg = gpu(x);
  cuda::add_inplace(xg, gpu(y));
  Tensor ref = x.clone();
  cpu::add_inplace(ref, y);
  EXPECT_LT(rel_error(xg, ref), kBf16Tol);

  Tensor gu = randn({T, 2 * I}, 2.0f), act_ref = Tensor::empty(DType::F32, {T, I});
  cpu::silu_and_mul(gu, act_ref);
  Tensor act = poisoned(DType::BF16, {T, I});
  cuda::silu_and_mul(gpu(gu), act);
  EXPECT_LT(rel_error(act, act_ref), kBf16Tol);
  Tensor act32 = poisoned(DType::BF16, {T, I});
  cuda::silu_and_mul(gpu(gu, DType::F32), act32);  // f32 in, bf16 out (the MoE path)
  EXPECT_LT(rel_error(act32, act_ref), kBf16Tol);

  Tensor gate = randn({T, 1}), sx = randn({T, D}), sy = randn({T, D});
  Tensor sref = sx.clone();
  cpu::add_sigmoid_gated(sref, gate, sy);
  Tensor sxg = gpu(sx);
  cuda::add_sigmoid_gated(sxg, gpu(gate), gpu(sy));
  EXPECT_LT(rel_error(sxg, sref), kBf16Tol);

  Tensor f = Tensor::empty(DType::F32, {T, D});
  std::normal_distribution<float> nd;
  for (auto& v : f.span<float>()) v = nd(rng());
  Tensor fg = f.to(Device::CUDA), fr = f.clone();
  cuda::round_to_bf16(fg);
  cpu::round_to_bf16(fr);
  EXPECT_EQ(rel_error(fg, fr), 0.0);
}

TEST(CudaOps, EmbeddingGatherScatterAreExact) {
  MS_REQUIRE_CUDA();
  const int64_t V = 1000, H = 512;
  Tensor table = randn({V, H});
  std::vector<int32_t> ids(77);
  std::uniform_int_distribution<int32_t> pick(0, int32_t(V) - 1);
  for (auto& i : ids) i = pick(rng());
  Tensor ref = Tensor::empty(DType::F32, {int64_t(ids.size()), H});
  cpu::embedding(table, ids, ref, nullptr);
  Tensor out = poisoned(DType::BF16, {int64_t(ids.size()), H});
  cuda::embedding(gpu(table), ids, out, nullptr);
  EXPECT_EQ(rel_error(out, ref), 0.0);

  std::vector<int32_t> rows = {76, 0, 13, 13, 40};
  Tensor gref = Tensor::empty(DType::F32, {5, H}), gout = poisoned(DType::BF16, {5, H});
  cpu::gather_rows(ref, rows, gref);
  cuda::gather_rows(out, rows, gout);
  EXPECT_EQ(rel_error(gout, gref), 0.0);

  // KV writes: [T, Hkv, D] rows into a [slots, Hkv, D] cache at scattered slots.
  Tensor src = randn({6, 4, 128});
  std::vector<int32_t> slots = {9, 2, 31, 0, 17, 5};
  Tensor cache_ref = randn({32, 4, 128}), cache = gpu(cache_ref);
  cpu::scatter_rows(src, slots, cache_ref);
  cuda::scatter_rows(gpu(src), slots, cache);
  EXPECT_EQ(rel_error(cache, cache_ref), 0.0);
}

// dst[rows[i]] += src[i] with repeated rows (expert outputs returning to their tokens); the
// expectation is computed here, since every source of a row must be summed.
TEST(CudaOps, IndexAddRowsSumsRepeatedRows) {
  MS_REQUIRE_CUDA();
  const int64_t N = 40, W = 2048;
  std::vector<int32_t> rows = {3, 17, 3, 0, 39, 17, 3, 8};
  Tensor dst = randn({N, W}), src = randn({int64_t(rows.size()), W});
  Tensor expect = dst.clone();
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < W; ++c) expect.data<float>()[rows[i] * W + c] += src.data<float>()[int64_t(i) * W + c];
  Tensor dg = gpu(dst);
  cuda::index_add_rows(dg, rows, gpu(src, DType::F32));
  EXPECT_LT(rel_error(dg, expect), kBf16Tol);
  Tensor d32 = gpu(dst, DType::F32);
  cuda::index_add_rows(d32, rows, gpu(src));
  EXPECT_LT(rel_error(d32, expect), 1e-6);
}

}  // namespace
}  // namespace ms
