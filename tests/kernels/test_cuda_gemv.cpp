// The weight-streaming product (cuda::gemv) at the decode shapes it runs: Qwen3-30B-A3B and
// DeepSeek-V2-Lite at batch 1 (their attention products, experts, shared expert and lm_head) and
// their routed experts at batch 64, in every launch shape that the bench sweeps (cuda::GemvTuning),
// against a host reference. Grouped rows come as moe_experts hands them over: pairs sorted by
// expert, offsets / active / n_active on the device, the SwiGLU pair reading tokens through
// token_of_row. A few more cases cover dense passes of 20 rows over a ragged N and FP8 blocks.
// CudaGemv.Bench (MOESERVE_BENCH_GEMV=1) prints microseconds a launch, replayed from graphs of 50,
// over weights far larger than L2, with the bytes of weight read and the TB/s they make; with
// MOESERVE_BENCH_GEMV_HOT=1 as well, the dense products over one copy that stays in L2 (how fast
// a product whose weight was prefetched could be); MOESERVE_BENCH_GEMV_ONLY=text times only the
// shapes whose name contains it ("v3": DeepSeek-V3's FP8 products).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/gemv.h"

namespace ms {
namespace {
using namespace test;
using cuda::GemvTuning;

struct GemvShape {
  const char* name;
  int64_t N, K;
  bool swiglu;
  int experts;  // 0: a dense weight
  int tokens;   // dense: the rows
  int top_k;    // grouped: rows are tokens x top_k pairs
  bool fp8 = false;
  bool bench = true;
  bool check = true;  // false: timed only (host references too large to be worth their time)
};

const std::vector<GemvShape> kShapes = {
    {"qwen3 B=1 qkv", 5120, 2048, false, 0, 1, 1},
    {"qwen3 B=1 o", 2048, 4096, false, 0, 1, 1},
    {"qwen3 B=1 experts gate/up", 768, 2048, true, 128, 1, 8},
    {"qwen3 B=1 experts down", 2048, 768, false, 128, 1, 8},
    {"v2-lite B=64 experts gate/up", 1408, 2048, true, 64, 64, 6},
    {"v2-lite B=64 experts down", 2048, 1408, false, 64, 64, 6},
    {"qwen3 B=64 experts gate/up", 768, 2048, true, 128, 64, 8},
    {"qwen3 B=64 experts down", 2048, 768, false, 128, 64, 8},
    {"v2-lite B=1 experts gate/up", 1408, 2048, true, 64, 1, 6},
    {"v2-lite B=1 experts down", 2048, 1408, false, 64, 1, 6},
    {"v2-lite B=1 shared gate/up", 2816, 2048, true, 0, 1, 1},
    {"v2-lite B=1 shared down", 2048, 2816, false, 0, 1, 1},
    {"v2-lite B=1 q", 3072, 2048, false, 0, 1, 1},
    {"v2-lite B=1 kv_a", 576, 2048, false, 0, 1, 1},
    {"v2-lite B=1 o", 2048, 2048, false, 0, 1, 1},
    // Timed only (too large for the host reference): the heads.
    {"qwen3 B=1 lm_head", 151936, 2048, false, 0, 1, 1},
    {"v2-lite B=1 lm_head", 102400, 2048, false, 0, 1, 1},
    // Correctness only: dense passes of 20 rows and a last slab of 8 features; FP8 blocks.
    {"dense 20 rows N=1000", 1000, 1408, false, 0, 20, 1, false, false},
    {"fp8 dense 3 rows", 2048, 2048, false, 0, 3, 1, true, false},
    {"fp8 experts gate/up B=16", 768, 2048, true, 128, 16, 8, true, false},
    {"fp8 experts down B=16", 2048, 768, false, 128, 16, 8, true, false},
    {"fp8 dense 12 rows N=300", 300, 1536, false, 0, 12, 1, true, false},
    // Timed only: DeepSeek-V3's batch-1 FP8 products on an EP8 shard (32 of its 256 experts; the kernels are the
    // checked FP8 shapes' above).
    {"v3 B=1 q_a|kv_a fp8", 2112, 7168, false, 0, 1, 1, true, true, false},
    {"v3 B=1 q_b fp8", 24576, 1536, false, 0, 1, 1, true, true, false},
    {"v3 B=1 o fp8", 7168, 16384, false, 0, 1, 1, true, true, false},
    {"v3 B=1 shared gate/up fp8", 2048, 7168, true, 0, 1, 1, true, true, false},
    {"v3 B=1 shared down fp8", 7168, 2048, false, 0, 1, 1, true, true, false},
    {"v3 B=1 experts gate/up fp8", 2048, 7168, true, 32, 1, 8, true, true, false},
    {"v3 B=1 experts down fp8", 7168, 2048, false, 32, 1, 8, true, true, false},
    {"v3 B=1 dense MLP gate/up fp8", 18432, 7168, true, 0, 1, 1, true, true, false},  // the first layers'
    {"v3 B=1 dense MLP down fp8", 7168, 18432, false, 0, 1, 1, true, true, false},
};

constexpr int kBenchLaunches = 50;  // launches a graph of the bench

int sm_count() {
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n;
}

// The lm_head shapes: 311 M multiply-adds a row on the host, and 1.2 GB of host weights.
bool timed_only(const GemvShape& s) { return !s.check || s.N * s.K > 100'000'000; }

int64_t rows_of(const GemvShape& s) { return s.experts ? int64_t(s.tokens) * s.top_k : s.tokens; }
int expected_groups(const GemvShape& s) { return s.experts ? int(std::min<int64_t>(s.experts, rows_of(s))) : 1; }

// The launch shapes timed (and checked) for a shape: the automatic choice, warps 4 / 8 (FP8 also
// 1 / 2), blocks over slabs that give every block the same slab count, one slab each, or a grid a
// multiple of the SM count, and each row-tile count where rows come in groups or past 8.
std::vector<std::pair<std::string, GemvTuning>> variants(const GemvShape& s) {
  const int sms = sm_count(), eg = expected_groups(s), slabs = int((s.N + 15) / 16);
  const int auto_y = std::min(slabs, std::max(1, (32 * sms + eg - 1) / eg));  // as gemv() picks it
  const int per_block = (slabs + auto_y - 1) / auto_y;
  std::vector<std::pair<std::string, GemvTuning>> v = {
      {"auto", {}}, {"warps4", {4, 0, 0}}, {"warps8", {8, 0, 0}}};
  if (s.fp8) v.insert(v.begin() + 1, {{"warps1", {1, 0, 0}}, {"warps2", {2, 0, 0}}});  // FP8: 64 bytes a lane's chunk
  auto add_y = [&](const std::string& name, int y) {
    if (y < 1 || y > slabs || y == auto_y) return;
    for (const auto& [n, t] : v)
      if (t.blocks_y == y) return;
    v.push_back({name + "=" + std::to_string(y), {0, y, 0}});
  };
  add_y("y_balanced", (slabs + per_block - 1) / per_block);
  add_y("y_slabs", slabs);
  // eg * y a multiple of the SM count: the three largest such y up to the automatic one.
  const int step = sms / std::gcd(sms, eg);
  for (int m = auto_y / step; m >= 1 && m > auto_y / step - 3; --m) add_y("y_sm_multiple", m * step);
  if (s.experts || s.tokens > 8) {
    for (int nt : {1, 2, 4}) v.push_back({"nt" + std::to_string(nt), {0, 0, nt}});
  }
  return v;
}

std::string describe(const GemvTuning& t) {
  return "(" + std::to_string(t.warps) + "," + std::to_string(t.blocks_y) + "," + std::to_string(t.nt) + ")";
}

// Pairs of `tokens` x `top_k` distinct experts, drawn with a skewed popularity as routers make
// (log-normal weights; none from `excluded`), sorted by expert as moe_grouped.cu's align_kernel
// sorts them: offsets [E + 1], the experts with rows in order (active, n_active), the token of
// each row.
struct Routing {
  std::vector<int32_t> offsets, active, token_of_row;
  int n_active = 0;
};
Routing make_routing(int tokens, int top_k, int E, const std::vector<bool>& excluded = {}) {
  std::lognormal_distribution<double> pop(0.0, 0.8);
  std::vector<double> weight(static_cast<size_t>(E));
  for (int e = 0; e < E; ++e) weight[size_t(e)] = excluded.empty() || !excluded[size_t(e)] ? pop(rng()) : 0.0;
  std::discrete_distribution<int> pick(weight.begin(), weight.end());
  std::vector<std::vector<int32_t>> rows_of_expert(static_cast<size_t>(E));
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> chosen;
    while (int(chosen.size()) < top_k) {
      const int e = pick(rng());
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int e : chosen) rows_of_expert[size_t(e)].push_back(t);
  }
  Routing r;
  r.offsets.push_back(0);
  for (int e = 0; e < E; ++e) {
    const auto& rows = rows_of_expert[size_t(e)];
    if (!rows.empty()) r.active.push_back(e);
    r.token_of_row.insert(r.token_of_row.end(), rows.begin(), rows.end());
    r.offsets.push_back(int32_t(r.token_of_row.size()));
  }
  r.n_active = int(r.active.size());
  r.active.resize(size_t(E), -1);
  return r;
}

// A routing's device arrays in one I32 tensor: offsets, active, n_active, token_of_row.
struct DeviceRouting {
  Tensor data;
  cuda::GemvRows rows(int64_t pairs, int E, int groups) const {
    const int32_t* d = data.data<int32_t>();
    cuda::GemvRows r;
    r.rows = int(pairs), r.offsets = d, r.active = d + E + 1, r.n_active = d + 2 * E + 1;
    r.max_groups = r.expected_groups = groups;
    return r;
  }
  const int32_t* token_of_row(int E) const { return data.data<int32_t>() + 2 * E + 2; }
};
DeviceRouting upload(const Routing& r) {
  std::vector<int32_t> all = r.offsets;
  all.insert(all.end(), r.active.begin(), r.active.end());
  all.push_back(r.n_active);
  all.insert(all.end(), r.token_of_row.begin(), r.token_of_row.end());
  Tensor t = Tensor::empty(DType::I32, {int64_t(all.size())});
  std::copy(all.begin(), all.end(), t.data<int32_t>());
  return {t.to(Device::CUDA)};
}

Tensor device_pointers(const std::vector<const void*>& ptrs) {
  Tensor t = Tensor::empty(DType::I64, {int64_t(ptrs.size())});
  for (size_t i = 0; i < ptrs.size(); ++i) t.data<int64_t>()[i] = int64_t(reinterpret_cast<uintptr_t>(ptrs[i]));
  return t.to(Device::CUDA);
}

// F32 host tensor of uniform values of standard deviation `std`, exact in bf16 (xorshift_uniform).
Tensor uniform_bf16_values(Shape shape, float std, uint64_t seed) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  float* out = t.data<float>();
  xorshift_uniform(t.numel(), std, seed, [&](int64_t i, float v) { out[i] = v; });
  return t;
}

