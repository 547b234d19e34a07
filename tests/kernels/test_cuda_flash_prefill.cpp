// The tensor-core prefill attention (flash_prefill.cu) against the CPU op: causal prompts whose
// lengths fall around the 64- and 128-row blocks and the 64-key tiles, batches of sequences with
// a cached prefix, chunked prefill whose queries start mid-sequence, GQA groups of 8, 7 and 1,
// queries strided as the fused q/k/v projection leaves them, and keys on shuffled slots, on
// consecutive ones and on runs of them (gathered tiles, tensor-copy tiles, both in one
// sequence). Both block heights run on both
// kernels (mma.sync, and wgmma on a Hopper: flash_prefill_wgmma.cu, its 128-row blocks in every
// variant), and the dispatch through cuda::attention. Head dims other than 128 (DeepSeek's
// 192-dim keys with 128-dim values) are not the kernel's: they keep the CUDA-core kernel, checked
// here too; MLA prefill runs in the absorbed form (flash_mla.cu) and is checked at the V2-Lite
// shape.
// PrefillAttentionBench times 4096- and 8192-token prompts when MOESERVE_BENCH_PREFILL=1, each
// wgmma variant side by side.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"

// From kernels/cuda/flash_prefill.h, whose launch structs need the CUDA headers' bf16.
namespace ms::cuda {
bool flash_prefill_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out);
void flash_prefill_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows);
bool flash_prefill_wgmma_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out);
std::vector<std::string> flash_prefill_wgmma_variants();
void flash_prefill_wgmma_rows(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                              const ops::AttentionLayout& layout, float scale, Tensor& out, int block_rows,
                              std::string_view variant = {});
}  // namespace ms::cuda

namespace ms {
namespace {
using namespace test;

constexpr double kBf16Tol = 1e-2, kRowTol = 3e-2;

// The worst relative error of one output row (a query head's Dv values): a single wrong row of
// thousands hardly moves the whole tensor's error. NaN (an unwritten row) propagates.
double worst_row_error(const Tensor& out, const Tensor& ref) {
  const auto x = out.to_vector(), y = ref.to_vector();
  const int64_t dv = ref.size(ref.dim() - 1);
  double worst = 0;
  for (size_t r = 0; r * dv < y.size(); ++r) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < dv; ++i) {
      const double a = x[r * dv + i], b = y[r * dv + i];
      num += (a - b) * (a - b), den += b * b;
    }
    const double e = std::sqrt(num / std::max(den, 1e-30));
    if (!(e <= worst)) worst = e;
  }
  return worst;
}

// The wgmma variants the cases run: all, or those MOESERVE_FLASH_WGMMA_VARIANTS names
// (comma-separated), to leave out one that fails or hangs.
std::vector<std::string> variants() {
  std::vector<std::string> all = cuda::flash_prefill_wgmma_variants(), picked;
  const char* env = std::getenv("MOESERVE_FLASH_WGMMA_VARIANTS");
  if (!env) return all;
  const std::string list = "," + std::string(env) + ",";
  for (const std::string& v : all)
    if (list.find("," + v + ",") != std::string::npos) picked.push_back(v);
  return picked;
}

// The kernels a case runs: the dispatch (rows 0), then each kernel at both block heights, the
// wgmma one's 128-row blocks in each variant.
struct Kernel {
  bool wgmma;
  int rows;
  std::string variant;
};
std::vector<Kernel> kernels() {
  std::vector<Kernel> ks = {{false, 0, ""}, {false, 64, ""}, {false, 128, ""}};
  if (!cuda::hopper()) return ks;
  ks.push_back({true, 64, ""});
  for (const std::string& v : variants()) ks.push_back({true, 128, v});
  return ks;
}
void run_kernel(const Kernel& k, const Tensor& q, const Tensor& kc, const Tensor& vc,
                const ops::AttentionLayout& layout, float scale, Tensor& out) {
  if (k.rows == 0) cuda::attention(q, kc, vc, layout, scale, out);
  else if (k.wgmma) cuda::flash_prefill_wgmma_rows(q, kc, vc, layout, scale, out, k.rows, k.variant);
  else cuda::flash_prefill_rows(q, kc, vc, layout, scale, out, k.rows);
}
std::string describe(const Kernel& k) {
  if (k.rows == 0) return "dispatch";
  return std::string(k.wgmma ? "wgmma" : "mma.sync") + " " + std::to_string(k.rows) + "-row blocks" +
         (k.variant.empty() ? "" : " (" + k.variant + ")");
}

