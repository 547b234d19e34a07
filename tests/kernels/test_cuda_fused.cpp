// The fused CUDA ops (residual add + RMSNorm; rope + KV-cache write for GQA, with Qwen3's q/k
// norms, and MLA; projections concatenated into one linear) against
// their CPU ops, and the fused add + norm against the separate CUDA steps it replaces (the same
// bits: both store the sum in bf16 and normalise the stored value). Inputs are bf16-exact; the
// CPU computes in f32, so the bound is bf16 output rounding: relative error below 1e-2.
#include <algorithm>
#include <tuple>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "layers/linear.h"
#include "layers/rope.h"

namespace ms {
namespace {
using namespace test;

constexpr double kBf16Tol = 1e-2;

std::vector<int32_t> random_positions(int64_t T, int32_t max) {
  std::vector<int32_t> pos(static_cast<size_t>(T));
  std::uniform_int_distribution<int32_t> pp(0, max - 1);
  for (auto& p : pos) p = pp(rng());
  return pos;
}

// T distinct slots out of `slots`, in no order (a batch's tokens land anywhere in the pool).
std::vector<int32_t> random_slots(int64_t T, int64_t slots) {
  std::vector<int32_t> all(static_cast<size_t>(slots));
  for (int64_t i = 0; i < slots; ++i) all[size_t(i)] = int32_t(i);
  std::shuffle(all.begin(), all.end(), rng());
  return {all.begin(), all.begin() + T};
}

// Rows of a cache [slots, ...] as an F32 host tensor [n, width].
Tensor cache_rows(const Tensor& cache, const std::vector<int32_t>& rows) {
  Tensor h = cache.to_f32(), flat = h.view({h.size(0), h.numel() / h.size(0)});
  Tensor out = Tensor::empty(DType::F32, {int64_t(rows.size()), flat.size(1)});
  cpu::gather_rows(flat, rows, out);
  return out;
}
std::vector<int32_t> other_rows(const std::vector<int32_t>& slots, int64_t n) {
  std::vector<int32_t> rest;
  for (int32_t r = 0; r < n; ++r)
    if (std::find(slots.begin(), slots.end(), r) == slots.end()) rest.push_back(r);
  return rest;
}

// Widths of every kernel path: the 16-byte row groups (part of a warp, a block, two pieces a
// thread) and the block-a-row fallback (a column slice at an odd offset; F32; an F32 addend).
TEST(CudaFused, AddRmsNormMatchesCpuAndTheSeparateSteps) {
  MS_REQUIRE_CUDA();
  for (auto [T, D] : std::vector<std::pair<int64_t, int64_t>>{{1, 2048}, {1, 7168}, {33, 7168}, {7, 128},
                                                               {5, 16384}, {3, 1536}}) {
    Tensor x = randn({T, D}, 2.0f), y = randn({T, D}), w = randn({D}, 0.5f);
    Tensor rx = x.clone(), ref = Tensor::empty(DType::F32, {T, D});
    cpu::add_rms_norm(rx, y, w, 1e-6f, ref);
    Tensor xg = gpu(x), yg = gpu(y), out = poisoned(DType::BF16, {T, D});
    cuda::add_rms_norm(xg, yg, gpu(w), 1e-6f, out);
    EXPECT_LT(rel_error(xg, rx), kBf16Tol) << T << " x " << D << ": residual";
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << T << " x " << D;
    Tensor sx = gpu(x), sout = poisoned(DType::BF16, {T, D});
    cuda::add_inplace(sx, yg);
    cuda::rms_norm(sx, gpu(w), 1e-6f, sout);
    EXPECT_EQ(rel_error(xg, sx), 0.0) << T << " x " << D << ": residual differs from add_inplace";
    EXPECT_EQ(rel_error(out, sout), 0.0) << T << " x " << D << ": differs from add_inplace + rms_norm";
    Tensor ax = gpu(x), ay = gpu(y);  // out written over the addend; an F32 weight
    cuda::add_rms_norm(ax, ay, gpu(w, DType::F32), 1e-6f, ay);
    EXPECT_LT(rel_error(ay, ref), kBf16Tol) << T << " x " << D << ": out = y";
  }
  const int64_t T = 9, D = 1000;
  Tensor x = randn({T, D + 3}, 2.0f), y = randn({T, D}), w = randn({D}, 0.5f);
  Tensor xs = x.slice(1, 3, 3 + D).clone(), ref = Tensor::empty(DType::F32, {T, D});
  cpu::add_rms_norm(xs, y, w, 1e-6f, ref);
  Tensor xg = gpu(x), view = xg.slice(1, 3, 3 + D), out = poisoned(DType::BF16, {T, D});
  cuda::add_rms_norm(view, gpu(y, DType::F32), gpu(w), 1e-6f, out);
  EXPECT_LT(rel_error(out, ref), kBf16Tol) << "column slice, F32 addend";
  EXPECT_EQ(rel_error(host_block(xg, 0, 3), x.slice(1, 0, 3).clone()), 0.0) << "columns outside the slice";
  Tensor x32 = gpu(x.slice(1, 3, 3 + D).clone(), DType::F32), out32 = poisoned(DType::F32, {T, D});
  cuda::add_rms_norm(x32, gpu(y, DType::F32), gpu(w), 1e-6f, out32);
  EXPECT_LT(rel_error(out32, ref), 1e-5) << "F32";
}

struct GqaCase {
  int64_t T, hq, hkv, D;
  int rot_dim;
  bool interleaved;
};

// Qwen3-style heads (NeoX, 128 dims), several KV heads, interleaved and partial rotary, batch 1
// and a prefill's tokens; q is a strided view (heads padded), slots scattered over the pool.
// Wide heads fill a lane's registers: 256 dims all rotary (4 pairs a lane), and 320 with 64
// rotary (8 unrotated dims a lane, the most; the value head's last 64 dims past the batch of
// registers it is loaded in).
TEST(CudaFused, RopeStoreKvMatchesCpu) {
  MS_REQUIRE_CUDA();
  for (GqaCase c : {GqaCase{1, 32, 4, 128, 128, false}, GqaCase{40, 32, 4, 128, 128, false},
                    GqaCase{17, 16, 8, 128, 128, true}, GqaCase{5, 8, 2, 128, 64, false},
                    GqaCase{3, 4, 4, 64, 64, true}, GqaCase{3, 8, 2, 256, 256, false},
                    GqaCase{2, 4, 2, 320, 64, true},
                    // The 16-byte kernel (BF16, 128 dims, NeoX over all, 16+ tokens), with heads
                    // of a token that do not fill its last chunk of four (12 + 2).
                    GqaCase{300, 12, 2, 128, 128, false}, GqaCase{64, 32, 4, 128, 128, false}}) {
    const std::string name = std::to_string(c.T) + " tokens, " + std::to_string(c.hq) + "/" +
                             std::to_string(c.hkv) + " heads of " + std::to_string(c.D) + ", rot " +
                             std::to_string(c.rot_dim) + (c.interleaved ? " interleaved" : " neox");
    const int64_t S = std::max<int64_t>(64, 2 * c.T);
    RopeTable host = RopeTable::build(c.rot_dim, 1e6, 4096, c.interleaved), dev = host.to(Device::CUDA);
    const auto pos = random_positions(c.T, 4096);
    const auto slots = random_slots(c.T, S);
    Tensor qpad = randn({c.T, c.hq, c.D + 32}), k = randn({c.T, c.hkv, c.D}), v = randn({c.T, c.hkv, c.D});
    Tensor kc0 = randn({S, c.hkv, c.D}), vc0 = randn({S, c.hkv, c.D});
    Tensor qr = qpad.slice(2, 0, c.D).clone(), kcr = kc0.clone(), vcr = vc0.clone();
    cpu::rope_store_kv(qr, k, v, host.at(pos), slots, false, kcr, vcr, nullptr);

    Tensor qg_pad = gpu(qpad), qg = qg_pad.slice(2, 0, c.D), kc = gpu(kc0), vc = gpu(vc0);
    Tensor kg = gpu(k), vg = gpu(v);
    cuda::rope_store_kv(qg, kg, vg, dev.at(pos), slots, false, kc, vc, nullptr);
    Tensor qh = qg_pad.to_f32();  // a strided device view cannot be copied out by itself
    EXPECT_LT(rel_error(qh.slice(2, 0, c.D).clone(), qr), kBf16Tol) << name << ": q";
    EXPECT_EQ(rel_error(qh.slice(2, c.D, c.D + 32).clone(), qpad.slice(2, c.D, c.D + 32).clone()), 0.0)
        << name << ": q's padding";
    EXPECT_LT(rel_error(cache_rows(kc, slots), cache_rows(kcr, slots)), kBf16Tol) << name << ": keys";
    EXPECT_EQ(rel_error(cache_rows(vc, slots), cache_rows(vcr, slots)), 0.0) << name << ": values";
    const auto rest = other_rows(slots, S);
    EXPECT_EQ(rel_error(cache_rows(kc, rest), cache_rows(kc0, rest)), 0.0) << name << ": other key slots";
    EXPECT_EQ(rel_error(cache_rows(vc, rest), cache_rows(vc0, rest)), 0.0) << name << ": other value slots";
    EXPECT_EQ(rel_error(kg, k), 0.0) << name << ": k is an input only";
  }
}

// Qwen3 at TP 1 on one [T, 32 + 2 x 4 heads, 128] projection: q, k and v are head slices of it
// (strided tokens), q and k normalised per head before the rope; bf16 and F32 norm weights.
TEST(CudaFused, RopeStoreKvWithHeadNormsOnFusedProjection) {
  MS_REQUIRE_CUDA();
  const int64_t Hq = 32, Hkv = 4, D = 128, S = 1024, W = (Hq + 2 * Hkv) * D;
  // Full NeoX rotary (Qwen3), and a partial interleaved one: the norm covers the unrotated dims.
  for (auto [T, wdt, rot, interleaved] : std::vector<std::tuple<int64_t, DType, int, bool>>{
           {1, DType::BF16, 128, false}, {23, DType::F32, 128, false}, {4, DType::BF16, 64, true},
           {301, DType::BF16, 128, false}}) {
    RopeTable host = RopeTable::build(rot, 1e6, 4096, interleaved), dev = host.to(Device::CUDA);
    const auto pos = random_positions(T, 4096);
    const auto slots = random_slots(T, S);
    Tensor qkv = randn({T, W}), wq = randn({D}, 0.5f), wk = randn({D}, 0.5f), c0 = randn({S, Hkv, D});
    Tensor heads = qkv.clone().view({T, Hq + 2 * Hkv, D});
    Tensor qr = heads.slice(1, 0, Hq), kcr = c0.clone(), vcr = c0.clone();
    const ops::HeadNorm hn{wq, wk, 1e-6f};
    cpu::rope_store_kv(qr, heads.slice(1, Hq, Hq + Hkv), heads.slice(1, Hq + Hkv, Hq + 2 * Hkv), host.at(pos), slots,
                       false, kcr, vcr, &hn);
    // Both kernels: the 16-byte one (16+ tokens of 128-dim NeoX heads) and, turned off, the warp-a-head one.
    for (const char* x8 : {"1", "0"}) {
      setenv("MOESERVE_ROPE_X8", x8, 1);
      const std::string name = std::to_string(T) + " tokens, MOESERVE_ROPE_X8=" + x8;
      Tensor g = gpu(qkv).view({T, Hq + 2 * Hkv, D}), kc = gpu(c0), vc = gpu(c0);
      Tensor qg = g.slice(1, 0, Hq), wqg = gpu(wq, wdt), wkg = gpu(wk, wdt);
      const ops::HeadNorm gn{wqg, wkg, 1e-6f};
      cuda::rope_store_kv(qg, g.slice(1, Hq, Hq + Hkv), g.slice(1, Hq + Hkv, Hq + 2 * Hkv), dev.at(pos), slots, false, kc,
                          vc, &gn);
      Tensor gh = g.to_f32();
      EXPECT_LT(rel_error(gh.slice(1, 0, Hq).clone(), qr.clone()), kBf16Tol) << name << ": q";
      EXPECT_LT(rel_error(cache_rows(kc, slots), cache_rows(kcr, slots)), kBf16Tol) << name << ": keys";
      EXPECT_EQ(rel_error(cache_rows(vc, slots), cache_rows(vcr, slots)), 0.0) << name << ": values";
      EXPECT_EQ(rel_error(gh.slice(1, Hq, Hq + 2 * Hkv).clone(), heads.slice(1, Hq, Hq + 2 * Hkv).clone()), 0.0)
          << name << ": k and v are inputs only";
    }
    unsetenv("MOESERVE_ROPE_X8");
  }
}

// The concatenated q/k/v (or q_a/kv_a) weight on the GPU: each column slice of its output is
// that part's linear (bf16 and FP8 blocks, decode and prefill row counts, a bias).
TEST(CudaFused, ConcatenatedLinearMatchesItsParts) {
  MS_REQUIRE_CUDA();
  const int64_t K = 1024;
  for (bool fp8 : {false, true})
    for (int64_t T : {1, 4, 64}) {
      std::vector<Linear> parts;
      for (int64_t rows : {512, 128, 72}) {
        ops::Weight w;
        if (fp8) {
          Fp8Weight f = random_fp8(rows, K);
          w = f.gpu;
        } else {
          w.w = gpu(randn({rows, K}, 0.03f));
        }
        parts.emplace_back(std::move(w), fp8 ? Tensor{} : randn({rows}, 0.5f));
      }
      Linear cat = Linear::concat_rows({&parts[0], &parts[1], &parts[2]});
      ASSERT_TRUE(cat.defined());
      Tensor x = gpu(randn({T, K})), y = cat(x).to_f32();
      int64_t c = 0;
      for (const Linear& p : parts) {
        Tensor part = p(x);
        EXPECT_LT(rel_error(y.slice(1, c, c + p.out_features()).clone(), part), kBf16Tol)
            << (fp8 ? "fp8" : "bf16") << " T=" << T << " columns from " << c;
        c += p.out_features();
      }
    }
}

// F32 activations with the bf16 emulation on: the GPU rounds where the CPU does.
TEST(CudaFused, RopeStoreKvRoundsF32LikeCpu) {
  MS_REQUIRE_CUDA();
  const int64_t T = 6, H = 8, Hkv = 2, D = 128, S = 16;
  RopeTable host = RopeTable::build(64, 1e4, 512, false), dev = host.to(Device::CUDA);
  const auto pos = random_positions(T, 512);
  const auto slots = random_slots(T, S);
  Tensor q = Tensor::empty(DType::F32, {T, H, D}), k = Tensor::empty(DType::F32, {T, Hkv, D});
  std::normal_distribution<float> nd;
  for (auto& x : q.span<float>()) x = nd(rng());
  for (auto& x : k.span<float>()) x = nd(rng());
  Tensor v = randn({T, Hkv, D}), kc0 = randn({S, Hkv, D});
  Tensor qr = q.clone(), kcr = kc0.clone(), vcr = kc0.clone();
  cpu::rope_store_kv(qr, k, v, host.at(pos), slots, true, kcr, vcr, nullptr);
  Tensor qg = q.to(Device::CUDA), kc = gpu(kc0, DType::F32), vc = gpu(kc0, DType::F32);
  cuda::rope_store_kv(qg, k.to(Device::CUDA), gpu(v, DType::F32), dev.at(pos), slots, true, kc, vc, nullptr);
  EXPECT_LT(rel_error(qg, qr), 2e-3);
  EXPECT_LT(rel_error(kc, kcr), 2e-3);
  EXPECT_EQ(rel_error(vc, vcr), 0.0);
}

// DeepSeek's MLA: latent 512 + rope 64 (YaRN, interleaved; one NeoX case), q heads of 128 + 64, as
// many heads as a rank holds at TP 8 (16) and at TP 1 (128, several blocks of q warps), norm
// weight bf16 or F32. Both kernels: the 16-byte one (16+ tokens of BF16 rows) and, turned off
// (MOESERVE_MLA_ROPE_X8=0), the warp-a-head one; a prefill's rows past the slots it writes.
TEST(CudaFused, MlaRopeStoreMatchesCpu) {
  MS_REQUIRE_CUDA();
  const int64_t L = 512, R = 64, nope = 128;
  YarnParams y{40, 4096, 32, 1, 0.707, 0.707};
  for (auto [T, H, wdt, interleaved] : std::vector<std::tuple<int64_t, int64_t, DType, bool>>{
           {1, 16, DType::BF16, true}, {1, 128, DType::F32, true}, {40, 16, DType::F32, true},
           {9, 128, DType::BF16, true}, {301, 16, DType::BF16, true}, {77, 128, DType::F32, true},
           {33, 16, DType::BF16, false}}) {
    RopeTable host = RopeTable::build(int(R), 1e4, 4096, interleaved, &y), dev = host.to(Device::CUDA);
    const int64_t S = T + 64;
    const auto pos = random_positions(T, 4096);
    const auto slots = random_slots(T, S);
    Tensor q = randn({T, H, nope + R}), kv = randn({T, L + R}, 2.0f), w = randn({L}, 0.5f);
    Tensor c0 = randn({S, L + R});
    Tensor qr = q.clone(), cr = c0.clone();
    cpu::mla_rope_store(qr, kv, w, 1e-6f, host.at(pos), slots, false, cr);
    for (const char* x8 : {"1", "0"}) {
      setenv("MOESERVE_MLA_ROPE_X8", x8, 1);
      const std::string name = std::to_string(T) + " tokens, " + std::to_string(H) + " heads, " +
                               (interleaved ? "interleaved" : "NeoX") + ", MOESERVE_MLA_ROPE_X8=" + x8;
      Tensor qg = gpu(q), kvg = gpu(kv), cache = gpu(c0);
      cuda::mla_rope_store(qg, kvg, gpu(w, wdt), 1e-6f, dev.at(pos), slots, false, cache);
      EXPECT_LT(rel_error(qg, qr), kBf16Tol) << name << ": q";
      EXPECT_EQ(rel_error(qg.to_f32().slice(2, 0, nope).clone(), q.slice(2, 0, nope).clone()), 0.0)
          << name << ": q's nope dims";
      Tensor got = cache_rows(cache, slots), want = cache_rows(cr, slots);
      EXPECT_LT(rel_error(got.slice(1, 0, L).clone(), want.slice(1, 0, L).clone()), kBf16Tol) << name << ": latent";
      EXPECT_LT(rel_error(got.slice(1, L, L + R).clone(), want.slice(1, L, L + R).clone()), kBf16Tol)
          << name << ": roped key";
      const auto rest = other_rows(slots, S);
      EXPECT_EQ(rel_error(cache_rows(cache, rest), cache_rows(c0, rest)), 0.0) << name << ": other slots";
      EXPECT_EQ(rel_error(kvg, kv), 0.0) << name << ": kv is an input only";
    }
    unsetenv("MOESERVE_MLA_ROPE_X8");
  }
}

}  // namespace
}  // namespace ms
