// The MoE experts' prefill path on the GPU (host-sorted rows, per-expert tensor-core products)
// at the sizes it runs at: Qwen3-30B-A3B (hidden 2048, 128 experts, top-8, intermediate 768) and
// DeepSeek-V2-Lite (2048, 64, top-6, 1408) routed experts over 512 and 4096 tokens against the
// CPU op (on a sample of the tokens: the CPU op's rows are independent), skewed routing that
// leaves experts empty, an expert-parallel slice; the row gather, the weighted combine and
// SiLU-and-mul on their vector and scalar paths. MoePrefillBench prints [bench] lines for each
// step and the whole op at 4096 tokens when MOESERVE_BENCH_MOE=1.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>

#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"

// Declared in kernels/cuda/moe_grouped.h, which the host compiler cannot read (gemv.h's types
// are device-only).
namespace ms::cuda {
void gather_token_rows(const Tensor& x, const Tensor& token_of_row, Tensor& xe);
void combine_expert_rows(const Tensor& ye, const Tensor& row_of, const Tensor& weights, Tensor& out);
struct Permuted {
  Tensor offsets, active, n_active, token_of_row, row_of;
};
Permuted permute_on_device(const Tensor& ids, int first, int E);
}  // namespace ms::cuda

namespace ms {
namespace {
using namespace test;

Tensor gpu_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(DType::I32, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::CUDA);
}

Tensor scratch_bf16(int64_t rows, int64_t cols) { return cuda::scratch(DType::BF16, {rows, cols}); }

// n sorted distinct tokens of T (all of them when n >= T), the first and last among them.
std::vector<int64_t> sample_tokens(int64_t T, int64_t n) {
  std::vector<int64_t> all(static_cast<size_t>(T));
  std::iota(all.begin(), all.end(), 0);
  if (n >= T) return all;
  std::shuffle(all.begin() + 1, all.end() - 1, rng());
  std::vector<int64_t> keep(all.begin(), all.begin() + (n - 1));
  keep.push_back(T - 1);
  std::sort(keep.begin(), keep.end());
  return keep;
}

// The GPU op on all T tokens against the CPU op on a sample of 256 of them.
void expect_matches_cpu(const MoeShape& s, const Experts& ex, int64_t T, bool skewed, int first, int n_local,
                        DType out_dtype, const std::string& what) {
  Tensor x = randn({T, s.H}), ids, w;
  route_tokens(T, s.K, s.E, skewed, ids, w);
  const ops::ExpertWeights gpu_ex = expert_slice(ex.gpu, first, n_local), cpu_ex = expert_slice(ex.cpu, first, n_local);
  Tensor out = poisoned(out_dtype, {T, s.H});
  cuda::moe_experts(gpu(x), ids.to(Device::CUDA), w.to(Device::CUDA), gpu_ex, out);
  const std::vector<int64_t> keep = sample_tokens(T, 256);
  const int64_t n = int64_t(keep.size());
  Tensor xs = select_rows(x, keep), ids_s = Tensor::empty(DType::I32, {n, s.K}), w_s = Tensor::empty(DType::F32, {n, s.K});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < s.K; ++j) {
      ids_s.data<int32_t>()[i * s.K + j] = ids.data<int32_t>()[keep[size_t(i)] * s.K + j];
      w_s.data<float>()[i * s.K + j] = w.data<float>()[keep[size_t(i)] * s.K + j];
    }
  Tensor ref = Tensor::empty(DType::F32, {n, s.H});
  cpu::moe_experts(xs, ids_s, w_s, cpu_ex, ref);
  const double err = rel_error(select_rows(out.to_f32(), keep), ref);
  // The products' BF16 outputs (gate, up, down: as the reference model rounds them) and the
  // BF16 result each add about 2^-9 relative; 1e-2 is the bound the other MoE tests use.
  EXPECT_LT(err, 1e-2) << what;
  std::printf("%s: rel error %.2e\n", what.c_str(), err);
}