const std::vector<std::vector<std::pair<int, int>>> kPrompts = {
    {{1, 1}}, {{16, 16}}, {{63, 63}}, {{64, 64}}, {{65, 65}}, {{127, 127}}, {{128, 128}}, {{129, 129}},
    {{200, 200}}, {{1000, 1000}},
    {{100, 300}, {64, 64}, {1, 50}, {257, 1000}, {16, 16}, {130, 130}},  // a batch, some with cached prefixes
    {{130, 1200}}, {{512, 2048}}, {{77, 141}},                           // chunked prefill: queries start mid-sequence
};

std::string describe(const std::vector<std::pair<int, int>>& seqs) {
  std::string s;
  for (auto [nq, nk] : seqs) s += " " + std::to_string(nq) + "/" + std::to_string(nk);
  return s;
}

// The slots of a layout: shuffled one by one (every key tile a gather), in pool order (every
// whole key tile one box of the cache), or in runs of 150 consecutive slots at shuffled places
// (some tiles one box, some straddling two runs).
enum class Slots { Shuffled, Consecutive, Runs };
ops::AttentionLayout layout_with(const std::vector<std::pair<int, int>>& seqs, int pool, Slots slots) {
  if (slots != Slots::Runs) return make_layout(seqs, pool, slots == Slots::Shuffled);
  auto layout = make_layout(seqs, pool, false);
  std::vector<int32_t> starts;
  for (int s = 0; s + 150 <= pool; s += 150) starts.push_back(s);
  std::shuffle(starts.begin(), starts.end(), rng());
  for (size_t j = 0; j < layout.kv_slots.size(); ++j) layout.kv_slots[j] = starts.at(j / 150) + int32_t(j % 150);
  return layout;
}
const char* describe(Slots s) {
  return s == Slots::Shuffled ? "shuffled slots" : s == Slots::Consecutive ? "consecutive slots" : "runs of 150 slots";
}

// Query heads per KV head 8 (Qwen3-30B-A3B), 7 (Qwen2-57B-A14B) and 1; q is the head slice of a
// fused [T, Hq + 2 Hkv, D] projection, as GqaAttention passes it; a sharp softmax (q x 4) for
// one group stresses the online max. Qwen3's heads also with consecutive slots and runs of them
// (the tensor copies' boxes), where "n128ws" must equal "n128wscp" (every tile gathered) bit for bit.
TEST(CudaFlashPrefill, MatchesCpu) {
  MS_REQUIRE_CUDA();
  const int64_t D = 128, pool = 4096;
  struct Heads { int64_t hq, hkv; float q_scale; Slots slots; };
  for (auto [Hq, Hkv, q_scale, slots] : std::vector<Heads>{{32, 4, 1.f, Slots::Shuffled}, {32, 4, 1.f, Slots::Consecutive},
                                                          {32, 4, 1.f, Slots::Runs}, {28, 4, 1.f, Slots::Shuffled},
                                                          {8, 8, 4.f, Slots::Shuffled}}) {
    Tensor kc = randn({pool, Hkv, D}), vc = randn({pool, Hkv, D});
    Tensor kg = gpu(kc), vg = gpu(vc);
    for (const auto& seqs : kPrompts) {
      const auto layout = layout_with(seqs, int(pool), slots);
      const int64_t T = layout.q_start.back();
      Tensor qkv = randn({T, Hq + 2 * Hkv, D}, q_scale), q = qkv.slice(1, 0, Hq);
      Tensor qg = gpu(qkv).slice(1, 0, Hq);
      ASSERT_TRUE(cuda::flash_prefill_supported(qg, kg, vg, qg));
      ASSERT_TRUE(cuda::flash_prefill_wgmma_supported(qg, kg, vg, qg));
      Tensor ref = Tensor::empty(DType::F32, {T, Hq, D});
      cpu::attention(q, kc, vc, layout, 0.088f, ref);
      std::vector<std::pair<std::string, std::vector<float>>> variant_outs;
      for (const Kernel& k : kernels()) {
        Tensor out = poisoned(DType::BF16, {T, Hq, D});
        run_kernel(k, qg, kg, vg, layout, 0.088f, out);
        const std::string what = std::to_string(Hq) + "/" + std::to_string(Hkv) + " heads, " + describe(slots) + ", " +
                                 describe(k) + ", q/k per sequence" + describe(seqs);
        EXPECT_LT(rel_error(out, ref), kBf16Tol) << what;
        EXPECT_LT(worst_row_error(out, ref), kRowTol) << what;
        if (k.wgmma && k.rows == 128) variant_outs.emplace_back(k.variant, out.to_vector());
      }
      auto find = [&](std::string_view name) -> const std::vector<float>* {
        for (const auto& [n, v] : variant_outs)
          if (n == name) return &v;
        return nullptr;
      };
      if (const auto *ws = find("n128ws"), *cp = find("n128wscp"); ws && cp) {
        EXPECT_TRUE(*ws == *cp) << "n128ws against n128wscp, " << describe(slots) << describe(seqs);
      }
    }
  }
}