// One weight matrix [N, K]: what the kernel reads (BF16, or FP8 codes with block scales) and
// the values it multiplies by, as F32 on the host (FP8: code x scale, unrounded: the kernel
// scales its f32 sums, not the weights).
struct Matrix {
  Tensor dev, dev_scale, host;
};
Matrix make_matrix(int64_t N, int64_t K, bool fp8, uint64_t seed) {
  Matrix m;
  if (!fp8) {
    m.host = uniform_bf16_values({N, K}, 0.03f, seed);
    m.dev = gpu(m.host);
    return m;
  }
  Fp8Weight w = random_fp8(N, K, 0.002f);
  m.dev = w.gpu.w, m.dev_scale = w.gpu.scale_inv;
  m.host = Tensor::empty(DType::F32, {N, K});
  const int64_t sld = w.cpu.scale_inv.size(1);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      m.host.data<float>()[n * K + k] =
          fp8_e4m3_to_f32(w.cpu.w.data<uint8_t>()[n * K + k]) * w.cpu.scale_inv.data<float>()[(n / 128) * sld + k / 128];
  return m;
}

float dot(const float* a, const float* b, int64_t K) {
  float acc[16] = {};
  int64_t k = 0;
  for (; k + 16 <= K; k += 16)
    for (int i = 0; i < 16; ++i) acc[i] += a[k + i] * b[k + i];
  float s = 0.f;
  for (; k < K; ++k) s += a[k] * b[k];
  for (float v : acc) s += v;
  return s;
}

