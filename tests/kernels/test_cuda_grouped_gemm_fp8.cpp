// The FP8-block grouped GEMM (grouped_gemm_fp8, grouped_gemm.h) against a host reference on the
// dequantised weights (float(e4m3) * scale for the mma.sync shapes, which scale their f32 sums;
// bf16(float(e4m3) * scale), what weight_bf16 makes, for wgmma's) in every row tile
// (BM 16, 32, 64 on mma.sync; 64, 128 on wgmma where the GPU is a Hopper, and BM 64 with FP8
// activations against the same weights times activations through e4m3), SwiGLU and plain,
// BF16 and F32 output: ragged groups (empty experts,
// counts off BM, N and K off the tiles and the 128 scale blocks, odd N, rows read through a token
// index, padded strides), checking that nothing outside the groups is written; the dense mode
// (one group, no offsets, K split over the grid). Then its two users against the paths they
// replace (MOESERVE_FP8_GROUPED=0) and to the mma.sync shapes alone (MOESERVE_FP8_WGMMA=0):
// linear on FP8 blocks at 16, 64, 256 and 512 rows (and the host reference), and moe_experts at
// DeepSeek-V3's EP8 shard (32 experts, hidden 7168, intermediate 2048, top-8) at 64, 256 and
// 1024 tokens, eagerly and replayed from a captured step with new ids, and with FP8 activations
// (MOESERVE_FP8_ACT8=1) within the README's FP8-activation error of the old path.
// FP8GroupedBench prints [bench] lines when MOESERVE_BENCH_FP8_GROUPED=1.
#include <cuda_fp8.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe_grouped.h"
#include "kernels/step_graph.h"

namespace ms {
namespace {
using namespace test;

// Every row tile: mma.sync's, then (on a Hopper: elsewhere their kernels trap) wgmma's, the
// FP8-activation one last.
std::vector<cuda::Fp8RowTile> row_tiles() {
  std::vector<cuda::Fp8RowTile> t = {{16, false}, {32, false}, {64, false}};
  if (cuda::hopper()) t.insert(t.end(), {{64, true}, {128, true}, {64, true, true}});
  return t;
}
std::string tile_name(const cuda::Fp8RowTile& t) {
  return "bm " + std::to_string(t.bm) + (t.wgmma ? " wgmma" : "") + (t.act8 ? " act8" : "");
}

// A row's values as the FP8-activation shape sees them: bf16, then per 128 columns e4m3 codes of
// x / s (s = the group's largest magnitude / 448, 1 for zeros; IEEE division, nearest,
// saturating) times s.
std::vector<float> act8_values(const float* x, int64_t K) {
  std::vector<float> v(static_cast<size_t>(K));
  for (int64_t g = 0; g < K; g += 128) {
    float amax = 0;
    for (int64_t k = g; k < g + 128; ++k) amax = std::max(amax, std::fabs(round_bf16(x[k])));
    const float s = amax > 0.f ? amax / 448.f : 1.f;
    for (int64_t k = g; k < g + 128; ++k) {
      const __nv_fp8_storage_t c = __nv_cvt_float_to_fp8(round_bf16(x[k]) / s, __NV_SATFINITE, __NV_E4M3);
      v[size_t(k)] = fp8_e4m3_table()[c] * s;
    }
  }
  return v;
}

Tensor gpu_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(DType::I32, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::CUDA);
}

Tensor pointer_array(const std::vector<const void*>& ps) {
  Tensor h = Tensor::empty(DType::I64, {int64_t(ps.size())});
  for (size_t i = 0; i < ps.size(); ++i) h.data<int64_t>()[i] = int64_t(reinterpret_cast<uintptr_t>(ps[i]));
  return h.to(Device::CUDA);
}

// MOESERVE_FP8_GROUPED (MOESERVE_FP8_WGMMA) for the scope.
struct Fp8GroupedSwitch {
  explicit Fp8GroupedSwitch(bool on, const char* var = "MOESERVE_FP8_GROUPED") : var_(var) {
    setenv(var, on ? "1" : "0", 1);
  }
  ~Fp8GroupedSwitch() { unsetenv(var_); }
  const char* var_;
};
struct Fp8WgmmaSwitch : Fp8GroupedSwitch {
  explicit Fp8WgmmaSwitch(bool on) : Fp8GroupedSwitch(on, "MOESERVE_FP8_WGMMA") {}
};
struct Fp8Act8Switch : Fp8GroupedSwitch {
  explicit Fp8Act8Switch(bool on) : Fp8GroupedSwitch(on, "MOESERVE_FP8_ACT8") {}
};

// splitmix64: fast random bytes for the large weights.
uint64_t mix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// An FP8 matrix [n, k] with row stride ld and its scales [ceil(n/128), ceil(k/128)] with row
// stride s_ld, on both sides, plus the dequantised values [n, k] on the host. Codes avoid NaN.
struct Fp8Mat {
  Tensor w, s;  // device
  int64_t ld = 0, s_ld = 0;
  std::vector<float> deq, exact;  // bf16(float(e4m3) * scale); float(e4m3) * scale
};
Fp8Mat make_fp8(int64_t n, int64_t k, int64_t ld, int64_t s_ld, uint64_t seed, float scale = 0.002f) {
  Fp8Mat m;
  m.ld = ld, m.s_ld = s_ld;
  Tensor w = Tensor::empty(DType::F8_E4M3, {n, ld});
  uint8_t* b = w.data<uint8_t>();
  for (int64_t i = 0; i < n * ld; ++i) b[i] = uint8_t(mix(seed) % 126) | uint8_t((mix(seed) & 1) << 7);
  const int64_t nb = (n + 127) / 128;
  Tensor s = Tensor::empty(DType::F32, {nb, s_ld});
  for (int64_t i = 0; i < nb * s_ld; ++i) s.data<float>()[i] = scale * (0.5f + float(mix(seed) % 1000) / 1000.f);
  const float* table = fp8_e4m3_table();
  m.deq.resize(size_t(n * k)), m.exact.resize(size_t(n * k));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      m.exact[size_t(r * k + c)] = table[b[r * ld + c]] * s.data<float>()[(r / 128) * s_ld + c / 128];
      m.deq[size_t(r * k + c)] = round_bf16(m.exact[size_t(r * k + c)]);
    }
  m.w = w.to(Device::CUDA), m.s = s.to(Device::CUDA);
  return m;
}