TEST(CudaMoePrefill, ExpertsMatchCpuAtPrefillSizes) {
  MS_REQUIRE_CUDA();
  for (const MoeShape* s : {&kQwen3, &kDeepseekV2Lite}) {
    const Experts ex = make_experts(*s, 0);
    for (int64_t T : {512, 4096})
      for (bool skewed : {false, true})
        expect_matches_cpu(*s, ex, T, skewed, 0, s->E, DType::BF16,
                           std::string(s->name) + " T=" + std::to_string(T) + (skewed ? " skewed" : ""));
    // F32 output (the combine's f32 stores), and one rank's half of the experts (pairs of the
    // other half skipped).
    expect_matches_cpu(*s, ex, 512, false, 0, s->E, DType::F32, std::string(s->name) + " T=512 f32 out");
    expect_matches_cpu(*s, ex, 512, true, s->E / 4, s->E / 2, DType::BF16,
                       std::string(s->name) + " T=512 experts " + std::to_string(s->E / 4) + ".." +
                           std::to_string(s->E / 4 + s->E / 2 - 1));
  }
}

// Host reference of the combine: the same slot order, f32 sums.
Tensor combine_ref(const Tensor& ye, const std::vector<int32_t>& row_of, const Tensor& w, int64_t T, int64_t K) {
  const int64_t H = ye.size(1);
  Tensor y = ye.to_f32(), out = Tensor::empty(DType::F32, {T, H});
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) {
      float acc = 0.f;
      for (int64_t j = 0; j < K; ++j) {
        const int32_t r = row_of[size_t(t * K + j)];
        if (r >= 0) acc += w.data<float>()[t * K + j] * y.data<float>()[r * H + i];
      }
      out.data<float>()[t * H + i] = acc;
    }
  return out;
}

// Gather bit for bit (pad rows zero) and combine in f32, each on the vector path (widths of 8,
// aligned rows) and the scalar one (an odd width, or rows a column slice leaves unaligned).
TEST(CudaMoePrefill, GatherAndCombineMatchHost) {
  MS_REQUIRE_CUDA();
  const int64_t T = 77, K = 6;
  for (int64_t H : {2048, 1000, 1003})
    for (bool offset_view : {false, true}) {
      const std::string what = "H=" + std::to_string(H) + (offset_view ? " column-offset view" : "");
      // x: [T, H] or columns [1, H + 1) of [T, H + 8] (rows not 16-byte aligned: the scalar path).
      Tensor xf = randn({T, offset_view ? H + 8 : H});
      Tensor xg = gpu(xf), x = offset_view ? xg.slice(1, 1, H + 1) : xg;
      const int64_t rows = T * K + 5;
      std::vector<int32_t> token_of_row(static_cast<size_t>(rows));
      std::uniform_int_distribution<int32_t> td(0, int32_t(T - 1));
      for (auto& t : token_of_row) t = td(rng());
      token_of_row[3] = token_of_row[size_t(rows - 1)] = -1;
      Tensor xe = poisoned(DType::BF16, {rows, H});
      cuda::gather_token_rows(x, gpu_i32(token_of_row), xe);
      Tensor got = xe.to_f32();
      bool exact = true;
      for (int64_t r = 0; r < rows && exact; ++r) {
        const int32_t t = token_of_row[size_t(r)];
        for (int64_t i = 0; i < H && exact; ++i) {
          const float want = t < 0 ? 0.f : xf.data<float>()[t * xf.size(1) + (offset_view ? 1 : 0) + i];
          exact = got.data<float>()[r * H + i] == want;
        }
      }
      EXPECT_TRUE(exact) << "gather " << what;

      std::vector<int32_t> row_of(static_cast<size_t>(T * K));
      std::uniform_int_distribution<int32_t> rd(-1, int32_t(rows - 1));  // -1: another rank's expert
      for (auto& r : row_of) r = rd(rng());
      Tensor w = Tensor::empty(DType::F32, {T, K});
      std::uniform_real_distribution<float> wd(0.1f, 1.0f);
      for (auto& v : w.span<float>()) v = wd(rng());
      for (DType ye_dtype : {DType::BF16, DType::F32})
        for (DType out_dtype : {DType::BF16, DType::F32}) {
          Tensor ye = gpu(randn({rows, H}), ye_dtype);
          Tensor out_buf = poisoned(out_dtype, {T, offset_view ? H + 8 : H});
          Tensor out = offset_view ? out_buf.slice(1, 1, H + 1) : out_buf;
          cuda::combine_expert_rows(ye, gpu_i32(row_of), w.to(Device::CUDA), out);
          const double tol = out_dtype == DType::F32 ? 1e-6 : 5e-3;
          Tensor got_out = out_buf.to_f32();  // device views copy whole: slice on the host
          if (offset_view) got_out = got_out.slice(1, 1, H + 1).clone();
          EXPECT_LT(rel_error(got_out, combine_ref(ye, row_of, w, T, K)), tol)
              << "combine " << what << " ye " << dtype_name(ye_dtype) << " out " << dtype_name(out_dtype);
        }
    }
}