// MOESERVE_FLASH_WGMMA_VARIANT picks the variant of 128-row blocks where the call names none
// (the dispatch's case); an unknown name fails before any work.
TEST(CudaFlashPrefill, VariantFromEnvironment) {
  MS_REQUIRE_CUDA();
  if (!cuda::hopper()) GTEST_SKIP() << "the wgmma kernel needs a Hopper GPU";
  const int64_t Hq = 32, Hkv = 4, D = 128, pool = 512;
  Tensor kc = randn({pool, Hkv, D}), vc = randn({pool, Hkv, D}), q = randn({300, Hq, D});
  Tensor kg = gpu(kc), vg = gpu(vc), qg = gpu(q);
  const auto layout = make_layout({{300, 300}}, int(pool));
  Tensor ref = Tensor::empty(DType::F32, {300, Hq, D});
  cpu::attention(q, kc, vc, layout, 0.088f, ref);
  const char* saved = std::getenv("MOESERVE_FLASH_WGMMA_VARIANT");
  const std::string restore = saved ? saved : "";
  for (const std::string& v : variants()) {
    setenv("MOESERVE_FLASH_WGMMA_VARIANT", v.c_str(), 1);
    Tensor out = poisoned(DType::BF16, {300, Hq, D});
    cuda::attention(qg, kg, vg, layout, 0.088f, out);
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << v;
    EXPECT_LT(worst_row_error(out, ref), kRowTol) << v;
  }
  setenv("MOESERVE_FLASH_WGMMA_VARIANT", "no-such-variant", 1);
  Tensor out = poisoned(DType::BF16, {300, Hq, D});
  EXPECT_THROW(cuda::flash_prefill_wgmma_rows(qg, kg, vg, layout, 0.088f, out, 128), Error);
  if (saved) setenv("MOESERVE_FLASH_WGMMA_VARIANT", restore.c_str(), 1);
  else unsetenv("MOESERVE_FLASH_WGMMA_VARIANT");
}

// DeepSeek's unabsorbed shape (192-dim q/k, 128-dim v) is not the tensor-core kernel's; the
// dispatch must leave it to the CUDA-core kernel, which still matches.
TEST(CudaFlashPrefill, OtherHeadDimsKeepTheGeneralKernel) {
  MS_REQUIRE_CUDA();
  const int64_t H = 16, Dk = 192, Dv = 128, pool = 1024;
  Tensor kc = randn({pool, H, Dk}), vc = randn({pool, H, Dv});
  Tensor kg = gpu(kc), vg = gpu(vc);
  for (const auto& seqs : std::vector<std::vector<std::pair<int, int>>>{{{200, 200}}, {{70, 300}, {65, 65}}}) {
    const auto layout = make_layout(seqs, int(pool));
    const int64_t T = layout.q_start.back();
    Tensor q = randn({T, H, Dk}), qg = gpu(q);
    Tensor out = poisoned(DType::BF16, {T, H, Dv});
    EXPECT_FALSE(cuda::flash_prefill_supported(qg, kg, vg, out));
    Tensor ref = Tensor::empty(DType::F32, {T, H, Dv});
    cpu::attention(q, kc, vc, layout, 0.072f, ref);
    cuda::attention(qg, kg, vg, layout, 0.072f, out);
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << describe(seqs);
    EXPECT_LT(worst_row_error(out, ref), kRowTol) << describe(seqs);
  }
}