struct Case {
  std::string name;
  std::vector<int> sizes;  // rows of each expert; empty: dense, `dense_rows` rows
  int64_t N, K;
  int64_t w_pad = 0, c_pad = 0, s_pad = 0;
  int64_t tokens = 0;  // > 0: rows read through a random token index into [tokens, K]
  int64_t dense_rows = 0;
};

void run_case(const Case& c, bool swiglu) {
  const std::string what = c.name + (swiglu ? " swiglu" : "");
  const bool dense = c.sizes.empty();
  const int E = dense ? 1 : int(c.sizes.size());
  std::vector<int32_t> off(size_t(E) + 1, 0);
  if (dense) off[1] = int32_t(c.dense_rows);
  else
    for (int e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + c.sizes[size_t(e)];
  const int64_t rows = off.back(), w_ld = c.K + c.w_pad, c_ld = c.N + c.c_pad, s_ld = (c.K + 127) / 128 + c.s_pad;
  const int64_t a_count = c.tokens > 0 ? c.tokens : std::max<int64_t>(rows, 1);
  Tensor a = randn({a_count, c.K});
  std::vector<int32_t> a_rows(size_t(std::max<int64_t>(rows, 1)), 0);
  std::uniform_int_distribution<int32_t> td(0, int32_t(a_count - 1));
  for (int64_t r = 0; r < rows; ++r) a_rows[size_t(r)] = c.tokens > 0 ? td(rng()) : int32_t(r);
  std::vector<Fp8Mat> w, w2;
  std::vector<const void*> wp, w2p, sp, s2p;
  for (int e = 0; e < E; ++e) {
    w.push_back(make_fp8(c.N, c.K, w_ld, s_ld, 11 + 2 * uint64_t(e)));
    wp.push_back(w.back().w.raw()), sp.push_back(w.back().s.raw());
    if (swiglu) {
      w2.push_back(make_fp8(c.N, c.K, w_ld, s_ld, 12 + 2 * uint64_t(e)));
      w2p.push_back(w2.back().w.raw()), s2p.push_back(w2.back().s.raw());
    }
  }
  Tensor wpa = pointer_array(wp), spa = pointer_array(sp);
  Tensor w2pa = swiglu ? pointer_array(w2p) : Tensor(), s2pa = swiglu ? pointer_array(s2p) : Tensor();
  Tensor a_dev = gpu(a), rows_dev = gpu_i32(a_rows), off_dev = gpu_i32(off);
  cuda::GroupedGemmArgs args;
  args.N = c.N, args.K = c.K, args.a = a_dev.raw(), args.a_ld = c.K;
  args.a_rows = c.tokens > 0 ? rows_dev.data<int32_t>() : nullptr;
  args.w_ld = w_ld, args.s_ld = s_ld, args.max_rows = rows, args.c_ld = c_ld;
  if (dense) {
    args.w_one = wp[0], args.s_one = static_cast<const float*>(sp[0]);
    if (swiglu) args.w2_one = w2p[0], args.s2_one = static_cast<const float*>(s2p[0]);
  } else {
    args.w = static_cast<const void* const*>(wpa.raw()), args.s = static_cast<const float* const*>(spa.raw());
    if (swiglu)
      args.w2 = static_cast<const void* const*>(w2pa.raw()), args.s2 = static_cast<const float* const*>(s2pa.raw());
    args.offsets = off_dev.data<int32_t>(), args.experts = E;
  }
  ASSERT_TRUE(cuda::grouped_gemm_fp8_supported(c.K, w_ld, a_dev.raw(), c.K)) << what;

  // want[0]: on the unrounded weights (mma.sync shapes), want[1]: on bf16-rounded ones (wgmma's),
  // want[2]: the unrounded weights and the activations through e4m3 (K a multiple of 128: act8's).
  const bool act8_case = c.K % 128 == 0;
  std::vector<double> want[3];
  for (int way = 0; way < (act8_case ? 3 : 2); ++way) {
    const bool rounded = way == 1;
    want[way].resize(size_t(rows * c.N));
    for (int e = 0; e < E; ++e)
      for (int64_t r = off[size_t(e)]; r < off[size_t(e) + 1]; ++r) {
        const float* x_row = a.data<float>() + int64_t(a_rows[size_t(r)]) * c.K;
        const std::vector<float> q = way == 2 ? act8_values(x_row, c.K) : std::vector<float>();
        const float* x = way == 2 ? q.data() : x_row;
        for (int64_t n = 0; n < c.N; ++n) {
          auto dot = [&](const Fp8Mat& m) {
            const float* wr = (rounded ? m.deq : m.exact).data() + n * c.K;
            double s = 0;
            for (int64_t k = 0; k < c.K; ++k) s += double(x[k]) * wr[k];
            return s;
          };
          double v = dot(w[size_t(e)]);
          if (swiglu) v = v / (1.0 + std::exp(-v)) * dot(w2[size_t(e)]);
          want[way][size_t(r * c.N + n)] = v;
        }
      }
  }
  double scale = 0;
  for (double v : want[0]) scale = std::max(scale, std::fabs(v));

  for (const cuda::Fp8RowTile& tile : row_tiles())
    for (const DType out_dtype : {DType::BF16, DType::F32}) {
      if (tile.act8 && !act8_case) continue;  // K off 128: the call takes the bf16 wgmma shape instead
      const std::string at = what + " " + tile_name(tile) + (out_dtype == DType::F32 ? " f32" : " bf16");
      const int64_t out_rows = std::max<int64_t>(rows, 1);
      Tensor out = poisoned(out_dtype, {out_rows, c_ld});
      args.c = out.raw(), args.c_f32 = out_dtype == DType::F32, args.bm = tile.bm, args.wgmma = tile.wgmma;
      args.act8 = tile.act8;
      cuda::grouped_gemm_fp8(args, swiglu);
      Tensor host = out.to(Device::CPU);
      const bool f32 = out_dtype == DType::F32;
      auto raw_poison = [&](int64_t i) {
        return f32 ? host.data<uint32_t>()[i] == 0xffffffffu : host.data<uint16_t>()[i] == 0xffff;
      };
      auto value = [&](int64_t i) { return f32 ? double(host.data<float>()[i]) : double(bf16_to_f32(host.data<uint16_t>()[i])); };
      int64_t touched = 0, bad = 0;
      double num = 0, den = 0;
      for (int64_t r = 0; r < out_rows; ++r)
        for (int64_t n = 0; n < c_ld; ++n)
          if ((r >= rows || n >= c.N) && !raw_poison(r * c_ld + n)) ++touched;
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t n = 0; n < c.N; ++n) {
          const double wv = want[tile.act8 ? 2 : tile.wgmma][size_t(r * c.N + n)], have = value(r * c_ld + n);
          // Output rounding (2^-9 relative in BF16) and f32 sums, relative to the output's scale;
          // FP8 wgmmas keep ~14 bits of their sums within a 128-wide tile (the DeepSeek-V3 report's
          // reason for adding each tile into f32 outside them: ~2^-13 relative each), so act8's
          // absolute bound is ten times the others'.
          const double abs_tol = (tile.act8 ? 2e-3 : 2e-4) * scale;
          if (!(std::fabs(have - wv) <= 8e-3 * std::fabs(wv) + abs_tol)) ++bad;
          num += (have - wv) * (have - wv), den += wv * wv;
        }
      EXPECT_EQ(touched, 0) << at << ": elements outside the groups written";
      EXPECT_EQ(bad, 0) << at << ": elements off the reference";
      const double rel = den > 0 ? std::sqrt(num / den) : 0.0;
      EXPECT_LT(rel, f32 ? (tile.act8 ? 1e-3 : 1e-4) : 4e-3) << at;
      std::printf("%s: rel error %.2e, %lld rows\n", at.c_str(), rel, (long long)rows);
    }
}

