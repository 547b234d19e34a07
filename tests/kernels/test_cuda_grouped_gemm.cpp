// The one-launch grouped GEMM (grouped_gemm.h), in every tile shape it is built with, against a
// host reference on ragged groups (empty experts, 1-row experts, a 1000-row group, N and K off the
// tile sizes, odd N, rows read through a token index, strided weights and outputs), checking that
// rows and columns outside the groups stay untouched; and moe_experts' BF16 prefill path built on
// it, at 512 and 4096 tokens on the Qwen3-30B-A3B and DeepSeek-V2-Lite shapes, against the CPU op
// and against the per-expert cuBLASLt path (MOESERVE_GROUPED_GEMM=0). GroupedGemmBench prints
// [bench] lines (each tile shape's time and TFLOP/s on each product, and the whole op) when
// MOESERVE_BENCH_GROUPED=1. MOESERVE_GROUPED_TEST_TILES=<names, comma-separated> checks and times
// those shapes only; MOESERVE_BENCH_GROUPED_POINT="<model name> <tokens>" (e.g. "DeepSeek-V2-Lite 8192";
// "square 4096" for the 4096² case) times that point alone (for a profiler).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "cuda_test_util.h"
#include "moe_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/grouped_gemm.h"

namespace ms {
namespace {
using namespace test;

Tensor gpu_i32(const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(DType::I32, {int64_t(v.size())});
  std::copy(v.begin(), v.end(), t.data<int32_t>());
  return t.to(Device::CUDA);
}

// A device array of the device tensors' addresses (what ExpertTable holds).
Tensor pointer_array(const std::vector<Tensor>& ts) {
  Tensor h = Tensor::empty(DType::I64, {int64_t(ts.size())});
  for (size_t i = 0; i < ts.size(); ++i) h.data<int64_t>()[i] = int64_t(reinterpret_cast<uintptr_t>(ts[i].raw()));
  return h.to(Device::CUDA);
}

// The shapes the tests check and time: every one built, or MOESERVE_GROUPED_TEST_TILES=<name,name,...>'s.
std::vector<std::string> tested_tiles() {
  std::vector<std::string> tiles = cuda::grouped_gemm_tiles();
  if (const char* only = std::getenv("MOESERVE_GROUPED_TEST_TILES"); only && *only) {
    const std::string list = std::string(",") + only + ",";
    std::erase_if(tiles, [&](const std::string& t) { return list.find("," + t + ",") == std::string::npos; });
  }
  return tiles;
}

// Selects a tile shape for the scope (set_grouped_gemm_tile; "" afterwards: the default again).
struct TileSwitch {
  explicit TileSwitch(const std::string& name) { cuda::set_grouped_gemm_tile(name); }
  ~TileSwitch() { cuda::set_grouped_gemm_tile(""); }
};

struct Case {
  std::string name;
  std::vector<int> sizes;  // rows of each expert
  int64_t N, K;
  int64_t w_pad = 0, c_pad = 0;  // weight / output row strides past K / N
  int64_t tokens = 0;            // > 0: rows read through a random token index into [tokens, K]
  int64_t guard = 0;             // max_rows past the rows the groups hold
};

void run_case(const Case& c, bool swiglu) {
  const std::string what = c.name + (swiglu ? " swiglu" : "");
  const int E = int(c.sizes.size());
  std::vector<int32_t> off(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + c.sizes[size_t(e)];
  const int64_t rows = off.back(), max_rows = rows + c.guard, w_ld = c.K + c.w_pad, c_ld = c.N + c.c_pad;
  // A: the rows themselves, or `tokens` rows that a random index picks from.
  const int64_t a_count = c.tokens > 0 ? c.tokens : std::max<int64_t>(rows, 1);
  Tensor a = randn({a_count, c.K});
  std::vector<int32_t> a_rows(static_cast<size_t>(rows));
  std::uniform_int_distribution<int32_t> td(0, int32_t(a_count - 1));
  for (int64_t r = 0; r < rows; ++r) a_rows[size_t(r)] = c.tokens > 0 ? td(rng()) : int32_t(r);
  std::vector<Tensor> w_host, w2_host, w_dev, w2_dev;
  for (int e = 0; e < E; ++e) {
    w_host.push_back(randn({c.N, w_ld}, 0.05f));
    w_dev.push_back(gpu(w_host.back()));
    if (swiglu) {
      w2_host.push_back(randn({c.N, w_ld}, 0.05f));
      w2_dev.push_back(gpu(w2_host.back()));
    }
  }
  Tensor wp = pointer_array(w_dev), w2p = swiglu ? pointer_array(w2_dev) : Tensor();
  Tensor a_dev = gpu(a), rows_dev = gpu_i32(a_rows.empty() ? std::vector<int32_t>{0} : a_rows), off_dev = gpu_i32(off);
  cuda::GroupedGemmArgs args;
  args.N = c.N, args.K = c.K, args.a = a_dev.raw(), args.a_ld = c.K;
  args.a_rows = c.tokens > 0 ? rows_dev.data<int32_t>() : nullptr;
  args.w = static_cast<const void* const*>(wp.raw()), args.w2 = swiglu ? static_cast<const void* const*>(w2p.raw()) : nullptr;
  args.w_ld = w_ld, args.offsets = off_dev.data<int32_t>(), args.experts = E, args.max_rows = max_rows;
  args.c_ld = c_ld;
  ASSERT_TRUE(cuda::grouped_gemm_supported(c.K, w_ld, a_dev.raw(), c.K)) << what;

  // The reference once for every tile shape: row r's N outputs at want[r * N ...].
  std::vector<double> want(size_t(rows * c.N));
  for (int e = 0; e < E; ++e)
    for (int64_t r = off[size_t(e)]; r < off[size_t(e) + 1]; ++r) {
      const float* x = a.data<float>() + int64_t(a_rows[size_t(r)]) * c.K;
      for (int64_t n = 0; n < c.N; ++n) {
        auto dot = [&](const Tensor& w) {
          const float* wr = w.data<float>() + n * w_ld;
          double s = 0;
          for (int64_t k = 0; k < c.K; ++k) s += double(x[k]) * wr[k];
          return s;
        };
        double v = dot(w_host[size_t(e)]);
        if (swiglu) v = v / (1.0 + std::exp(-v)) * dot(w2_host[size_t(e)]);
        want[size_t(r * c.N + n)] = v;
      }
    }

  for (const std::string& tile : tested_tiles()) {
    const std::string at = what + " tile " + tile;
    Tensor out = poisoned(DType::BF16, {std::max<int64_t>(max_rows, 1), c_ld});
    args.c = out.raw();
    {
      TileSwitch ts(tile);
      cuda::grouped_gemm(args, swiglu);
    }
    // Raw output bits: rows past the groups and columns past N must still be the poison.
    Tensor got_bits = out.to(Device::CPU);
    const uint16_t* bits = got_bits.data<uint16_t>();
    int64_t touched = 0, bad = 0;
    double num = 0, den = 0;
    for (int64_t r = 0; r < std::max<int64_t>(max_rows, 1); ++r)
      for (int64_t n = 0; n < c_ld; ++n)
        if ((r >= rows || n >= c.N) && bits[r * c_ld + n] != 0xffff) ++touched;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < c.N; ++n) {
        const double w = want[size_t(r * c.N + n)], have = bf16_to_f32(bits[r * c_ld + n]);
        // One BF16 rounding of the output (2^-9 relative) and f32 sums; NaN (unwritten) fails.
        if (!(std::fabs(have - w) <= 8e-3 * std::fabs(w) + 1e-3)) ++bad;
        num += (have - w) * (have - w), den += w * w;
      }
    EXPECT_EQ(touched, 0) << at << ": elements outside the groups written";
    EXPECT_EQ(bad, 0) << at << ": elements off the reference";
    const double rel = den > 0 ? std::sqrt(num / den) : 0.0;
    EXPECT_LT(rel, 4e-3) << at;
    std::printf("%s: rel error %.2e, %lld rows\n", at.c_str(), rel, (long long)rows);
  }
}

// 48 experts cycling through ragged sizes: 66 row tiles, 5112 rows.
std::vector<int> many_tiles_sizes() {
  std::vector<int> sizes;
  for (int i = 0; i < 6; ++i)
    for (int n : {0, 1, 127, 129, 64, 300, 200, 31}) sizes.push_back(n);
  return sizes;
}

TEST(CudaGroupedGemm, RaggedGroupsMatchHost) {
  MS_REQUIRE_CUDA();
  const std::vector<Case> cases = {
      // Empty experts first, last and between, 1-row experts, a 1000-row group (7 full tiles and
      // a partial one), a group of exactly one tile; N and K off the tile sizes.
      {"ragged N=200 K=136", {0, 1, 1000, 0, 37, 128, 1, 0}, 200, 136},
      // Rows through a token index, strided weights and outputs, max_rows past the groups (as
      // under expert parallelism): the guard rows and pad columns must stay unwritten.
      {"indexed strided N=72 K=264", {3, 0, 129, 64, 250}, 72, 264, 24, 8, 300, 300},
      // Odd N and an odd output stride: single-element stores.
      {"odd N=199 K=40", {17, 200, 0, 5}, 199, 40, 0, 0, 0, 40},
      // K smaller than one K tile, one expert.
      {"one expert N=130 K=8", {300}, 130, 8},
      // The wgmma shapes' warpgroup edges (64 rows each): experts ending at, just past and just
      // short of 64 and 192 rows; N 8 past a 256-column tile (and 8 past two 128-column SwiGLU tiles).
      {"warpgroup edges N=264 K=200", {64, 65, 63, 192, 0, 193, 191}, 264, 200},
      // The models' shapes (gate/up of Qwen3-30B-A3B and DeepSeek-V2-Lite, down of Qwen3).
      {"qwen3 gate/up N=768 K=2048", {256, 300, 0, 17, 129}, 768, 2048},
      {"deepseek gate/up N=1408 K=2048", {200, 1, 383}, 1408, 2048},
      {"qwen3 down N=2048 K=768", {256, 300, 0, 17, 129}, 2048, 768},
      // Many row tiles of experts of 0, 1, 127, 129 rows among others: the tile table's binary
      // search over 48 groups, most tiles partial.
      {"many tiles N=600 K=328", many_tiles_sizes(), 600, 328},
  };
  for (const Case& c : cases)
    for (bool swiglu : {false, true}) run_case(c, swiglu);
}

TEST(CudaGroupedGemm, RejectsUnalignedShapes) {
  EXPECT_FALSE(cuda::grouped_gemm_supported(100, 104, nullptr, 104));  // K % 8
  EXPECT_FALSE(cuda::grouped_gemm_supported(128, 132, nullptr, 128));  // weight stride % 8
  EXPECT_FALSE(cuda::grouped_gemm_supported(128, 128, nullptr, 130));  // A stride % 8
  EXPECT_FALSE(cuda::grouped_gemm_supported(128, 128, reinterpret_cast<const void*>(uintptr_t(8)), 128));
  EXPECT_TRUE(cuda::grouped_gemm_supported(128, 136, nullptr, 128));
}

// Every listed shape is accepted by name and an unknown one fails the call (checked before the
// empty-problem return, so no device is needed: the pointers are never read). The default
// shape depends on the GPU (wgmma on a Hopper), so that last call needs one.
TEST(CudaGroupedGemm, TileShapeByName) {
  const std::vector<std::string> tiles = cuda::grouped_gemm_tiles();
  ASSERT_FALSE(tiles.empty());
  int32_t dummy[2] = {0, 0};
  const void* ptrs[1] = {dummy};
  cuda::GroupedGemmArgs args;
  args.N = 64, args.K = 64, args.a_ld = 64, args.w = ptrs, args.w_ld = 64, args.offsets = dummy, args.experts = 1;
  args.max_rows = 0, args.c = dummy, args.c_ld = 64;
  for (const std::string& t : tiles) {
    TileSwitch ts(t);
    EXPECT_NO_THROW(cuda::grouped_gemm(args, false)) << t;
  }
  {
    TileSwitch ts("64x64x16");
    EXPECT_THROW(cuda::grouped_gemm(args, false), Error);
  }
  MS_REQUIRE_CUDA();
  EXPECT_NO_THROW(cuda::grouped_gemm(args, false));
  EXPECT_EQ(cuda::grouped_gemm_on_wgmma(), cuda::hopper());
}

// ---- moe_experts on the grouped GEMM ----

// Sets MOESERVE_GROUPED_GEMM for the scope (moe_experts reads it at every call).
struct GroupedSwitch {
  explicit GroupedSwitch(bool on) { setenv("MOESERVE_GROUPED_GEMM", on ? "1" : "0", 1); }
  ~GroupedSwitch() { unsetenv("MOESERVE_GROUPED_GEMM"); }
};

// The GPU op on all T tokens, on the grouped GEMM and on the cuBLASLt path, against the CPU op
// on a sample of 192 tokens (the first and last among them).
void expect_moe_matches(const MoeShape& s, const Experts& ex, int64_t T, bool skewed, int first, int n_local,
                        const std::string& what) {
  Tensor x = randn({T, s.H}), ids, w;
  route_tokens(T, s.K, s.E, skewed, ids, w);
  const ops::ExpertWeights gpu_ex = expert_slice(ex.gpu, first, n_local), cpu_ex = expert_slice(ex.cpu, first, n_local);
  Tensor xg = gpu(x), idsg = ids.to(Device::CUDA), wg = w.to(Device::CUDA);
  Tensor out_lt = poisoned(DType::BF16, {T, s.H});
  {
    GroupedSwitch off(false);
    cuda::moe_experts(xg, idsg, wg, gpu_ex, out_lt);
  }
  std::vector<int64_t> keep(static_cast<size_t>(T));
  std::iota(keep.begin(), keep.end(), 0);
  std::shuffle(keep.begin() + 1, keep.end() - 1, rng());
  keep.resize(std::min<size_t>(keep.size(), 191));
  keep.push_back(T - 1);
  std::sort(keep.begin(), keep.end());
  keep.erase(std::unique(keep.begin(), keep.end()), keep.end());
  const int64_t n = int64_t(keep.size());
  Tensor xs = select_rows(x, keep), ids_s = Tensor::empty(DType::I32, {n, s.K}), w_s = Tensor::empty(DType::F32, {n, s.K});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < s.K; ++j) {
      ids_s.data<int32_t>()[i * s.K + j] = ids.data<int32_t>()[keep[size_t(i)] * s.K + j];
      w_s.data<float>()[i * s.K + j] = w.data<float>()[keep[size_t(i)] * s.K + j];
    }
  Tensor ref = Tensor::empty(DType::F32, {n, s.H});
  cpu::moe_experts(xs, ids_s, w_s, cpu_ex, ref);
  const double err_lt = rel_error(select_rows(out_lt.to_f32(), keep), ref);
  for (const std::string& tile : tested_tiles()) {
    const std::string at = what + " tile " + tile;
    Tensor out = poisoned(DType::BF16, {T, s.H});
    {
      GroupedSwitch on(true);
      TileSwitch ts(tile);
      cuda::moe_experts(xg, idsg, wg, gpu_ex, out);
    }
    const double err = rel_error(select_rows(out.to_f32(), keep), ref);
    const double between = rel_error(out.to_f32(), out_lt.to_f32());
    // BF16 activations and output each add about 2^-9 relative: the MoE tests' bound is 1e-2.
    EXPECT_LT(err, 1e-2) << at;
    EXPECT_LT(between, 1e-2) << at << " grouped vs cuBLASLt path";
    std::printf("%s: rel error %.2e (cuBLASLt path %.2e, between them %.2e)\n", at.c_str(), err, err_lt, between);
  }
}

TEST(CudaGroupedGemm, MoeExpertsMatchCpuAtPrefillSizes) {
  MS_REQUIRE_CUDA();
  for (const MoeShape* s : {&kQwen3, &kDeepseekV2Lite}) {
    const Experts ex = make_experts(*s, 7);
    for (int64_t T : {512, 4096})
      for (bool skewed : {false, true})
        expect_moe_matches(*s, ex, T, skewed, 0, s->E,
                           std::string(s->name) + " T=" + std::to_string(T) + (skewed ? " skewed" : ""));
    // One rank's half of the experts: the other half's pairs are no rows of the products.
    expect_moe_matches(*s, ex, 512, true, s->E / 4, s->E / 2, std::string(s->name) + " T=512 half the experts");
  }
}

// ---- timing (time_us: cuda_test_util.h) ----

// Offsets and token index of ids [T, K] sorted by expert, as the device sort builds them.
void sorted_rows(const Tensor& ids, int E, std::vector<int32_t>& offsets, std::vector<int32_t>& token_of_row) {
  const int64_t T = ids.size(0), K = ids.size(1);
  offsets.assign(size_t(E) + 1, 0);
  for (int64_t p = 0; p < T * K; ++p) ++offsets[size_t(ids.data<int32_t>()[p]) + 1];
  std::partial_sum(offsets.begin(), offsets.end(), offsets.begin());
  std::vector<int32_t> next(offsets.begin(), offsets.end() - 1);
  token_of_row.assign(size_t(T * K), 0);
  for (int64_t p = 0; p < T * K; ++p) token_of_row[size_t(next[size_t(ids.data<int32_t>()[p])]++)] = int32_t(p / K);
}

TEST(CudaGroupedGemm, GroupedGemmBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_GROUPED");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_GROUPED=1 to time the grouped GEMM";
  const std::vector<std::string> tiles = tested_tiles();
  const char* only_point = std::getenv("MOESERVE_BENCH_GROUPED_POINT");
  auto wanted = [&](const std::string& name, int64_t T) {
    return !only_point || !*only_point || name + " " + std::to_string(T) == only_point;
  };
  // Large groups: 16 experts of 2048 rows, N = K = 4096 (the kernel's ceiling, no ragged tiles).
  if (wanted("square", 4096)) {
    const int E = 16;
    const int64_t R = 2048, N = 4096, Kd = 4096;
    std::vector<int32_t> off(E + 1);
    for (int e = 0; e <= E; ++e) off[size_t(e)] = int32_t(e * R);
    std::vector<Tensor> ws;
    for (int e = 0; e < E; ++e) ws.push_back(fast_bf16({N, Kd}, 0.03f, uint64_t(e)).to(Device::CUDA));
    Tensor wp = pointer_array(ws), offg = gpu_i32(off), a = fast_bf16({E * R, Kd}, 1.f, 99).to(Device::CUDA);
    Tensor c = cuda::scratch(DType::BF16, {E * R, N});
    cuda::GroupedGemmArgs g;
    g.N = N, g.K = Kd, g.a = a.raw(), g.a_ld = Kd, g.w = static_cast<const void* const*>(wp.raw()), g.w_ld = Kd;
    g.offsets = offg.data<int32_t>(), g.experts = E, g.max_rows = E * R, g.c = c.raw(), g.c_ld = N;
    for (const std::string& tile : tiles) {
      TileSwitch ts(tile);
      const double us = time_us(10, [&] { cuda::grouped_gemm(g, false); });
      std::printf("[bench] grouped_gemm tile %s: %d experts x %lld rows, N=%lld K=%lld: %.1f us, %.0f TFLOP/s\n",
                  tile.c_str(), E, (long long)R, (long long)N, (long long)Kd, us, 2.0 * E * R * N * Kd / us / 1e6);
    }
  }
  // The models' two products at prefill sizes, each tile shape, then the whole op on the default
  // shape and on the per-expert cuBLASLt path. moe_experts itself takes the grouped GEMM only up to
  // a mean of kGroupedGemmMaxMeanRows rows an expert (moe_experts.cu): past it both whole-op lines
  // are the cuBLASLt path, and the per-shape lines show where the threshold should sit.
  struct Point {
    const MoeShape* s;
    std::vector<int64_t> tokens;
  };
  for (const Point& pt : {Point{&kQwen3, {1024, 2048, 4096, 8192}}, Point{&kDeepseekV2Lite, {1024, 2048, 4096, 8192}}}) {
    const MoeShape* s = pt.s;
    const Experts ex = make_experts(*s, 7);
    std::vector<Tensor> gate, up, down;
    for (int e = 0; e < s->E; ++e)
      gate.push_back(ex.gpu.gate[size_t(e)].w), up.push_back(ex.gpu.up[size_t(e)].w), down.push_back(ex.gpu.down[size_t(e)].w);
    Tensor gp = pointer_array(gate), upp = pointer_array(up), dp = pointer_array(down);
    for (const int64_t T : pt.tokens) {
      if (!wanted(s->name, T)) continue;
      const int64_t H = s->H, I = s->I, K = s->K, rows = T * K;
      Tensor ids, w;
      route_tokens(T, K, s->E, false, ids, w);
      std::vector<int32_t> off, tor;
      sorted_rows(ids, s->E, off, tor);
      Tensor offg = gpu_i32(off), torg = gpu_i32(tor), x = gpu(randn({T, H}));
      Tensor act = cuda::scratch(DType::BF16, {rows, I}), ye = cuda::scratch(DType::BF16, {rows, H});
      cuda::GroupedGemmArgs gu;
      gu.N = I, gu.K = H, gu.a = x.raw(), gu.a_ld = H, gu.a_rows = torg.data<int32_t>();
      gu.w = static_cast<const void* const*>(gp.raw()), gu.w2 = static_cast<const void* const*>(upp.raw()), gu.w_ld = H;
      gu.offsets = offg.data<int32_t>(), gu.experts = s->E, gu.max_rows = rows, gu.c = act.raw(), gu.c_ld = I;
      cuda::GroupedGemmArgs dn = gu;
      dn.N = H, dn.K = I, dn.a = act.raw(), dn.a_ld = I, dn.a_rows = nullptr;
      dn.w = static_cast<const void* const*>(dp.raw()), dn.w2 = nullptr, dn.w_ld = I, dn.c = ye.raw(), dn.c_ld = H;
      const double f_gu = 2.0 * rows * 2 * I * H, f_dn = 2.0 * rows * H * I;
      for (const std::string& tile : tiles) {
        TileSwitch ts(tile);
        const double t_gu = time_us(10, [&] { cuda::grouped_gemm(gu, true); });
        const double t_dn = time_us(10, [&] { cuda::grouped_gemm(dn, false); });
        std::printf("[bench] %s T=%lld (%lld rows an expert) tile %s: grouped gate|up+silu %.1f us (%.0f TFLOP/s), "
                    "down %.1f us (%.0f TFLOP/s), both %.1f us\n",
                    s->name, (long long)T, (long long)(rows / s->E), tile.c_str(), t_gu, f_gu / t_gu / 1e6, t_dn,
                    f_dn / t_dn / 1e6, t_gu + t_dn);
      }

      Tensor idsg = ids.to(Device::CUDA), wg = w.to(Device::CUDA), out = cuda::scratch(DType::BF16, {T, H});
      for (bool grouped : {true, false}) {
        GroupedSwitch sw(grouped);
        const double whole = time_us(5, [&] { cuda::moe_experts(x, idsg, wg, ex.gpu, out); });
        cudaStreamSynchronize(cuda::stream());
        const auto t0 = std::chrono::steady_clock::now();
        cuda::moe_experts(x, idsg, wg, ex.gpu, out);
        const auto t1 = std::chrono::steady_clock::now();
        cudaStreamSynchronize(cuda::stream());
        const auto t2 = std::chrono::steady_clock::now();
        std::printf("[bench] %s T=%lld whole moe_experts (MOESERVE_GROUPED_GEMM=%d): %.1f us (%.0f TFLOP/s on the "
                    "products); from an idle stream issued in %.1f us, done at %.1f us\n",
                    s->name, (long long)T, grouped ? 1 : 0, whole, (f_gu + f_dn) / whole / 1e6,
                    std::chrono::duration<double, std::micro>(t1 - t0).count(),
                    std::chrono::duration<double, std::micro>(t2 - t0).count());
      }
    }
  }
}

}  // namespace
}  // namespace ms