// MLA prefill at DeepSeek-V2-Lite's shape (16 heads over the 512 + 64 latent cache).
TEST(CudaFlashPrefill, MlaPrefillMatchesCpu) {
  MS_REQUIRE_CUDA();
  const int64_t H = 16, L = 512, R = 64, pool = 2048;
  Tensor cache = randn({pool, L + R}), cg = gpu(cache);
  for (const auto& seqs : std::vector<std::vector<std::pair<int, int>>>{{{65, 65}}, {{300, 300}, {130, 1200}}}) {
    const auto layout = make_layout(seqs, int(pool));
    const int64_t T = layout.q_start.back();
    Tensor ql = randn({T, H, L}, 0.3f), qr = randn({T, H, R});
    Tensor ref = Tensor::empty(DType::F32, {T, H, L});
    cpu::mla_attention(ql, qr, cache, layout, 0.06f, ref);
    Tensor out = poisoned(DType::BF16, {T, H, L});
    cuda::mla_attention(gpu(ql), gpu(qr), cg, layout, 0.06f, out);
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << describe(seqs);
    EXPECT_LT(worst_row_error(out, ref), kRowTol) << describe(seqs);
  }
}

// One causal prompt of T tokens: the Qwen3-30B-A3B shape (32/4 heads of 128) through both block
// heights of both kernels (wgmma on a Hopper, its 128-row blocks in each variant, printed as
// `[bench] variant=<name> T=<tokens> <slots> ms=<> tflops=<>` lines to pick the default from),
// its keys on shuffled slots and on consecutive ones (a fresh pool's prefill), and the
// dispatch (MOESERVE_FLASH_WGMMA=0 keeps it on mma.sync, MOESERVE_FLASH_WGMMA_VARIANT picks), and
// DeepSeek-V2-Lite's absorbed MLA (16 heads, 576-dim keys, 512-dim values; flash_mla.cu) for
// comparison. TFLOP/s counts the causal triangle's mma work only.
// Opt-in (timing, not a check): MOESERVE_BENCH_PREFILL=1.
TEST(CudaFlashPrefill, PrefillAttentionBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_PREFILL");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_PREFILL=1 to time prefill attention";
  for (int T : {4096, 8192}) {
    const double pairs = double(T) * (T + 1) / 2;  // (query, visible key) pairs
    for (Slots slots : {Slots::Shuffled, Slots::Consecutive}) {
      const auto layout = make_layout({{T, T}}, T, slots == Slots::Shuffled);
      const int64_t Hq = 32, Hkv = 4, D = 128;
      Tensor k = gpu(randn({T, Hkv, D})), v = gpu(randn({T, Hkv, D})), q = gpu(randn({T, Hq, D}));
      Tensor out = poisoned(DType::BF16, {T, Hq, D});
      const double flop = 4.0 * Hq * D * pairs;
      for (const Kernel& kern : kernels()) {
        const double ms = time_ms([&] { run_kernel(kern, q, k, v, layout, 0.088f, out); }, 20);
        if (!kern.variant.empty())
          std::printf("[bench] variant=%s T=%d %s ms=%.3f tflops=%.0f\n", kern.variant.c_str(), T, describe(slots), ms,
                      flop / ms / 1e9);
        else
          std::printf("[bench] prefill GQA 32/4 heads x 128, %d tokens, %s, %s: %.3f ms, %.0f TFLOP/s\n", T,
                      describe(slots), describe(kern).c_str(), ms, flop / ms / 1e9);
        std::fflush(stdout);  // lines so far survive a variant that hangs
      }
    }
    {
      const auto layout = make_layout({{T, T}}, T);
      const int64_t H = 16, L = 512, R = 64;
      Tensor cache = gpu(randn({T, L + R})), ql = gpu(randn({T, H, L}, 0.3f)), qr = gpu(randn({T, H, R}));
      Tensor out = poisoned(DType::BF16, {T, H, L});
      const double flop = 2.0 * H * (L + R + L) * pairs;
      const double ms = time_ms([&] { cuda::mla_attention(ql, qr, cache, layout, 0.06f, out); }, 10);
      std::printf("[bench] prefill MLA 16 heads (V2-Lite, absorbed), %d tokens: %.3f ms, %.0f TFLOP/s\n", T, ms,
                  flop / ms / 1e9);
    }
  }
}

}  // namespace
}  // namespace ms