TEST(CudaGroupedGemmFp8, RaggedGroupsMatchHost) {
  MS_REQUIRE_CUDA();
  const std::vector<Case> cases = {
      // Empty experts first, last and between, 1-row experts, counts off every BM, a group of
      // several 128-row tiles; N off the tiles, K off 64 and 128 (a partial scale block), padded
      // weight, scale and output strides.
      {"ragged N=200 K=400", {0, 1, 70, 0, 16, 33, 300, 0, 5, 0}, 200, 400, 16, 3, 1},
      {"odd N=201 K=256", {17, 0, 3, 64}, 201, 256},
      {"token index N=300 K=384", {20, 9, 40}, 300, 384, 0, 0, 0, 25},
  };
  for (const Case& c : cases)
    for (bool swiglu : {false, true}) run_case(c, swiglu);
}

TEST(CudaGroupedGemmFp8, DenseMatchesHost) {
  MS_REQUIRE_CUDA();
  // One group without offsets; few rows split K over the grid (2112 = 16.5 tiles of 128).
  for (int64_t rows : {1, 16, 100, 300}) {
    run_case({"dense rows=" + std::to_string(rows) + " N=200 K=2112", {}, 200, 2112, 32, 1, 0, 0, rows}, false);
    run_case({"dense rows=" + std::to_string(rows) + " N=200 K=2048", {}, 200, 2048, 0, 0, 0, 0, rows}, false);
    run_case({"dense rows=" + std::to_string(rows) + " N=136 K=1024", {}, 136, 1024, 0, 0, 0, 0, rows}, true);
  }
}