// SiLU-and-mul in every dtype pair on the vector path, on a strided view (rows of a wider
// tensor, still aligned), and on the scalar path (an intermediate width not a multiple of 8).
TEST(CudaMoePrefill, SiluMulMatchesCpu) {
  MS_REQUIRE_CUDA();
  const int64_t T = 45;
  for (int64_t I : {768, 1408, 100, 44})
    for (bool strided : {false, true})
      for (DType in : {DType::BF16, DType::F32})
        for (DType outd : {DType::BF16, DType::F32}) {
          const int64_t width = strided ? 2 * I + 8 : 2 * I;
          Tensor gu = randn({T, width}, 2.0f);
          Tensor gu_host = gu.slice(1, 0, 2 * I).clone(), ref = Tensor::empty(DType::F32, {T, I});
          cpu::silu_and_mul(gu_host, ref);
          Tensor g = gpu(gu, in).slice(1, 0, 2 * I), out = poisoned(outd, {T, I});
          cuda::silu_and_mul(g, out);
          const double tol = outd == DType::F32 && in == DType::F32 ? 1e-5 : 1e-2;
          EXPECT_LT(rel_error(out.to_f32(), ref), tol)
              << "I=" << I << (strided ? " strided" : "") << " " << dtype_name(in) << " -> " << dtype_name(outd);
        }
}

// Rows sorted by expert as the prefill path builds them: token_of_row and row_of for ids [T, K].
void sorted_rows(const Tensor& ids, int E, std::vector<int32_t>& token_of_row, std::vector<int32_t>& row_of) {
  const int64_t T = ids.size(0), K = ids.size(1);
  std::vector<int64_t> next(size_t(E) + 1, 0);
  for (int64_t p = 0; p < T * K; ++p) ++next[size_t(ids.data<int32_t>()[p]) + 1];
  std::partial_sum(next.begin(), next.end(), next.begin());
  token_of_row.assign(size_t(T * K), 0), row_of.assign(size_t(T * K), 0);
  for (int64_t p = 0; p < T * K; ++p) {
    const int64_t r = next[size_t(ids.data<int32_t>()[p])]++;
    token_of_row[size_t(r)] = int32_t(p / K), row_of[size_t(p)] = int32_t(r);
  }
}