// A shape's product on the device with its host reference. Grouped weights: kDistinct matrices
// (and twins) shared round-robin by the experts, so the reference stays small while every
// expert's pointer is its own entry of the table (an expert read through a wrong entry shows).
constexpr int kDistinct = 7;

struct Case {
  GemvShape s;
  int64_t rows = 0;
  Tensor x_host, x, out;  // x: [tokens, K] for the SwiGLU pair and dense, [rows, K] for down
  std::vector<Matrix> mats, twins;
  Tensor table;  // grouped: w, w2, s, s2 pointer arrays, E each
  Routing routing;
  DeviceRouting dev_routing;
  cuda::GemvWeights w;
  cuda::GemvRows grows;
  cuda::GemvInput in{nullptr, 0};
  DType out_dtype = DType::BF16;

  explicit Case(const GemvShape& shape) : s(shape), rows(rows_of(shape)) {
    const int E = s.experts;
    const int distinct = E ? kDistinct : 1;
    for (int i = 0; i < distinct; ++i) {
      mats.push_back(make_matrix(s.N, s.K, s.fp8, 10 * i + 1));
      if (s.swiglu) twins.push_back(make_matrix(s.N, s.K, s.fp8, 10 * i + 2));
    }
    w.ld = s.K, w.fp8 = s.fp8;
    if (s.fp8) w.scale_ld = mats[0].dev_scale.size(1);
    if (E) {
      std::vector<const void*> ptrs;
      for (int part = 0; part < 4; ++part)
        for (int e = 0; e < E; ++e) {
          const auto& list = part % 2 == 0 ? mats : twins;
          const Matrix* m = s.swiglu || part % 2 == 0 ? &list[size_t(e % distinct)] : nullptr;
          ptrs.push_back(!m ? nullptr : part < 2 ? m->dev.raw() : s.fp8 ? m->dev_scale.raw() : nullptr);
        }
      table = device_pointers(ptrs);
      const auto* base = static_cast<const char*>(table.raw());
      w.w = reinterpret_cast<const void* const*>(base);
      if (s.swiglu) w.w2 = reinterpret_cast<const void* const*>(base + 8 * E);
      if (s.fp8) {
        w.s = reinterpret_cast<const float* const*>(base + 16 * E);
        if (s.swiglu) w.s2 = reinterpret_cast<const float* const*>(base + 24 * E);
      }
      routing = make_routing(s.tokens, s.top_k, E);
      dev_routing = upload(routing);
      grows = dev_routing.rows(rows, E, expected_groups(s));
    } else {
      w.w_one = mats[0].dev.raw();
      if (s.fp8) w.s_one = mats[0].dev_scale.data<float>();
      if (s.swiglu) {
        w.w2_one = twins[0].dev.raw();
        if (s.fp8) w.s2_one = twins[0].dev_scale.data<float>();
      }
      grows.rows = int(rows);
    }
    // The SwiGLU pair reads tokens through token_of_row; down reads its rows in place, F32 out.
    const int64_t x_rows = E && !s.swiglu ? rows : s.tokens;
    x_host = uniform_bf16_values({x_rows, s.K}, 1.0f, 99);
    x = gpu(x_host);
    in = cuda::GemvInput{static_cast<const __nv_bfloat16*>(x.raw()), s.K,
                         E && s.swiglu ? dev_routing.token_of_row(E) : nullptr};
    out_dtype = E && !s.swiglu ? DType::F32 : DType::BF16;
    out = Tensor::empty(out_dtype, {rows, s.N}, Device::CUDA);
  }