// The default row tile: wgmma's from mma.sync's BM 64 up, exactly on a Hopper with
// MOESERVE_FP8_WGMMA not 0; MOESERVE_FP8_WGMMA=0 gives today's mma.sync choice.
TEST(CudaGroupedGemmFp8, WgmmaTileChoice) {
  MS_REQUIRE_CUDA();
  if (std::getenv("MOESERVE_FP8_WGMMA") || std::getenv("MOESERVE_FP8_ACT8"))
    GTEST_SKIP() << "checks the choice with MOESERVE_FP8_WGMMA and MOESERVE_FP8_ACT8 unset";
  const bool hopper = cuda::hopper();
  EXPECT_EQ(cuda::grouped_gemm_fp8_wgmma_enabled(), hopper);
  for (bool mean : {false, true})
    for (int64_t rows : {1, 16, 21, 22, 32, 33, 42, 43, 64, 65, 128, 129, 256, 1024}) {
      const int mma = cuda::grouped_gemm_fp8_bm(rows, mean);
      const cuda::Fp8RowTile t = cuda::grouped_gemm_fp8_tile(rows, mean);
      const std::string at = "rows " + std::to_string(rows) + (mean ? " mean" : "");
      EXPECT_EQ(t.wgmma, hopper && mma == 64) << at;
      EXPECT_EQ(t.bm, !t.wgmma ? mma : rows <= (mean ? 128 : 64) ? 64 : 128) << at;
      Fp8WgmmaSwitch off(false);
      EXPECT_FALSE(cuda::grouped_gemm_fp8_wgmma_enabled());
      const cuda::Fp8RowTile o = cuda::grouped_gemm_fp8_tile(rows, mean);
      EXPECT_TRUE(o.bm == mma && !o.wgmma) << at << " MOESERVE_FP8_WGMMA=0";
    }
  EXPECT_FALSE(cuda::grouped_gemm_fp8_act8_enabled());
  Fp8Act8Switch on(true);
  EXPECT_EQ(cuda::grouped_gemm_fp8_act8_enabled(), hopper);
  for (int64_t rows : {1, 16, 64, 256}) {
    const cuda::Fp8RowTile t = cuda::grouped_gemm_fp8_tile(rows, true);
    EXPECT_EQ(t.act8, hopper) << rows << " MOESERVE_FP8_ACT8=1";
    if (t.act8) {
      EXPECT_TRUE(t.bm == 64 && t.wgmma) << rows;
    }
  }
}

// ---- linear ----

ops::Weight device_weight(const Fp8Mat& m, int64_t n, int64_t k) {
  ops::Weight w;
  w.w = m.w.slice(1, 0, k), w.scale_inv = m.s;
  EXPECT_EQ(w.w.size(0), n);
  return w;
}

