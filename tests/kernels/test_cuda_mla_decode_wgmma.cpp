// The Hopper MLA decode kernel (flash_mla_wgmma.cu, 64 heads a block on warpgroup MMAs) through
// cuda::mla_attention, against the CPU op and against the mma.sync kernel it replaces
// (flash_mla.cu, MOESERVE_MLA_DECODE_WGMMA=0): DeepSeek-V3's 128 heads and a TP-sharded 64, 1, 3
// (one of them two causal queries of one sequence) and 64 queries, contexts around the 64-key
// tile and long ones (one split and many), shuffled slots, eager and replayed from a captured
// step. MlaDecodeWgmmaBench times both kernels when MOESERVE_BENCH_MLA_DECODE=1.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"

// From kernels/cuda/flash_prefill.h, whose launch structs need the CUDA headers' bf16.
namespace ms::cuda {
bool use_flash_mla_wgmma(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const Tensor& out);
int flash_mla_wgmma_decode_splits(int64_t T, int64_t H, int max_visible);
}  // namespace ms::cuda

namespace ms {
namespace {
using namespace test;

constexpr double kBf16Tol = 1e-2;
constexpr int64_t kL = 512, kR = 64;

// Sets MOESERVE_MLA_DECODE_WGMMA for the scope (read at every call).
struct WgmmaSwitch {
  explicit WgmmaSwitch(bool on) { setenv("MOESERVE_MLA_DECODE_WGMMA", on ? "1" : "0", 1); }
  ~WgmmaSwitch() { unsetenv("MOESERVE_MLA_DECODE_WGMMA"); }
};

#define MS_REQUIRE_HOPPER()                                                \
  do {                                                                     \
    MS_REQUIRE_CUDA();                                                     \
    if (!cuda::hopper()) GTEST_SKIP() << "the wgmma kernel needs a Hopper"; \
  } while (0)

// T decode queries at `keys` keys: T = 3 is a decode and a sequence of two causal queries (they
// see keys - 1 and keys of its keys + 1); more are decodes of unequal lengths.
std::vector<std::pair<int, int>> decode_seqs(int T, int keys) {
  if (T == 3) return {{1, keys}, {2, keys + 1}};
  std::vector<std::pair<int, int>> seqs;
  for (int i = 0; i < T; ++i) seqs.push_back({1, std::max(1, keys - (i % 7) * (keys / 16))});
  return seqs;
}

// Queries as MlaAttention passes them: q_rope a slice of the [T, H, 128 + 64] projection.
struct Queries {
  Tensor ql, qr, ql_gpu, qr_gpu;
  Queries(int64_t T, int64_t H) {
    ql = randn({T, H, kL}, 0.3f);
    Tensor qfull = randn({T, H, 128 + kR});
    qr = qfull.slice(2, 128, 128 + kR);
    ql_gpu = gpu(ql), qr_gpu = gpu(qfull).slice(2, 128, 128 + kR);
  }
};

TEST(CudaOps, MlaDecodeWgmmaMatchesCpuAndMmaSync) {
  MS_REQUIRE_HOPPER();
  const int64_t pool = 64 * 4096;
  Tensor cache = randn({pool, kL + kR}), cg = gpu(cache);
  for (int64_t H : {128, 64})
  for (int T : {1, 3, 64})
  for (int keys : {1, 63, 64, 65, 1000, 4096}) {
    const auto layout = make_layout(decode_seqs(T, keys), int(pool));
    Queries q(T, H);
    Tensor ref = Tensor::empty(DType::F32, {T, H, kL});
    cpu::mla_attention(q.ql, q.qr, cache, layout, 0.06f, ref);
    Tensor out = poisoned(DType::BF16, {T, H, kL}), old = poisoned(DType::BF16, {T, H, kL});
    {
      WgmmaSwitch on(true);
      ASSERT_TRUE(cuda::use_flash_mla_wgmma(q.ql_gpu, q.qr_gpu, cg, out));
      cuda::mla_attention(q.ql_gpu, q.qr_gpu, cg, layout, 0.06f, out);
    }
    {
      WgmmaSwitch off(false);
      ASSERT_FALSE(cuda::use_flash_mla_wgmma(q.ql_gpu, q.qr_gpu, cg, old));
      cuda::mla_attention(q.ql_gpu, q.qr_gpu, cg, layout, 0.06f, old);
    }
    const std::string what = std::to_string(H) + " heads, " + std::to_string(T) + " queries, " +
                             std::to_string(keys) + " keys, " +
                             std::to_string(cuda::flash_mla_wgmma_decode_splits(T, H, keys + 1)) + " splits";
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << what;
    EXPECT_LT(rel_error(out, old.to_f32()), kBf16Tol) << what << " (against flash_mla.cu)";
  }
}

// Captured steps: the splits come from max_kv alone and every query divides its own keys over
// them (split_len 0), so replays with other lengths leave some splits empty and others partial.
// T = 3 takes many splits (captured at 4096 keys) and few (256); T = 64 at 128 heads one split,
// at 64 heads two.
TEST(CudaOps, CapturedMlaDecodeWgmmaMatchesCpu) {
  MS_REQUIRE_HOPPER();
  WgmmaSwitch on(true);
  const int64_t pool = 64 * 4096;
  Tensor cache = randn({pool, kL + kR}), cg = gpu(cache);
  for (int64_t H : {128, 64})
  for (auto [T, max_kv] : std::vector<std::pair<int, int>>{{3, 4096}, {3, 256}, {64, 1536}}) {
    Queries q(T, H);
    Tensor out = poisoned(DType::BF16, {T, H, kL});
    const std::vector<int32_t> ids(size_t(T), 0);
    const auto captured = make_layout(std::vector<std::pair<int, int>>(size_t(T), {1, max_kv}), int(pool));
    auto body = [&] { cuda::mla_attention(q.ql_gpu, q.qr_gpu, cg, captured, 0.06f, out); };
    body();  // eagerly first, as the runner does: shared-memory limits, allocations
    auto graph_pool = ops::make_graph_pool(Device::CUDA);
    auto graph = ops::capture_step(Device::CUDA, ops::StepArrays{ids, ids, ids, &captured}, int64_t(T) * max_kv,
                                   max_kv, *graph_pool, body);
    for (int variant = 0; variant < 3; ++variant) {
      std::vector<std::pair<int, int>> seqs;
      for (int i = 0; i < T; ++i) {
        const int lens[3] = {i == 0 ? 50 : max_kv / (i + 1), max_kv, 1 + (i * 37 + 16) % 65};
        seqs.push_back({1, lens[variant]});
      }
      const auto layout = make_layout(seqs, int(pool));
      graph->replay(ops::StepArrays{ids, ids, ids, &layout});
      Tensor ref = Tensor::empty(DType::F32, {T, H, kL});
      cpu::mla_attention(q.ql, q.qr, cache, layout, 0.06f, ref);
      EXPECT_LT(rel_error(out, ref), kBf16Tol)
          << H << " heads, " << T << " queries captured at " << max_kv << ", replay " << variant;
    }
  }
}

// µs a call of `call(i)` replayed from a captured step of 20 calls over `layout`, staged as a
// decode step's arrays (graphed_us stages a layout of its own, and would copy this one's slots
// as constants: more than the step's pinned buffer holds at 256 x 1536 keys).
template <class F>
double step_us(const ops::AttentionLayout& layout, int max_kv, F call) {
  constexpr int kPerGraph = 20;
  const std::vector<int32_t> ids(size_t(layout.q_start.back()), 0);
  const ops::StepArrays arrays{ids, ids, ids, &layout};
  auto body = [&] {
    for (int i = 0; i < kPerGraph; ++i) call(i);
  };
  body();
  auto graph_pool = ops::make_graph_pool(Device::CUDA);
  auto graph = ops::capture_step(Device::CUDA, arrays, int64_t(layout.kv_slots.size()), max_kv, *graph_pool, body);
  return 1000.0 * stream_ms([&] { graph->replay(arrays); }, 50, 5) / kPerGraph;
}

// µs a call of decode MLA (kernel and split merge), graphed, at DeepSeek-V3's 128 heads: the
// wgmma kernel against flash_mla.cu. TFLOP/s counts 2 H (576 + 512) a (query, key), GB/s the
// latent cache once. Each call reads another copy of the cache, slots shuffled, and the copies
// a graph's 20 calls read exceed the 50 MB L2. Opt-in: MOESERVE_BENCH_MLA_DECODE=1.
TEST(CudaOps, MlaDecodeWgmmaBench) {
  MS_REQUIRE_HOPPER();
  const char* env = std::getenv("MOESERVE_BENCH_MLA_DECODE");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_MLA_DECODE=1 to time MLA decode";
  const int64_t H = 128;
  for (auto [T, keys] : std::vector<std::pair<int, int>>{{1, 4096}, {64, 512}, {64, 1536}, {256, 1536}}) {
    const int64_t slots = int64_t(T) * keys;
    const double bytes = double(slots) * (kL + kR) * 2, flops = double(slots) * 2 * H * (kL + kR + kL);
    const int views = std::max(2, int(std::ceil(160e6 / bytes)));
    Tensor host = Tensor::empty(DType::BF16, {views * slots, kL + kR});
    uint32_t x = 12345;  // small finite values
    for (auto& v : host.span<uint16_t>()) x = x * 1664525u + 1013904223u, v = uint16_t(0x3c00 | ((x >> 16) & 0x83ff));
    Tensor dev = host.to(Device::CUDA);
    const auto layout = make_layout(std::vector<std::pair<int, int>>(size_t(T), {1, keys}), int(slots));
    Queries q(T, H);
    Tensor out = poisoned(DType::BF16, {T, H, kL});
    double us[2];
    for (bool wgmma : {true, false}) {
      WgmmaSwitch sw(wgmma);
      us[wgmma] = step_us(layout, keys, [&](int i) {
        const int64_t v = i % views;
        cuda::mla_attention(q.ql_gpu, q.qr_gpu, dev.slice(0, v * slots, (v + 1) * slots), layout, 0.06f, out);
      });
      std::printf("[bench] MLA decode %s, 128 heads, T=%d, %d keys: %.2f us, %.1f TFLOP/s, %.0f GB/s\n",
                  wgmma ? "wgmma" : "mma.sync", T, keys, us[wgmma], flops / us[wgmma] / 1e6, bytes / us[wgmma] / 1e3);
    }
    std::printf("[bench] MLA decode, 128 heads, T=%d, %d keys: wgmma %.2fx faster than mma.sync\n", T, keys, us[0] / us[1]);
  }
}

}  // namespace
}  // namespace ms