  void launch() const {
    cuda::gemv(s.N, s.K, w, grows, in, cuda::GemvOutput{out.raw(), out_dtype, s.N}, s.swiglu);
  }

  // out [rows, N] in F32 on the host. product(r0, r1, src, e): rows [r0, r1) of expert e, row r
  // reading x[src(r)], each weight row read once for all of them (it stays in cache).
  std::vector<float> reference() const {
    std::vector<float> ref(size_t(rows * s.N));
    auto product = [&](int32_t r0, int32_t r1, auto src, int e) {
      const size_t m = size_t(e) % mats.size();
      for (int64_t n = 0; n < s.N; ++n) {
        const float* wg = mats[m].host.data<float>() + n * s.K;
        const float* wu = s.swiglu ? twins[m].host.data<float>() + n * s.K : nullptr;
        for (int32_t r = r0; r < r1; ++r) {
          const float* xr = x_host.data<float>() + int64_t(src(r)) * s.K;
          float v = dot(xr, wg, s.K);
          if (s.swiglu) v = v / (1.0f + std::exp(-v)) * dot(xr, wu, s.K);
          ref[size_t(r * s.N + n)] = v;
        }
      }
    };
    if (!s.experts) {
      product(0, int32_t(rows), [](int32_t r) { return r; }, 0);
      return ref;
    }
    for (int e = 0; e < s.experts; ++e)
      product(routing.offsets[size_t(e)], routing.offsets[size_t(e) + 1],
              [&](int32_t r) { return s.swiglu ? routing.token_of_row[size_t(r)] : r; }, e);
    return ref;
  }
};