TEST(CudaGroupedGemmFp8, LinearMatchesHostAndOldPath) {
  MS_REQUIRE_CUDA();
  const int64_t N = 300, K = 1552;
  const Fp8Mat m = make_fp8(N, K, K, (K + 127) / 128, 77);
  const ops::Weight w = device_weight(m, N, K);
  Tensor bias_h = randn({N}, 0.5f);
  Tensor bias = bias_h.to(Device::CUDA);
  for (int64_t T : {16, 64, 256, 512}) {
    Tensor x = randn({T, K});
    Tensor xg = gpu(x);
    for (bool with_bias : {false, true})
      for (DType dt : {DType::BF16, DType::F32}) {
        const std::string at = "linear T=" + std::to_string(T) + (with_bias ? " bias" : "") +
                               (dt == DType::F32 ? " f32" : " bf16");
        Tensor got = poisoned(dt, {T, N}), old = poisoned(dt, {T, N}), mma = poisoned(dt, {T, N});
        cuda::linear(xg, w, with_bias ? &bias : nullptr, got);
        {
          Fp8GroupedSwitch off(false);
          cuda::linear(xg, w, with_bias ? &bias : nullptr, old);
        }
        {
          Fp8WgmmaSwitch off(false);
          cuda::linear(xg, w, with_bias ? &bias : nullptr, mma);
        }
        // On the unrounded weights (the mma.sync shapes, the streaming product) and on bf16-rounded
        // ones (wgmma's shapes, the dequantised copy): each path lands on one of the two.
        Tensor ref[2] = {Tensor::empty(DType::F32, {T, N}), Tensor::empty(DType::F32, {T, N})};
        for (int rounded = 0; rounded < 2; ++rounded)
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) {
              double s = with_bias ? bias_h.data<float>()[n] : 0.0;
              const std::vector<float>& wv = rounded ? m.deq : m.exact;
              for (int64_t k = 0; k < K; ++k) s += double(x.data<float>()[t * K + k]) * wv[size_t(n * K + k)];
              ref[rounded].data<float>()[t * N + n] = float(s);
            }
        auto err_of = [&](const Tensor& out) {
          const Tensor f = out.to_f32();
          return std::min(rel_error(f, ref[0]), rel_error(f, ref[1]));
        };
        const double err = err_of(got), err_old = err_of(old), err_mma = err_of(mma);
        const double between = rel_error(got.to_f32(), old.to_f32()), to_mma = rel_error(got.to_f32(), mma.to_f32());
        EXPECT_LT(err, dt == DType::F32 ? 1e-5 : 4e-3) << at;
        EXPECT_LT(err_mma, dt == DType::F32 ? 1e-5 : 4e-3) << at << " MOESERVE_FP8_WGMMA=0";
        EXPECT_LT(between, 4e-3) << at << " against MOESERVE_FP8_GROUPED=0";
        EXPECT_LT(to_mma, 4e-3) << at << " against MOESERVE_FP8_WGMMA=0";
        std::printf("%s: rel error %.2e (old path %.2e, MOESERVE_FP8_WGMMA=0 %.2e; between %.2e, to it %.2e)\n",
                    at.c_str(), err, err_old, err_mma, between, to_mma);
      }
  }
}

// ---- moe_experts at DeepSeek-V3's EP8 shard ----

constexpr int kE = 32, kTopK = 8;
constexpr int64_t kH = 7168, kI = 2048;

// 32 experts of FP8 blocks (1.4 GB): every matrix a different window of one random pool.
struct V3Experts {
  ops::ExpertWeights gpu;
};
const V3Experts& v3_experts() {
  static V3Experts* ex = [] {
    auto* out = new V3Experts;
    const int64_t n = kI * kH;
    std::vector<uint8_t> pool(size_t(n + 3 * kE * 4099));
    uint64_t seed = 5;
    for (auto& b : pool) b = uint8_t(mix(seed) % 126) | uint8_t((mix(seed) & 1) << 7);
    auto make = [&](int64_t rows, int64_t cols, int idx) {
      ops::Weight w;
      Tensor h = Tensor::empty(DType::F8_E4M3, {rows, cols});
      std::memcpy(h.raw(), pool.data() + size_t(idx) * 4099, size_t(rows * cols));
      Tensor s = Tensor::empty(DType::F32, {(rows + 127) / 128, (cols + 127) / 128});
      for (auto& v : s.span<float>()) v = 0.0005f * (0.5f + float(mix(seed) % 1000) / 1000.f);
      w.w = h.to(Device::CUDA), w.scale_inv = s.to(Device::CUDA);
      return w;
    };
    for (int e = 0; e < kE; ++e) {
      out->gpu.gate.push_back(make(kI, kH, 3 * e));
      out->gpu.up.push_back(make(kI, kH, 3 * e + 1));
      out->gpu.down.push_back(make(kH, kI, 3 * e + 2));
    }
    return out;
  }();
  return *ex;
}

void random_route(int64_t T, Tensor& ids, Tensor& w) {
  ids = Tensor::empty(DType::I32, {T, kTopK}), w = Tensor::empty(DType::F32, {T, kTopK});
  std::uniform_int_distribution<int> ed(0, kE - 1);
  std::uniform_real_distribution<float> wd(0.1f, 1.0f);
  for (int64_t t = 0; t < T; ++t) {
    int32_t* row = ids.data<int32_t>() + t * kTopK;
    for (int j = 0; j < kTopK; ++j) {
      int32_t e;
      do e = ed(rng());
      while (std::find(row, row + j, e) != row + j);
      row[j] = e, w.data<float>()[t * kTopK + j] = wd(rng());
    }
  }
}

