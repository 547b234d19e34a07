// MLA prefill in the expanded form (flash_mla_expanded.cu) against the CPU op, which composes
// the absorbed ops: DeepSeek-V2-Lite's shape (16 heads, 512 + 64 latent, nope 128, v 128) and a
// V3-like 128 heads, BF16 and FP8-block kv_b, single prompts and batches of ragged sequences
// with cached prefixes (later chunks of a prompt), so both block heights run, each on the
// dispatch, on mma.sync and (on a Hopper) on wgmma (flash_mla_expanded_wgmma.cu), its 128-row
// blocks in every variant (the warp-specialized flash_mla_expanded_wgmma_ws.cu's "ws" and "ws64",
// the single-role "wg"); the attention alone on every kernel against the CPU's over explicitly
// built keys, at prompt lengths around the blocks and tiles, at 16 and 128 heads, and the
// variants against each other; MOESERVE_MLA_WGMMA=0 and MOESERVE_MLA_EXPANDED_VARIANT in the
// dispatch; the tiny test models' shape takes the general kernel over explicitly built keys.
// Also which steps the layer sends there. MOESERVE_MLA_EXPANDED_VARIANTS (comma-separated)
// limits the variants the cases run, to leave out one that fails or hangs.
// MlaPrefillBench times absorbed against expanded, MlaExpandedAttentionBench the attention on
// every kernel and variant, when MOESERVE_BENCH_MLA_PREFILL=1.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"
#include "layers/attention.h"

// From kernels/cuda/flash_prefill.h, whose launch structs need the CUDA headers' bf16.
namespace ms::cuda {
void mla_prefill_expanded_on(const Tensor& q, const Tensor& kv_cache, const ops::AttentionLayout& layout,
                             const ops::Weight& kv_b, int nope, int v, float scale, Tensor& out, bool wgmma,
                             std::string_view variant = {});
std::vector<std::string> mla_expanded_wgmma_variants();
void mla_expanded_attention(const Tensor& q, const Tensor& kv, const Tensor& rope, const ops::AttentionLayout& layout,
                            float scale, Tensor& out, bool wgmma, std::string_view variant = {});
}  // namespace ms::cuda