// Every element finite and within tol x the largest reference magnitude (BF16 outputs: one
// rounding, 2^-9 relative; F32: only the order of the sums differs).
void expect_close(const Tensor& got_dev, const std::vector<float>& ref, double tol, const std::string& at) {
  const std::vector<float> got = got_dev.to_vector();
  ASSERT_EQ(got.size(), ref.size()) << at;
  double scale = 0;
  for (float v : ref) scale = std::max(scale, double(std::fabs(v)));
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (!std::isfinite(got[i]) || std::fabs(double(got[i]) - ref[i]) > tol * scale) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  EXPECT_EQ(bad, 0) << at << ": " << bad << " of " << got.size() << " elements off, first at " << first << " ("
                    << (first >= 0 ? got[size_t(first)] : 0.f) << " vs " << (first >= 0 ? ref[size_t(first)] : 0.f)
                    << ", scale " << scale << ")";
}

// FP8 takes K in whole 64-wide chunks only: a lane of a quad past K would scale the quad's sums
// by zero. Other FP8 shapes go to the other products (test_cuda_grouped_gemm_fp8's K = 1552).
TEST(CudaGemv, Fp8NeedsWholeChunks) {
  EXPECT_TRUE(cuda::gemv_supported(1536, 1536, true, nullptr, 1536));
  EXPECT_FALSE(cuda::gemv_supported(1552, 1552, true, nullptr, 1552));
  EXPECT_TRUE(cuda::gemv_supported(1552, 1552, false, nullptr, 1552));
  EXPECT_TRUE(cuda::gemv_fp8_block_k(128));
  EXPECT_FALSE(cuda::gemv_fp8_block_k(32));
}

// Restores the automatic launch shape when a test ends, failed or not.
struct TuningGuard {
  GemvTuning saved = cuda::gemv_tuning();
  ~TuningGuard() { cuda::set_gemv_tuning(saved); }
};