TEST(CudaGroupedGemmFp8, MoeExpertsMatchOldPathAtV3Ep8) {
  MS_REQUIRE_CUDA();
  const V3Experts& ex = v3_experts();
  for (int64_t T : {64, 256, 1024}) {
    Tensor ids, w;
    random_route(T, ids, w);
    Tensor x = gpu(randn({T, kH})), idsg = ids.to(Device::CUDA), wg = w.to(Device::CUDA);
    Tensor got = poisoned(DType::BF16, {T, kH}), old = poisoned(DType::BF16, {T, kH});
    Tensor mma = poisoned(DType::BF16, {T, kH});
    cuda::moe_experts(x, idsg, wg, ex.gpu, got);
    {
      Fp8GroupedSwitch off(false);
      cuda::moe_experts(x, idsg, wg, ex.gpu, old);
    }
    {
      Fp8WgmmaSwitch off(false);
      cuda::moe_experts(x, idsg, wg, ex.gpu, mma);
    }
    const double between = rel_error(got.to_f32(), old.to_f32()), to_mma = rel_error(got.to_f32(), mma.to_f32());
    // BF16 intermediates on either side: the MoE tests' bound.
    EXPECT_LT(between, 1e-2) << "T=" << T;
    EXPECT_LT(to_mma, 1e-2) << "T=" << T << " against MOESERVE_FP8_WGMMA=0";
    std::printf("V3 EP8 T=%lld: rel difference to MOESERVE_FP8_GROUPED=0 %.2e, to MOESERVE_FP8_WGMMA=0 %.2e\n",
                (long long)T, between, to_mma);
    if (!cuda::hopper()) continue;
    // FP8 activations (both products' inputs through e4m3): the fixtures' README puts them near
    // 3e-2 of the reference.
    Tensor act8 = poisoned(DType::BF16, {T, kH});
    {
      Fp8Act8Switch on(true);
      cuda::moe_experts(x, idsg, wg, ex.gpu, act8);
    }
    const double to_act8 = rel_error(act8.to_f32(), old.to_f32()), act8_to_got = rel_error(act8.to_f32(), got.to_f32());
    EXPECT_LT(to_act8, 5e-2) << "T=" << T << " MOESERVE_FP8_ACT8=1 against the old path";
    EXPECT_GT(act8_to_got, 1e-3) << "T=" << T << " MOESERVE_FP8_ACT8=1 took the FP8 shape";
    std::printf("V3 EP8 T=%lld: MOESERVE_FP8_ACT8=1 rel difference to MOESERVE_FP8_GROUPED=0 %.2e, to the default %.2e\n",
                (long long)T, to_act8, act8_to_got);
  }
}

TEST(CudaGroupedGemmFp8, MoeExpertsReplayedWithNewIds) {
  MS_REQUIRE_CUDA();
  const V3Experts& ex = v3_experts();
  // 64 tokens: 16 rows an expert, mma.sync; 256: 64, wgmma on a Hopper.
  for (const int64_t T : {64, 256}) {
    Tensor ids, w;
    random_route(T, ids, w);
    Tensor x = gpu(randn({T, kH})), idsg = ids.to(Device::CUDA), wg = w.to(Device::CUDA);
    Tensor out = Tensor::empty(DType::BF16, {T, kH}, Device::CUDA);
    auto body = [&] { cuda::moe_experts(x, idsg, wg, ex.gpu, out); };
    body();  // builds the expert table outside the capture
    const StepShape step(T);
    auto pool = ops::make_graph_pool(Device::CUDA);
    auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool, body);
    for (int rep = 0; rep < 3; ++rep) {
      Tensor ids_new, w_new;
      random_route(T, ids_new, w_new);
      x.copy_from(gpu(randn({T, kH}))), idsg.copy_from(ids_new.to(Device::CUDA)), wg.copy_from(w_new.to(Device::CUDA));
      Tensor want = poisoned(DType::BF16, {T, kH});
      cuda::moe_experts(x, idsg, wg, ex.gpu, want);
      Tensor old = poisoned(DType::BF16, {T, kH});
      {
        Fp8GroupedSwitch off(false);
        cuda::moe_experts(x, idsg, wg, ex.gpu, old);
      }
      out.copy_from(poisoned(DType::BF16, {T, kH}));
      graph->replay(step.arrays());
      cudaStreamSynchronize(cuda::stream());
      EXPECT_LT(rel_error(out.to_f32(), want.to_f32()), 1e-6) << "T=" << T << " replay " << rep;
      EXPECT_LT(rel_error(out.to_f32(), old.to_f32()), 1e-2)
          << "T=" << T << " replay " << rep << " against the old path";
    }
  }
}