// The device sort of (token, slot) pairs by expert, by one block (decode-sized) and over many
// blocks (prefill-sized, from 4097 pairs): offsets, the active experts in order, every local pair
// on a row of its expert's range that names its token, each row used once, other ranks' pairs
// -1; twice in a row, as the many-block sort resets its own counter.
TEST(CudaMoePrefill, PermuteOnDeviceSortsEveryPair) {
  MS_REQUIRE_CUDA();
  struct Case {
    int64_t T, K;
    int E, first, id_range;
    bool skewed;
  };
  for (const Case c : {Case{600, 6, 64, 0, 64, false}, Case{8192, 8, 128, 0, 128, false},
                       Case{5000, 8, 32, 32, 128, false}, Case{3000, 6, 64, 0, 64, true},
                       Case{700, 6, 64, 0, 64, false}}) {
    const std::string at = std::to_string(c.T) + "x" + std::to_string(c.K) + " over " + std::to_string(c.E) +
                           " from " + std::to_string(c.first) + (c.skewed ? " skewed" : "");
    Tensor ids = Tensor::empty(DType::I32, {c.T, c.K});
    uint64_t st = 0x9e3779b97f4a7c15ull + uint64_t(c.T);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j < c.K; ++j) {
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        ids.data<int32_t>()[t * c.K + j] = c.skewed && j < 4 ? int32_t(3 + j) : int32_t(st % uint64_t(c.id_range));
      }
    const Tensor dids = ids.to(Device::CUDA);
    for (int round = 0; round < 2; ++round) {
      const cuda::Permuted p = cuda::permute_on_device(dids, c.first, c.E);
      const Tensor off = p.offsets.to(Device::CPU), act = p.active.to(Device::CPU), na = p.n_active.to(Device::CPU);
      const Tensor tor = p.token_of_row.to(Device::CPU), ro = p.row_of.to(Device::CPU);
      std::vector<int64_t> count(size_t(c.E), 0);
      for (int64_t i = 0; i < c.T * c.K; ++i) {
        const int e = ids.data<int32_t>()[i] - c.first;
        if (e >= 0 && e < c.E) ++count[size_t(e)];
      }
      const int32_t* o = off.data<int32_t>();
      ASSERT_EQ(o[0], 0) << at;
      std::vector<int32_t> active;
      for (int e = 0; e < c.E; ++e) {
        ASSERT_EQ(o[e + 1] - o[e], count[size_t(e)]) << at << ": expert " << e;
        if (count[size_t(e)] > 0) active.push_back(e);
      }
      ASSERT_EQ(na.data<int32_t>()[0], int32_t(active.size())) << at;
      for (size_t a = 0; a < active.size(); ++a) ASSERT_EQ(act.data<int32_t>()[a], active[a]) << at << ": active " << a;
      std::vector<char> used(size_t(o[c.E]), 0);
      for (int64_t i = 0; i < c.T * c.K; ++i) {
        const int e = ids.data<int32_t>()[i] - c.first;
        const int32_t r = ro.data<int32_t>()[i];
        if (e < 0 || e >= c.E) {
          ASSERT_EQ(r, -1) << at << ": pair " << i;
          continue;
        }
        ASSERT_TRUE(r >= o[e] && r < o[e + 1]) << at << ": pair " << i << " on row " << r;
        ASSERT_EQ(tor.data<int32_t>()[r], int32_t(i / c.K)) << at << ": row " << r;
        ASSERT_FALSE(used[size_t(r)]) << at << ": row " << r << " twice";
        used[size_t(r)] = 1;
      }
    }
  }
}