TEST(CudaGemv, EveryLaunchShapeMatchesHostReference) {
  MS_REQUIRE_CUDA();
  TuningGuard guard;
  for (const auto& shape : kShapes) {
    if (timed_only(shape)) continue;
    const Case c(shape);
    const std::vector<float> ref = c.reference();
    const double tol = c.out_dtype == DType::F32 ? 1e-4 : 1e-2;
    for (const auto& [name, tuning] : variants(shape)) {
      cuda::set_gemv_tuning(tuning);
      MS_CUDA(cudaMemsetAsync(c.out.raw(), 0xff, c.out.nbytes(), cuda::stream()));  // NaN where unwritten
      c.launch();
      expect_close(c.out, ref, tol, std::string(shape.name) + " " + name + " " + describe(tuning));
    }
  }
}

// A dense weight marked fetch_early loads its first round before the kernel waits for the one
// before it (with MOESERVE_GEMV_PREFETCH unset or `marked`): the same loads and sums, so the same
// bits, in every launch shape.
TEST(CudaGemv, EarlyFetchGivesTheSameBits) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_GEMV_PREFETCH");
  if (env && std::string(env) != "marked") GTEST_SKIP() << "MOESERVE_GEMV_PREFETCH=" << env << " overrides the mark";
  TuningGuard guard;
  int checked = 0;
  for (const auto& shape : kShapes) {
    if (timed_only(shape) || shape.experts) continue;
    Case c(shape);
    for (const auto& [name, tuning] : variants(shape)) {
      cuda::set_gemv_tuning(tuning);
      c.w.fetch_early = false;
      c.launch();
      const std::vector<float> plain = c.out.to_vector();
      c.w.fetch_early = true;
      MS_CUDA(cudaMemsetAsync(c.out.raw(), 0xff, c.out.nbytes(), cuda::stream()));
      c.launch();
      const std::vector<float> early = c.out.to_vector();
      ASSERT_EQ(plain.size(), early.size());
      EXPECT_EQ(0, std::memcmp(plain.data(), early.data(), plain.size() * sizeof(float)))
          << shape.name << " " << name << " " << describe(tuning);
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

TEST(CudaGemv, TuningRejectsOutOfRangeValues) {
  MS_REQUIRE_CUDA();
  TuningGuard guard;
  EXPECT_THROW(cuda::set_gemv_tuning({9, 0, 0}), Error);
  EXPECT_THROW(cuda::set_gemv_tuning({0, 0, 3}), Error);
  EXPECT_THROW(cuda::set_gemv_tuning({0, -1, 0}), Error);
}

// Microseconds a launch takes: launch(i) for i < kBenchLaunches captured in one graph, replayed;
// the median of 7 timings of 4 replays each.
template <class F>
double graphed_us(F launch) {
  constexpr int kPerGraph = kBenchLaunches, kReplays = 4, kTimings = 7;
  cudaStream_t s = cuda::stream();
  for (int i = 0; i < kPerGraph; ++i) launch(i);
  MS_CUDA(cudaStreamSynchronize(s));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  MS_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kPerGraph; ++i) launch(i);
  MS_CUDA(cudaStreamEndCapture(s, &graph));
  MS_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 2; ++i) MS_CUDA(cudaGraphLaunch(exec, s));
  cudaEvent_t a, b;
  MS_CUDA(cudaEventCreate(&a));
  MS_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int t = 0; t < kTimings; ++t) {
    MS_CUDA(cudaEventRecord(a, s));
    for (int i = 0; i < kReplays; ++i) MS_CUDA(cudaGraphLaunch(exec, s));
    MS_CUDA(cudaEventRecord(b, s));
    MS_CUDA(cudaEventSynchronize(b));
    float v = 0.f;
    MS_CUDA(cudaEventElapsedTime(&v, a, b));
    ms.push_back(v);
  }
  MS_CUDA(cudaEventDestroy(a));
  MS_CUDA(cudaEventDestroy(b));
  MS_CUDA(cudaGraphExecDestroy(exec));
  MS_CUDA(cudaGraphDestroy(graph));
  std::sort(ms.begin(), ms.end());
  return 1000.0 * ms[ms.size() / 2] / (kPerGraph * kReplays);
}