namespace ms {
namespace {
using namespace test;

// The wgmma variants of 128-row blocks the cases run: all, or those MOESERVE_MLA_EXPANDED_VARIANTS
// names (comma-separated).
std::vector<std::string> variants() {
  std::vector<std::string> all = cuda::mla_expanded_wgmma_variants(), picked;
  const char* env = std::getenv("MOESERVE_MLA_EXPANDED_VARIANTS");
  if (!env) return all;
  const std::string list = "," + std::string(env) + ",";
  for (const std::string& v : all)
    if (list.find("," + v + ",") != std::string::npos) picked.push_back(v);
  return picked;
}

// The ways a case runs: the op's dispatch, then each kernel explicitly (wgmma on a Hopper, in
// each variant).
enum class Kind { Dispatch, MmaSync, Wgmma };
struct Path {
  Kind kind;
  std::string variant;  // of Wgmma
};
std::vector<Path> paths() {
  std::vector<Path> r = {{Kind::Dispatch, ""}, {Kind::MmaSync, ""}};
  if (cuda::hopper())
    for (const std::string& v : variants()) r.push_back({Kind::Wgmma, v});
  return r;
}
std::string describe(const Path& r) {
  return r.kind == Kind::Dispatch ? "dispatch" : r.kind == Kind::MmaSync ? "mma.sync" : "wgmma " + r.variant;
}

using Seqs = std::vector<std::pair<int, int>>;  // (queries, keys) per sequence

std::string describe(const Seqs& seqs) {
  std::string s;
  for (auto [nq, nk] : seqs) s += " " + std::to_string(nq) + "/" + std::to_string(nk);
  return s;
}

// The worst relative error of one output row (a query head's values): one wrong row of thousands
// hardly moves the whole tensor's error. NaN (an unwritten row) propagates.
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

struct Shape3 {
  int64_t H, L, R;
  int nope, v;
};

// kv_b [H (nope + v), L] on both devices: BF16-exact values, or FP8 blocks.
struct KvB {
  ops::Weight cpu, gpu;
};
KvB make_kv_b(const Shape3& s, bool fp8) {
  const int64_t n = s.H * (s.nope + s.v);
  if (fp8) {
    auto w = random_fp8(n, s.L, 0.0004f);  // rms ~0.05, as the BF16 case
    return {w.cpu, w.gpu};
  }
  KvB w;
  w.cpu.w = randn({n, s.L}, 0.05f);
  w.gpu.w = gpu(w.cpu.w);
  return w;
}

void check(const Shape3& s, bool fp8, const std::vector<Seqs>& prompts) {
  const int64_t pool = 2048;
  Tensor cache = randn({pool, s.L + s.R}), cg = gpu(cache);
  const KvB kv_b = make_kv_b(s, fp8);
  for (const auto& seqs : prompts) {
    const auto layout = make_layout(seqs, int(pool));
    const int64_t T = layout.q_start.back();
    // q as the layer passes it: the view of q_b_proj's [T, H * (nope + R)] rows.
    Tensor q = randn({T, s.H, s.nope + s.R});
    Tensor ref = Tensor::empty(DType::F32, {T, s.H, s.v});
    cpu::mla_prefill_expanded(q, cache, layout, kv_b.cpu, s.nope, s.v, 0.06f, ref);
    const Tensor qg = gpu(q);
    for (const Path& run : paths()) {
      Tensor out = poisoned(DType::BF16, {T, s.H, s.v});
      if (run.kind == Kind::Dispatch) cuda::mla_prefill_expanded(qg, cg, layout, kv_b.gpu, s.nope, s.v, 0.06f, out);
      else
        cuda::mla_prefill_expanded_on(qg, cg, layout, kv_b.gpu, s.nope, s.v, 0.06f, out, run.kind == Kind::Wgmma,
                                      run.variant);
      const std::string what = std::to_string(s.H) + " heads, nope " + std::to_string(s.nope) +
                               (fp8 ? ", fp8 kv_b, " : ", bf16 kv_b, ") + describe(run) + ", q/k per sequence" +
                               describe(seqs);
      EXPECT_LT(rel_error(out, ref), 1e-2) << what;
      EXPECT_LT(worst_row_error(out, ref), 3e-2) << what;
    }
  }
}

// One prompt (128-row blocks), a batch with cached prefixes and one-query sequences (64-row
// blocks), a batch long enough for 128-row blocks with a second chunk in it, and a later chunk
// of a prompt alone (lengths off the 64- and 128-key tiles). Keys are gathered from shuffled
// cache slots.
const std::vector<Seqs> kV2Prompts = {
    {{300, 300}},
    {{100, 300}, {64, 64}, {257, 1000}, {16, 16}, {130, 130}, {1, 40}},
    {{512, 512}, {200, 700}},
    {{333, 1290}},
};

TEST(CudaMlaPrefill, V2LiteMatchesAbsorbedCpu) {
  MS_REQUIRE_CUDA();
  for (bool fp8 : {false, true}) check({16, 512, 64, 128, 128}, fp8, kV2Prompts);
}

TEST(CudaMlaPrefill, V3HeadsMatchAbsorbedCpu) {
  MS_REQUIRE_CUDA();
  // 64-row blocks; 128-row blocks on a prompt, on ragged sequences with a cached prefix, on a chunk.
  for (bool fp8 : {false, true})
    check({128, 512, 64, 128, 128}, fp8,
          {{{130, 200}, {70, 70}}, {{256, 256}}, {{200, 200}, {190, 450}}, {{141, 777}}});
}

// The attention alone (mla_expanded_attention) on every kernel against the CPU's over keys
// built explicitly (K_nope | k_rope per head), keys contiguous in the layout's order: prompt
// lengths around the 64- and 128-row blocks and the 64- and 128-key tiles, a batch with cached
// prefixes, chunks whose queries start mid-sequence, at V2-Lite's 16 heads and V3's 128. q is a
// head slice of wider rows and rope a column slice of the latent rows, as the op passes them; one
// case has a sharp softmax (q x 4). The wgmma variants also against each other: "ws64" runs the
// single-role "wg" kernel's 64-key tiles in its order, so bit for bit; "ws" groups keys by 128,
// so within bf16 rounding of P.
void check_attention(int64_t H, const Seqs& seqs, float q_scale) {
  const int64_t nope = 128, R = 64, v = 128, L = 512;
  int keys_total = 0;
  for (auto [nq, nk] : seqs) keys_total += nk;
  const auto layout = make_layout(seqs, keys_total, false);  // slot j is row j, as the kernels read keys
  const int64_t T = layout.q_start.back(), K = layout.kv_start.back();
  const Tensor kv = randn({K, H * (nope + v)}), lat = randn({K, L + R});
  const Tensor q_rows = randn({T, H + 2, nope + R}, q_scale), q = q_rows.slice(1, 0, H);
  Tensor keys = Tensor::empty(DType::F32, {K, H, nope + R});
  for (int64_t j = 0; j < K; ++j)
    for (int64_t h = 0; h < H; ++h) {
      float* dst = keys.data<float>() + (j * H + h) * (nope + R);
      std::memcpy(dst, kv.data<float>() + j * H * (nope + v) + h * (nope + v), nope * sizeof(float));
      std::memcpy(dst + nope, lat.data<float>() + j * (L + R) + L, R * sizeof(float));
    }
  const Tensor values = kv.view({K, H, nope + v}).slice(2, nope, nope + v).clone();
  Tensor ref = Tensor::empty(DType::F32, {T, H, v});
  cpu::attention(q, keys, values, layout, 0.072f, ref);
  const Tensor qg = gpu(q_rows).slice(1, 0, H), kvg = gpu(kv), latg = gpu(lat);
  const std::string shape = std::to_string(H) + " heads, q x " + std::to_string(q_scale) + ", q/k per sequence" +
                            describe(seqs);
  std::vector<std::pair<std::string, Tensor>> wgmma_outs;
  for (const Path& run : paths()) {
    if (run.kind == Kind::Dispatch) continue;  // the op's choice, checked through the op above
    Tensor out = poisoned(DType::BF16, {T, H, v});
    cuda::mla_expanded_attention(qg, kvg, latg.slice(1, L, L + R), layout, 0.072f, out, run.kind == Kind::Wgmma,
                                 run.variant);
    const std::string what = describe(run) + ", " + shape;
    EXPECT_LT(rel_error(out, ref), 1e-2) << what;
    EXPECT_LT(worst_row_error(out, ref), 3e-2) << what;
    if (run.kind == Kind::Wgmma) wgmma_outs.emplace_back(run.variant, out);
  }
  auto find = [&](std::string_view name) -> const Tensor* {
    for (const auto& [n, t] : wgmma_outs)
      if (n == name) return &t;
    return nullptr;
  };
  const Tensor* wg = find("wg");
  if (!wg) return;
  if (const Tensor* ws64 = find("ws64")) {
    EXPECT_TRUE(ws64->to_vector() == wg->to_vector()) << "ws64 against wg, " << shape;
  }
  if (const Tensor* ws = find("ws")) {
    EXPECT_LT(rel_error(*ws, *wg), 1e-2) << "ws against wg, " << shape;
    EXPECT_LT(worst_row_error(*ws, *wg), 3e-2) << "ws against wg, " << shape;
  }
}

TEST(CudaMlaPrefill, AttentionKernelsMatchCpu) {
  MS_REQUIRE_CUDA();
  const std::vector<std::pair<Seqs, float>> cases = {
      {{{1, 1}}, 1.f}, {{{16, 16}}, 1.f}, {{{63, 63}}, 1.f}, {{{64, 64}}, 1.f}, {{{65, 65}}, 1.f},
      {{{127, 127}}, 1.f}, {{{128, 128}}, 1.f}, {{{129, 129}}, 1.f}, {{{200, 200}}, 4.f}, {{{255, 255}}, 1.f},
      {{{256, 256}}, 1.f}, {{{257, 257}}, 1.f}, {{{1000, 1000}}, 1.f},
      {{{100, 300}, {64, 64}, {1, 50}, {257, 1000}, {16, 16}, {130, 130}}, 1.f},
      {{{130, 1200}}, 1.f}, {{{512, 2048}}, 1.f}, {{{77, 141}}, 1.f}, {{{300, 300}, {140, 333}}, 1.f},
  };
  for (const auto& [seqs, q_scale] : cases) check_attention(16, seqs, q_scale);
}

// V3's 128 heads: many more blocks of each tile, the same kernels (fewer cases: the CPU
// reference is 8x the work).
TEST(CudaMlaPrefill, AttentionKernelsMatchCpuV3Heads) {
  MS_REQUIRE_CUDA();
  for (const Seqs& seqs : std::vector<Seqs>{{{129, 129}}, {{300, 300}}, {{200, 700}, {131, 131}}, {{77, 141}}})
    check_attention(128, seqs, 1.f);
  check_attention(128, {{260, 260}}, 4.f);
}

// The op's dispatch: wgmma on a Hopper, mma.sync elsewhere and with MOESERVE_MLA_WGMMA=0 (read
// per call), bit for bit what the chosen kernel gives.
TEST(CudaMlaPrefill, DispatchFollowsEnv) {
  MS_REQUIRE_CUDA();
  const Shape3 s{16, 512, 64, 128, 128};
  const KvB kv_b = make_kv_b(s, false);
  const auto layout = make_layout({{300, 300}, {100, 200}}, 1024);
  const int64_t T = layout.q_start.back();
  const Tensor cache = gpu(randn({1024, s.L + s.R})), q = gpu(randn({T, s.H, s.nope + s.R}));
  auto run = [&](int kernel) {  // -1: the dispatch; 0 mma.sync; 1 wgmma
    Tensor out = poisoned(DType::BF16, {T, s.H, s.v});
    if (kernel < 0) cuda::mla_prefill_expanded(q, cache, layout, kv_b.gpu, s.nope, s.v, 0.06f, out);
    else cuda::mla_prefill_expanded_on(q, cache, layout, kv_b.gpu, s.nope, s.v, 0.06f, out, kernel == 1);
    return out.to_vector();
  };
  const char* old = std::getenv("MOESERVE_MLA_WGMMA");
  const std::string saved = old ? old : "";
  unsetenv("MOESERVE_MLA_WGMMA");
  const auto mma = run(0);
  EXPECT_TRUE(run(-1) == (cuda::hopper() ? run(1) : mma)) << "default dispatch";
  setenv("MOESERVE_MLA_WGMMA", "0", 1);
  EXPECT_TRUE(run(-1) == mma) << "MOESERVE_MLA_WGMMA=0";
  if (old) setenv("MOESERVE_MLA_WGMMA", saved.c_str(), 1);
  else unsetenv("MOESERVE_MLA_WGMMA");
}

// MOESERVE_MLA_EXPANDED_VARIANT picks the kernel of 128-row blocks where the call names none
// (the op's case), bit for bit the named variant; unset, the first (the default); an unknown
// name fails.
TEST(CudaMlaPrefill, VariantFromEnvironment) {
  MS_REQUIRE_CUDA();
  if (!cuda::hopper()) GTEST_SKIP() << "the wgmma kernels need a Hopper GPU";
  const Shape3 s{16, 512, 64, 128, 128};
  const KvB kv_b = make_kv_b(s, false);
  const auto layout = make_layout({{300, 300}, {100, 200}}, 1024);  // 128-row blocks
  const int64_t T = layout.q_start.back();
  const Tensor cache = gpu(randn({1024, s.L + s.R})), q = gpu(randn({T, s.H, s.nope + s.R}));
  auto run = [&](std::string_view variant) {  // empty: the op's choice
    Tensor out = poisoned(DType::BF16, {T, s.H, s.v});
    if (variant.empty()) cuda::mla_prefill_expanded(q, cache, layout, kv_b.gpu, s.nope, s.v, 0.06f, out);
    else cuda::mla_prefill_expanded_on(q, cache, layout, kv_b.gpu, s.nope, s.v, 0.06f, out, true, variant);
    return out.to_vector();
  };
  const char* old = std::getenv("MOESERVE_MLA_EXPANDED_VARIANT");
  const std::string saved = old ? old : "";
  unsetenv("MOESERVE_MLA_EXPANDED_VARIANT");
  const std::string first = cuda::mla_expanded_wgmma_variants().at(0);
  EXPECT_TRUE(run("") == run(first)) << "unset: " << first;
  for (const std::string& v : variants()) {
    setenv("MOESERVE_MLA_EXPANDED_VARIANT", v.c_str(), 1);
    EXPECT_TRUE(run("") == run(v)) << v;
  }
  setenv("MOESERVE_MLA_EXPANDED_VARIANT", "no-such-variant", 1);
  EXPECT_THROW(run(""), Error);
  if (old) setenv("MOESERVE_MLA_EXPANDED_VARIANT", saved.c_str(), 1);
  else unsetenv("MOESERVE_MLA_EXPANDED_VARIANT");
}

// The tiny fixtures' shape (kv_lora 64, rope 16, nope 32, v 32): the general kernel.
TEST(CudaMlaPrefill, OtherShapesMatchAbsorbedCpu) {
  MS_REQUIRE_CUDA();
  check({4, 64, 16, 32, 32}, false, {{{33, 33}}, {{300, 300}}, {{40, 90}, {50, 50}}});
}

// Prefills take the expanded form, from the fixtures' 33-token prompt up; decode and verify
// steps (few queries over long prefixes) and tiny prompts stay absorbed.
TEST(CudaMlaPrefill, LayerChoosesExpandedForPrefills) {
  const MlaDims v2{16, 512, 128, 64, 128, 0.1f}, tiny{4, 64, 32, 16, 32, 0.1f};
  auto layout = [](const Seqs& seqs) { return make_layout(seqs, 100000, false); };
  EXPECT_TRUE(MlaAttention::expanded_pays(layout({{300, 300}}), v2));
  EXPECT_TRUE(MlaAttention::expanded_pays(layout({{33, 33}}), tiny));
  EXPECT_TRUE(MlaAttention::expanded_pays(layout({{300, 300}}), tiny));
  EXPECT_TRUE(MlaAttention::expanded_pays(layout({{2048, 6144}}), v2));  // a later chunk of a long prompt
  EXPECT_FALSE(MlaAttention::expanded_pays(layout({{MlaAttention::kExpandedMinTokens - 1, 31}}), v2));
  EXPECT_FALSE(MlaAttention::expanded_pays(layout(Seqs(64, {1, 500})), v2));   // decode of 64 sequences
  EXPECT_FALSE(MlaAttention::expanded_pays(layout(Seqs(16, {4, 2000})), v2));  // verify
  EXPECT_FALSE(MlaAttention::expanded_pays(layout({{64, 30000}}), v2));       // a short chunk over a long prefix
  const MlaDims v3{128, 512, 128, 64, 128, 0.1f};
  EXPECT_TRUE(MlaAttention::expanded_pays(layout({{4096, 4096}}), v3));
  EXPECT_FALSE(MlaAttention::expanded_pays(layout({{8192, 24576}}), v3));  // more keys than the scratch cap
}

// Through MlaAttention at V2-Lite's attention shape (16 heads, no q_lora, hidden 256): a 200-token
// prompt, then a 150-token second chunk over it, both on the CPU (f32, bf16 rounding) and on the
// GPU, which takes the tensor-core expanded path for both steps.
TEST(CudaMlaPrefill, LayerOnGpuMatchesCpu) {
  MS_REQUIRE_CUDA();
  const int H = 16, L = 512, R = 64, nope = 128, v = 128, hidden = 256, slots = 512;
  const MlaDims dims{H, L, nope, R, v, 0.06f};
  const Tensor q_w = randn({H * (nope + R), hidden}, 0.06f), kv_a_w = randn({L + R, hidden}, 0.06f),
               kv_b_w = randn({H * (nope + v), L}, 0.05f), o_w = randn({hidden, H * v}, 0.03f);
  Tensor norm_w = randn({L}, 0.2f);
  for (auto& x : norm_w.span<float>()) x = round_bf16(1.0f + x);
  auto weights = [&](Device dev) {
    auto lin = [&](const Tensor& w) {
      ops::Weight wt;
      wt.w = dev == Device::CPU ? w.clone() : gpu(w);
      return Linear(wt);
    };
    MlaWeights w;
    w.q_proj = lin(q_w), w.kv_a_proj = lin(kv_a_w), w.kv_b_proj = lin(kv_b_w), w.o_proj = lin(o_w);
    w.kv_a_norm = RmsNorm(dev == Device::CPU ? norm_w.clone() : norm_w.to(Device::CUDA), 1e-6f);
    return w;
  };
  const RopeTable rope_cpu = RopeTable::build(R, 10000.0, 1024, true), rope_gpu = rope_cpu.to(Device::CUDA);
  MlaAttention cpu_layer(weights(Device::CPU), dims, &rope_cpu), gpu_layer(weights(Device::CUDA), dims, &rope_gpu);
  KvCache cpu_kv(1, MlaAttention::kv_shapes(dims), slots, DType::F32, Device::CPU);
  KvCache gpu_kv(1, MlaAttention::kv_shapes(dims), slots, DType::BF16, Device::CUDA);
  for (auto [start, n] : {std::pair{0, 200}, std::pair{200, 150}}) {
    ForwardBatch b;
    b.attn.q_start = {0, n}, b.attn.kv_start = {0, start + n};
    for (int i = 0; i < start + n; ++i) b.attn.kv_slots.push_back(slots - 1 - 3 * i % slots);  // scattered, distinct
    for (int i = start; i < start + n; ++i) {
      b.input_ids.push_back(0), b.positions.push_back(i);
      b.out_cache_loc.push_back(b.attn.kv_slots[size_t(i)]);
    }
    ASSERT_TRUE(MlaAttention::expanded_pays(b.attn, dims));
    const Tensor x = randn({n, hidden});
    const ForwardContext cpu_ctx{b, cpu_kv, true, nullptr, Device::CPU, DType::F32};
    const ForwardContext gpu_ctx{b, gpu_kv, false, nullptr, Device::CUDA, DType::BF16};
    const Tensor ref = cpu_layer.forward(x, 0, cpu_ctx), out = gpu_layer.forward(gpu(x), 0, gpu_ctx);
    EXPECT_LT(rel_error(out, ref), 2e-2) << "chunk at " << start;
    EXPECT_LT(worst_row_error(out, ref), 5e-2) << "chunk at " << start;
  }
}

// The whole attention of an MLA layer's prefill (from roped q to the heads' values) in both
// forms, eager as prefill runs: absorbed = mla_absorb_q + mla_attention (flash_mla.cu) +
// mla_expand_v; expanded = gather + kv_b GEMM + the 192/128 flash kernel. TFLOP/s counts each
// form's own mma work (causal pairs, plus the absorptions or the key expansion), so the speedup
// is the time ratio. Opt-in: MOESERVE_BENCH_MLA_PREFILL=1.
TEST(CudaMlaPrefill, MlaPrefillBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_MLA_PREFILL");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_MLA_PREFILL=1 to time MLA prefill";
  struct Case { int64_t H; int new_tokens, prefix; const char* name; };
  for (const Case& c : {Case{16, 4096, 0, "V2-Lite"}, Case{16, 8192, 0, "V2-Lite"}, Case{16, 4096, 4096, "V2-Lite"},
                        Case{128, 4096, 0, "V3"}}) {
    const int64_t H = c.H, L = 512, R = 64, nope = 128, v = 128, T = c.new_tokens, K = c.prefix + c.new_tokens;
    const auto layout = make_layout({{c.new_tokens, int(K)}}, int(K));
    Tensor cache = gpu(randn({K, L + R})), q = gpu(randn({T, H, nope + R}));
    ops::Weight kv_b;
    kv_b.w = gpu(randn({H * (nope + v), L}, 0.05f));
    Tensor out = poisoned(DType::BF16, {T, H, v});
    Tensor q_latent = poisoned(DType::BF16, {T, H, L}), o_latent = poisoned(DType::BF16, {T, H, L});
    const double pairs = double(T) * c.prefix + double(T) * (T + 1) / 2;
    const double absorbed_flop = 2.0 * H * (2 * L + R) * pairs + 2.0 * T * H * L * (nope + v);
    const double expanded_flop = 2.0 * H * (nope + R + v) * pairs + 2.0 * K * H * L * (nope + v);
    const double absorbed_ms = time_ms([&] {
      cuda::mla_absorb_q(q.slice(2, 0, nope), kv_b, nope, v, q_latent);
      cuda::mla_attention(q_latent, q.slice(2, nope, nope + R), cache, layout, 0.06f, o_latent);
      cuda::mla_expand_v(o_latent, kv_b, nope, v, out);
    }, 5);
    const double expanded_ms =
        time_ms([&] { cuda::mla_prefill_expanded(q, cache, layout, kv_b, nope, v, 0.06f, out); }, 5);
    std::printf("[bench] MLA prefill %s %lld heads, %d new tokens over %d cached: absorbed %.3f ms (%.0f TFLOP/s), "
                "expanded %.3f ms (%.0f TFLOP/s), %.2fx\n",
                c.name, (long long)H, c.new_tokens, c.prefix, absorbed_ms, absorbed_flop / absorbed_ms / 1e9,
                expanded_ms, expanded_flop / expanded_ms / 1e9, absorbed_ms / expanded_ms);
  }
}

// A [rows, cols] device tensor of bf16 normals, its first 512 rows repeated: timing inputs of a
// gigabyte without drawing a quarter of a billion numbers on the host.
Tensor gpu_random_rows(int64_t rows, int64_t cols) {
  const int64_t period = std::min<int64_t>(rows, 512);
  const Tensor seed = randn({period, cols});
  Tensor host = Tensor::empty(DType::F32, {rows, cols});
  for (int64_t r = 0; r < rows; r += period)
    std::memcpy(host.data<float>() + r * cols, seed.data<float>(), size_t(std::min(period, rows - r) * cols) * 4);
  return gpu(host);
}

// The expanded form's attention alone (mla_expanded_attention, keys already expanded) on mma.sync
// and (on a Hopper) wgmma in every variant: causal prompts of 4096 and 8192 tokens at V2-Lite's
// 16 heads and V3's 128 (128-row blocks), and 64 prompts of 100 tokens (64-row blocks, where the
// variants share one kernel). TFLOP/s counts 2 H (192 + 128) a visible (query, key) pair. Each
// case is timed twice and printed the second time: the first case's first round ran at a third
// of the speed (session 8), more than time_ms's two warm-up calls absorb. The case's line gives
// each kernel's speedup over mma.sync; `[bench] mla_variant=<name> case=<what> ms=<> tflops=<>`
// lines are there to pick the default from. Opt-in: MOESERVE_BENCH_MLA_PREFILL=1.
TEST(CudaMlaPrefill, MlaExpandedAttentionBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_MLA_PREFILL");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_MLA_PREFILL=1 to time MLA prefill";
  const int64_t Hmax = 128, Tmax = 8192, nope = 128, R = 64, v = 128;
  // The largest case's inputs; smaller ones are views (the kernels take row strides).
  const Tensor q_all = gpu_random_rows(Tmax, Hmax * (nope + R)).view({Tmax, Hmax, nope + R});
  const Tensor kv_all = gpu_random_rows(Tmax, Hmax * (nope + v)), rope_all = gpu_random_rows(Tmax, R);
  struct Case { int64_t H; Seqs seqs; std::string what; };
  const std::vector<Case> cases = {
      {16, {{4096, 4096}}, "V2-Lite, 4096 tokens"}, {16, {{8192, 8192}}, "V2-Lite, 8192 tokens"},
      {128, {{4096, 4096}}, "V3, 4096 tokens"},     {128, {{8192, 8192}}, "V3, 8192 tokens"},
      {16, Seqs(64, {100, 100}), "V2-Lite, 64 x 100 tokens"},
  };
  std::vector<Path> runs = {{Kind::MmaSync, ""}};
  if (cuda::hopper())
    for (const std::string& name : variants()) runs.push_back({Kind::Wgmma, name});
  for (const Case& c : cases) {
    int keys = 0;
    double pairs = 0;  // (query, visible key) pairs
    for (auto [nq, nk] : c.seqs) keys += nk, pairs += double(nq) * (nk - nq) + double(nq) * (nq + 1) / 2;
    const auto layout = make_layout(c.seqs, keys, false);
    const int64_t T = layout.q_start.back();
    const Tensor q = q_all.slice(0, 0, T).slice(1, 0, c.H), kv = kv_all.slice(0, 0, keys).slice(1, 0, c.H * (nope + v));
    const Tensor rope = rope_all.slice(0, 0, keys);
    Tensor out = poisoned(DType::BF16, {T, c.H, v});
    const double flop = 2.0 * c.H * (nope + R + v) * pairs;
    std::vector<double> ms(runs.size());
    for (int round = 0; round < 2; ++round)
      for (size_t i = 0; i < runs.size(); ++i)
        ms[i] = time_ms([&] {
          cuda::mla_expanded_attention(q, kv, rope, layout, 0.06f, out, runs[i].kind == Kind::Wgmma, runs[i].variant);
        }, 10);
    std::string line = "[bench] MLA expanded attention " + c.what + ", " + std::to_string(c.H) + " heads:";
    for (size_t i = 0; i < runs.size(); ++i) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s %s %.3f ms (%.0f TFLOP/s, %.2fx)", i ? "," : "", describe(runs[i]).c_str(),
                    ms[i], flop / ms[i] / 1e9, ms[0] / ms[i]);
      line += buf;
      if (runs[i].kind == Kind::Wgmma)
        std::printf("[bench] mla_variant=%s case=\"%s, %lld heads\" ms=%.3f tflops=%.0f\n", runs[i].variant.c_str(),
                    c.what.c_str(), (long long)c.H, ms[i], flop / ms[i] / 1e9);
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);  // lines so far survive a variant that hangs
  }
}

}  // namespace
}  // namespace ms