// ---- timing (time_us, graphed_us: cuda_test_util.h) ----

// The token counts to time, for the experts and the dense linears alike: MOESERVE_BENCH_FP8_TOKENS
// (comma-separated, e.g. "64,256": one size under a profiler), else `all`.
std::vector<int64_t> bench_tokens(std::vector<int64_t> all) {
  const char* env = std::getenv("MOESERVE_BENCH_FP8_TOKENS");
  if (!env) return all;
  std::vector<int64_t> t;
  for (const char* c = env; *c;) {
    char* end = nullptr;
    const long long v = std::strtoll(c, &end, 10);
    if (end == c) break;
    t.push_back(v);
    c = *end == ',' ? end + 1 : end;
  }
  return t;
}

TEST(CudaGroupedGemmFp8, FP8GroupedBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_FP8_GROUPED");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_FP8_GROUPED=1 to time it";
  // moe_experts at the EP8 shard: the whole op new and old, eager and (where the old path can be
  // captured) from graphs; then the two products alone in each row tile.
  const V3Experts& ex = v3_experts();
  const double bytes = 3.0 * kE * kH * kI;  // FP8 weights, one byte each
  const cuda::ExpertTable* table = cuda::expert_table(ex.gpu);
  ASSERT_NE(table, nullptr);
  for (int64_t T : bench_tokens({64, 256, 1024, 4096})) {
    Tensor ids, w;
    random_route(T, ids, w);
    Tensor x = gpu(randn({T, kH})), idsg = ids.to(Device::CUDA), wg = w.to(Device::CUDA);
    Tensor out = cuda::scratch(DType::BF16, {T, kH});
    const double flop = 2.0 * T * kTopK * 3 * kH * kI;
    // Modes: FP8 activations, grouped with wgmma (the Hopper default), grouped on mma.sync alone,
    // the old path.
    for (int mode : {3, 2, 1, 0}) {
      Fp8GroupedSwitch sw(mode > 0);
      Fp8WgmmaSwitch wsw(mode >= 2);
      Fp8Act8Switch asw(mode == 3);
      const char* name = mode == 3   ? "MOESERVE_FP8_ACT8=1"
                         : mode == 2 ? "grouped"
                         : mode == 1 ? "MOESERVE_FP8_WGMMA=0"
                                     : "MOESERVE_FP8_GROUPED=0";
      const double us = time_us(5, [&] { cuda::moe_experts(x, idsg, wg, ex.gpu, out); });
      std::printf("[bench] moe_experts V3-EP8 FP8 T=%lld (%lld rows an expert) %s eager: %.3f ms, "
                  "%.0f GB/s of weights, %.0f TFLOP/s\n",
                  (long long)T, (long long)(T * kTopK / kE), name, us / 1e3, bytes / us / 1e3, flop / us / 1e6);
      if (T <= 256) {
        const double g = graphed_us(T, [&] { cuda::moe_experts(x, idsg, wg, ex.gpu, out); }, 10, 20);
        std::printf("[bench] moe_experts V3-EP8 FP8 T=%lld %s graphed: %.3f ms, %.0f GB/s, %.0f TFLOP/s\n",
                    (long long)T, name, g / 1e3, bytes / g / 1e3, flop / g / 1e6);
      }
    }
    // The products alone on rows sorted on the host, every row tile.
    std::vector<int32_t> off(kE + 1, 0), tor(size_t(T * kTopK));
    for (int64_t p = 0; p < T * kTopK; ++p) ++off[size_t(ids.data<int32_t>()[p]) + 1];
    std::partial_sum(off.begin(), off.end(), off.begin());
    std::vector<int32_t> next(off.begin(), off.end() - 1);
    for (int64_t p = 0; p < T * kTopK; ++p) tor[size_t(next[size_t(ids.data<int32_t>()[p])]++)] = int32_t(p / kTopK);
    Tensor offg = gpu_i32(off), torg = gpu_i32(tor);
    const int64_t rows = T * kTopK;
    Tensor act = cuda::scratch(DType::BF16, {rows, kI}), ye = cuda::scratch(DType::BF16, {rows, kH});
    cuda::GroupedGemmArgs gu;
    gu.N = kI, gu.K = kH, gu.a = x.raw(), gu.a_ld = kH, gu.a_rows = torg.data<int32_t>();
    gu.w = table->gate_up.w, gu.w2 = table->gate_up.w2, gu.s = table->gate_up.s, gu.s2 = table->gate_up.s2;
    gu.w_ld = table->gate_up.ld, gu.s_ld = table->gate_up.scale_ld;
    gu.offsets = offg.data<int32_t>(), gu.experts = kE, gu.max_rows = rows, gu.c = act.raw(), gu.c_ld = kI;
    cuda::GroupedGemmArgs dn = gu;
    dn.N = kH, dn.K = kI, dn.a = act.raw(), dn.a_ld = kI, dn.a_rows = nullptr, dn.w = table->down.w, dn.w2 = nullptr;
    dn.s = table->down.s, dn.s2 = nullptr, dn.w_ld = table->down.ld, dn.s_ld = table->down.scale_ld;
    dn.c = ye.raw(), dn.c_ld = kH;
    for (const cuda::Fp8RowTile& tile : row_tiles()) {
      gu.bm = dn.bm = tile.bm, gu.wgmma = dn.wgmma = tile.wgmma, gu.act8 = dn.act8 = tile.act8;
      const double t_gu = time_us(5, [&] { cuda::grouped_gemm_fp8(gu, true); });
      const double t_dn = time_us(5, [&] { cuda::grouped_gemm_fp8(dn, false); });
      std::printf("[bench] grouped_gemm_fp8 V3-EP8 T=%lld %s: gate|up+silu %.3f ms (%.0f GB/s, %.0f TFLOP/s), "
                  "down %.3f ms (%.0f GB/s, %.0f TFLOP/s)\n",
                  (long long)T, tile_name(tile).c_str(), t_gu / 1e3, 2 * bytes / 3 / t_gu / 1e3, flop * 2 / 3 / t_gu / 1e6, t_dn / 1e3,
                  bytes / 3 / t_dn / 1e3, flop / 3 / t_dn / 1e6);
    }
  }

  // Dense FP8 linears (DeepSeek-V3's MLA projections and dense MLP), through linear new and old,
  // and the kernel alone past linear's row bound.
  struct Shape {
    const char* name;
    int64_t K, N;
  };
  for (const Shape& s : {Shape{"q_a|kv_a 7168->2112", 7168, 2112}, Shape{"q_b 1536->24576", 1536, 24576},
                         Shape{"o_proj 16384->7168", 16384, 7168}, Shape{"mlp gate|up 7168->36864", 7168, 36864},
                         Shape{"mlp down 18432->7168", 18432, 7168}}) {
    ops::Weight wt;
    {
      Tensor h = Tensor::empty(DType::F8_E4M3, {s.N, s.K});
      uint64_t seed = uint64_t(s.N * 31 + s.K);
      uint8_t* b = h.data<uint8_t>();
      for (int64_t i = 0; i < s.N * s.K; i += 8) {
        const uint64_t v = mix(seed) & 0x7e7e7e7e7e7e7e7eull;  // no NaN codes
        std::memcpy(b + i, &v, size_t(std::min<int64_t>(8, s.N * s.K - i)));
      }
      Tensor sc = Tensor::empty(DType::F32, {(s.N + 127) / 128, (s.K + 127) / 128});
      for (auto& v : sc.span<float>()) v = 0.001f;
      wt.w = h.to(Device::CUDA), wt.scale_inv = sc.to(Device::CUDA);
    }
    const double wbytes = double(s.N) * s.K;
    for (int64_t T : bench_tokens({16, 64, 256, 1024})) {
      Tensor x = gpu(randn({T, s.K})), out = cuda::scratch(DType::BF16, {T, s.N});
      const double flop = 2.0 * T * s.N * s.K;
      for (int mode : {2, 1, 0}) {
        Fp8GroupedSwitch sw(mode > 0);
        Fp8WgmmaSwitch wsw(mode == 2);
        const char* name = mode == 2 ? "default" : mode == 1 ? "MOESERVE_FP8_WGMMA=0" : "MOESERVE_FP8_GROUPED=0";
        const double us = time_us(10, [&] { cuda::linear(x, wt, nullptr, out); });
        std::printf("[bench] linear FP8 %s T=%lld %s: %.1f us, %.0f GB/s of weights, %.0f TFLOP/s\n", s.name,
                    (long long)T, name, us, wbytes / us / 1e3, flop / us / 1e6);
      }
      cuda::GroupedGemmArgs g;
      g.N = s.N, g.K = s.K, g.a = x.raw(), g.a_ld = s.K, g.w_one = wt.w.raw(), g.w_ld = s.K;
      g.s_one = wt.scale_inv.data<float>(), g.s_ld = wt.scale_inv.strides()[0], g.max_rows = T;
      g.c = out.raw(), g.c_ld = s.N;
      for (const cuda::Fp8RowTile& tile : row_tiles()) {
        g.bm = tile.bm, g.wgmma = tile.wgmma, g.act8 = tile.act8;
        const double us = time_us(10, [&] { cuda::grouped_gemm_fp8(g, false); });
        std::printf("[bench] grouped_gemm_fp8 dense %s T=%lld %s: %.1f us, %.0f GB/s, %.0f TFLOP/s\n", s.name,
                    (long long)T, tile_name(tile).c_str(), us, wbytes / us / 1e3, flop / us / 1e6);
      }
    }
  }
}

}  // namespace
}  // namespace ms