// A shape as the bench streams it: weights well past L2 (50 MB on the H200) so that no launch
// finds the last one's weights there. Dense: enough copies of the weight for 150 MB, launch i
// reading copy i. Grouped: every expert its own weights (filled by memset: the values do not
// change the time), and at batch 1 a fresh routing for each launch of the graph, none sharing an
// expert with the 5 launches either side (V3's shard, 8 of 32 experts: the one either side),
// replays wrapping around: as in a decode step, where the next layer's experts are other
// weights. FP8: codes and 128 x 128 block scales, both by memset (1.5 and 0.0115).
struct BenchCase {
  GemvShape s;
  int64_t rows;
  std::vector<Tensor> weights;  // dense copies, or [E, N, K] gate (and up)
  std::vector<Tensor> scales;   // FP8: each weight's [E or 1, N / 128, K / 128] block scales
  std::vector<Tensor> tables;
  std::vector<Routing> routings;
  std::vector<DeviceRouting> dev_routings;
  Tensor x, out;
  DType out_dtype;

  explicit BenchCase(const GemvShape& shape, bool hot) : s(shape), rows(rows_of(shape)) {
    const int64_t matrix = s.N * s.K * (s.fp8 ? 1 : 2);
    const int64_t scale_matrix = scale_rows() * scale_ld();
    const int copies = s.experts ? (s.swiglu ? 2 : 1) : hot ? 1 : int((150'000'000 + matrix - 1) / matrix);
    for (int i = 0; i < copies; ++i) {
      const int64_t E = std::max(1, s.experts);
      weights.push_back(Tensor::empty(s.fp8 ? DType::F8_E4M3 : DType::BF16, {E * s.N, s.K}, Device::CUDA));
      MS_CUDA(cudaMemsetAsync(weights.back().raw(), 0x3c, weights.back().nbytes(), cuda::stream()));
      if (!s.fp8) continue;
      scales.push_back(Tensor::empty(DType::F32, {E * scale_rows(), scale_ld()}, Device::CUDA));
      MS_CUDA(cudaMemsetAsync(scales.back().raw(), 0x3c, scales.back().nbytes(), cuda::stream()));
    }
    if (s.experts) {
      // w (gate), w2 (up), s, s2: E pointers each.
      std::vector<const void*> ptrs;
      for (int part = 0; part < (s.fp8 ? 4 : 2); ++part)
        for (int e = 0; e < s.experts; ++e) {
          const int m = std::min(part % 2, copies - 1);
          ptrs.push_back(part < 2 ? static_cast<const char*>(weights[size_t(m)].raw()) + e * matrix
                                  : static_cast<const void*>(scales[size_t(m)].data<float>() + e * scale_matrix));
        }
      tables.push_back(device_pointers(ptrs));
      const int n = s.tokens == 1 ? kBenchLaunches : 1;
      const int window = s.experts >= 64 ? 5 : 1;  // V3's shard: 8 of 32 experts, so one launch either side
      for (int i = 0; i < n; ++i) {
        // The routings made so far among the launches either side (the graph replays in a ring).
        std::vector<bool> excluded(size_t(s.experts), false);
        for (int d = 1; d <= window && n > 1; ++d)
          for (const int k : {(i - d + n) % n, (i + d) % n})
            if (k < int(routings.size()))
              for (int a = 0; a < routings[size_t(k)].n_active; ++a)
                excluded[size_t(routings[size_t(k)].active[size_t(a)])] = true;
        routings.push_back(make_routing(s.tokens, s.top_k, s.experts, excluded));
        dev_routings.push_back(upload(routings.back()));
      }
    }
    x = gpu(uniform_bf16_values({s.experts && !s.swiglu ? rows : s.tokens, s.K}, 1.0f, 7));
    out_dtype = s.experts && !s.swiglu ? DType::F32 : DType::BF16;
    out = Tensor::empty(out_dtype, {rows, s.N}, Device::CUDA);
  }