TEST(CudaMoePrefill, MoePrefillBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_MOE");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_MOE=1 to time the MoE prefill path";
  constexpr int64_t T = 4096;
  for (const MoeShape* s : {&kQwen3, &kDeepseekV2Lite}) {
    const int64_t H = s->H, I = s->I, K = s->K, rows = T * K;
    Tensor ids, w;
    route_tokens(T, K, s->E, false, ids, w);
    std::vector<int32_t> token_of_row, row_of;
    sorted_rows(ids, s->E, token_of_row, row_of);
    Tensor tor = gpu_i32(token_of_row), ro = gpu_i32(row_of), wg = w.to(Device::CUDA);
    // x: [T, H], and the same rows at a stride of H + 1 (not 16-byte aligned: the scalar kernel).
    Tensor xwide = gpu(randn({T, H + 1})), x = gpu(randn({T, H})), x_odd = xwide.slice(1, 0, H);
    Tensor xe = scratch_bf16(rows, H);
    const double gather_mb = double(rows) * H * 2 / 1e6;
    const double g16 = time_us(20, [&] { cuda::gather_token_rows(x, tor, xe); });
    const double g1 = time_us(5, [&] { cuda::gather_token_rows(x_odd, tor, xe); });
    std::printf("[bench] %s T=%lld gather %lld rows x %lld: %.1f us (%.0f GB/s written), scalar kernel %.1f us\n",
                s->name, (long long)T, (long long)rows, (long long)H, g16, gather_mb * 1e3 / g16, g1);

    const Tensor gu_host = randn({rows, 2 * I});
    Tensor gu16 = gpu(gu_host, DType::BF16), gu32 = gpu(gu_host, DType::F32);
    Tensor act = scratch_bf16(rows, I);
    const double s16 = time_us(20, [&] { cuda::silu_and_mul(gu16, act); });
    const double s32 = time_us(20, [&] { cuda::silu_and_mul(gu32, act); });
    std::printf("[bench] %s T=%lld silu_mul %lld x %lld: bf16 in %.1f us (%.0f GB/s), f32 in %.1f us (%.0f GB/s)\n",
                s->name, (long long)T, (long long)rows, (long long)I, s16, double(rows) * I * 6 / s16 / 1e3, s32,
                double(rows) * I * 10 / s32 / 1e3);

    const Tensor ye_host = randn({rows, H});
    Tensor ye16 = gpu(ye_host, DType::BF16), ye32 = gpu(ye_host, DType::F32);
    Tensor out = scratch_bf16(T, H), out_wide = scratch_bf16(T, H + 1), out_odd = out_wide.slice(1, 0, H);
    const double c16 = time_us(20, [&] { cuda::combine_expert_rows(ye16, ro, wg, out); });
    const double c32 = time_us(20, [&] { cuda::combine_expert_rows(ye32, ro, wg, out); });
    const double c1 = time_us(5, [&] { cuda::combine_expert_rows(ye16, ro, wg, out_odd); });
    std::printf("[bench] %s T=%lld combine top-%lld: bf16 rows %.1f us (%.0f GB/s), f32 rows %.1f us (%.0f GB/s), "
                "scalar kernel %.1f us\n",
                s->name, (long long)T, (long long)K, c16, double(rows + T) * H * 2 / c16 / 1e3, c32,
                double(rows * 4 + T * 2) * H / c32 / 1e3, c1);
    for (int64_t B : {1, 64}) {  // decode: f32 rows from the grouped path
      Tensor wb = wg.narrow_rows(0, B), ob = out.narrow_rows(0, B);
      std::vector<int32_t> rb(size_t(B * K));
      std::iota(rb.begin(), rb.end(), 0);
      Tensor rbg = gpu_i32(rb);
      const double cb = time_us(200, [&] { cuda::combine_expert_rows(ye32, rbg, wb, ob); });
      std::printf("[bench] %s B=%lld combine top-%lld (decode, f32 rows): %.2f us\n", s->name, (long long)B,
                  (long long)K, cb);
    }

    const Experts ex = make_experts(*s, 0);
    Tensor idsg = ids.to(Device::CUDA), moe_out = scratch_bf16(T, H);
    const double whole = time_us(5, [&] { cuda::moe_experts(x, idsg, wg, ex.gpu, moe_out); });
    // From an idle stream: the host's time to issue one call (its launches, one per expert and
    // projection, and the ids' download) against the time until the GPU is done with it. Equal
    // times mean the launches, not the GPU, set the pace.
    cudaStreamSynchronize(cuda::stream());
    const auto t0 = std::chrono::steady_clock::now();
    cuda::moe_experts(x, idsg, wg, ex.gpu, moe_out);
    const auto t1 = std::chrono::steady_clock::now();
    cudaStreamSynchronize(cuda::stream());
    const auto t2 = std::chrono::steady_clock::now();
    const double issue = std::chrono::duration<double, std::micro>(t1 - t0).count(),
                 done = std::chrono::duration<double, std::micro>(t2 - t0).count();
    const double flops = 2.0 * double(rows) * 3 * H * I;
    std::printf("[bench] %s T=%lld whole moe_experts: %.1f us (%.0f TFLOP/s on the products); one call from an "
                "idle stream: issued in %.1f us, done at %.1f us\n",
                s->name, (long long)T, whole, flops / whole / 1e6, issue, done);
  }
}

}  // namespace
}  // namespace ms