  int64_t scale_rows() const { return (s.N + 127) / 128; }
  int64_t scale_ld() const { return (s.K + 127) / 128; }

  void launch(int i) const {
    cuda::GemvWeights w;
    w.ld = s.K, w.fp8 = s.fp8, w.scale_ld = scale_ld();
    cuda::GemvRows r;
    const int32_t* x_rows = nullptr;
    if (s.experts) {
      const auto* t = static_cast<const void* const*>(tables[0].raw());
      w.w = t, w.w2 = s.swiglu ? t + s.experts : nullptr;
      if (s.fp8) {
        w.s = reinterpret_cast<const float* const*>(t + 2 * s.experts);
        w.s2 = s.swiglu ? reinterpret_cast<const float* const*>(t + 3 * s.experts) : nullptr;
      }
      const auto& dr = dev_routings[size_t(i) % dev_routings.size()];
      r = dr.rows(rows, s.experts, expected_groups(s));
      if (s.swiglu) x_rows = dr.token_of_row(s.experts);
    } else {
      // A dense SwiGLU pair: the up half is the next copy (two copies a launch, none shared with the last).
      const size_t first = size_t(i) * (s.swiglu ? 2 : 1);
      w.w_one = weights[first % weights.size()].raw();
      if (s.swiglu) w.w2_one = weights[(first + 1) % weights.size()].raw();
      if (s.fp8) {
        w.s_one = scales[first % scales.size()].data<float>();
        if (s.swiglu) w.s2_one = scales[(first + 1) % scales.size()].data<float>();
      }
      r.rows = int(rows);
    }
    cuda::GemvInput in{static_cast<const __nv_bfloat16*>(x.raw()), s.K, x_rows};
    cuda::gemv(s.N, s.K, w, r, in, cuda::GemvOutput{out.raw(), out_dtype, s.N}, s.swiglu);
  }

  // Weight bytes a launch reads (each active expert's matrices once), averaged over routings.
  double bytes() const {
    const double matrix = double(s.N * s.K * (s.fp8 ? 1 : 2)) * (s.swiglu ? 2 : 1);
    if (!s.experts) return matrix;
    double groups = 0;
    for (const auto& r : routings) groups += r.n_active;
    return matrix * groups / double(routings.size());
  }
};

TEST(CudaGemv, Bench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_GEMV");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_GEMV=1 to time the products";
  TuningGuard guard;
  const char* hot_env = std::getenv("MOESERVE_BENCH_GEMV_HOT");
  const bool hot = hot_env && std::string(hot_env) == "1";
  const char* only = std::getenv("MOESERVE_BENCH_GEMV_ONLY");  // shapes whose name contains this
  std::printf("[bench] gemv: %d SMs; us a launch (graphs of 50), MB of weight a launch, TB/s; tuning "
              "(warps,blocks_y,nt), 0 = automatic%s\n",
              sm_count(), hot ? "; dense weights hot in L2" : "");
  for (const auto& shape : kShapes) {
    if (!shape.bench || (hot && (shape.experts || shape.N * shape.K * 2 > 30'000'000))) continue;
    if (only && !std::strstr(shape.name, only)) continue;
    const BenchCase c(shape, hot);
    const double bytes = c.bytes();
    for (const auto& [name, tuning] : variants(shape)) {
      cuda::set_gemv_tuning(tuning);
      const double us = graphed_us([&](int i) { c.launch(i); });
      std::printf("[bench] gemv %-30s %-22s %-12s %8.2f us %7.2f MB %5.2f TB/s\n", shape.name, name.c_str(),
                  describe(tuning).c_str(), us, bytes / 1e6, bytes / us / 1e6);
    }
    std::fflush(stdout);
  }
}

}  // namespace
}  // namespace ms
