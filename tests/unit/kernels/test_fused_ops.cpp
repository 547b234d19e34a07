// The fused CPU ops against the separate steps the layers ran before (add then norm; q/k norm,
// rope, bf16 rounding and cache scatters; one linear of concatenated rows): bit for bit, since
// the fixture comparisons and every CPU test downstream rely on the CPU numbers not moving.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/cpu/cpu_ops.h"
#include "layers/linear.h"
#include "layers/rope.h"
#include "models/causal_lm.h"
#include "test_support.h"

namespace ms {
namespace {

Tensor randn(Shape shape, float scale = 1.0f, uint32_t seed = 7) {
  Tensor t = Tensor::empty(DType::F32, std::move(shape));
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, scale);
  for (auto& v : t.span<float>()) v = d(g);  // not bf16-exact: the rounding steps must show
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor x = a.clone(), y = b.clone();
  return x.shape() == y.shape() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

std::vector<int32_t> positions_of(int64_t T) {
  std::vector<int32_t> p(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) p[size_t(t)] = int32_t(7 * t + 3);
  return p;
}
const std::vector<int32_t> kSlots = {9, 2, 31, 0, 17};  // not in order, not contiguous

TEST(FusedOps, AddRmsNormIsAddThenNorm) {
  for (int64_t T : {0, 1, 5}) {
    const int64_t D = 320;
    Tensor x = randn({T, D}, 2.0f, 1), y = randn({T, D}, 1.0f, 2), w = randn({D}, 0.5f, 3);
    Tensor rx = x.clone(), ref = Tensor::empty(DType::F32, {T, D});
    cpu::add_inplace(rx, y);
    cpu::rms_norm(rx, w, 1e-6f, ref);
    Tensor fx = x.clone(), out = Tensor::empty(DType::F32, {T, D});
    cpu::add_rms_norm(fx, y, w, 1e-6f, out);
    EXPECT_TRUE(same_bits(fx, rx)) << "residual, T=" << T;
    EXPECT_TRUE(same_bits(out, ref)) << "normalised, T=" << T;
    Tensor gx = x.clone(), yy = y.clone();  // the norm written over the addend
    cpu::add_rms_norm(gx, yy, w, 1e-6f, yy);
    EXPECT_TRUE(same_bits(yy, ref)) << "out = y, T=" << T;
  }
}

struct RopeCase {
  int rot_dim;
  bool interleaved, round;
};

TEST(FusedOps, RopeStoreKvIsRopeRoundScatter) {
  const int64_t T = 5, Hq = 6, Hkv = 2, D = 64;
  for (RopeCase c : {RopeCase{64, false, false}, RopeCase{64, false, true}, RopeCase{32, false, true},
                     RopeCase{64, true, true}}) {
    RopeTable table = RopeTable::build(c.rot_dim, 1e6, 64, c.interleaved);
    const auto pos = positions_of(T);
    Tensor q = randn({T, Hq, D}, 1.0f, 4), k = randn({T, Hkv, D}, 1.0f, 5), v = randn({T, Hkv, D}, 1.0f, 6);
    Tensor kc0 = randn({32, Hkv, D}, 1.0f, 8), vc0 = randn({32, Hkv, D}, 1.0f, 9);
    // The steps GqaAttention ran before the fused op.
    Tensor qr = q.clone(), kr = k.clone(), kcr = kc0.clone(), vcr = vc0.clone();
    cpu::rope(qr, 0, c.rot_dim, pos, table.cos, table.sin, c.interleaved);
    cpu::rope(kr, 0, c.rot_dim, pos, table.cos, table.sin, c.interleaved);
    if (c.round) cpu::round_to_bf16(qr), cpu::round_to_bf16(kr);
    cpu::scatter_rows(kr, kSlots, kcr);
    cpu::scatter_rows(v, kSlots, vcr);

    Tensor qf = q.clone(), kf = k.clone(), vf = v.clone(), kc = kc0.clone(), vc = vc0.clone();
    cpu::rope_store_kv(qf, kf, vf, table.at(pos), kSlots, c.round, kc, vc, nullptr);
    const std::string name = "rot " + std::to_string(c.rot_dim) + (c.interleaved ? " interleaved" : " neox") +
                             (c.round ? " rounded" : "");
    EXPECT_TRUE(same_bits(qf, qr)) << name;
    EXPECT_TRUE(same_bits(kc, kcr)) << name;
    EXPECT_TRUE(same_bits(vc, vcr)) << name;
    EXPECT_TRUE(same_bits(kf, k) && same_bits(vf, v)) << name << ": k and v are inputs only";
  }
}

// Qwen3's per-head q/k norms, on head slices of one fused [T, Hq + 2 Hkv, D] projection.
TEST(FusedOps, RopeStoreKvWithHeadNormsIsNormRoundRopeRoundScatter) {
  const int64_t T = 5, Hq = 4, Hkv = 2, D = 32;
  RopeTable table = RopeTable::build(int(D), 1e6, 64, false);
  const auto pos = positions_of(T);
  Tensor qkv = randn({T, (Hq + 2 * Hkv) * D}, 1.0f, 14), wq = randn({D}, 0.5f, 15), wk = randn({D}, 0.5f, 16);
  Tensor cache0 = randn({32, Hkv, D}, 1.0f, 17);
  // The steps GqaAttention ran before: separate q, k, v, norms in place, rope, rounding, scatters.
  Tensor q = qkv.slice(1, 0, Hq * D).clone(), k = qkv.slice(1, Hq * D, (Hq + Hkv) * D).clone();
  Tensor v = qkv.slice(1, (Hq + Hkv) * D, (Hq + 2 * Hkv) * D).clone();
  Tensor qrows = q.view({T * Hq, D}), krows = k.view({T * Hkv, D});
  cpu::rms_norm(qrows, wq, 1e-6f, qrows);
  cpu::rms_norm(krows, wk, 1e-6f, krows);
  cpu::round_to_bf16(q), cpu::round_to_bf16(k);
  Tensor q3 = q.view({T, Hq, D}), k3 = k.view({T, Hkv, D});
  cpu::rope(q3, 0, int(D), pos, table.cos, table.sin, false);
  cpu::rope(k3, 0, int(D), pos, table.cos, table.sin, false);
  cpu::round_to_bf16(q3), cpu::round_to_bf16(k3);
  Tensor kcr = cache0.clone(), vcr = cache0.clone();
  cpu::scatter_rows(k3, kSlots, kcr);
  cpu::scatter_rows(v.view({T, Hkv, D}), kSlots, vcr);

  Tensor heads = qkv.clone().view({T, Hq + 2 * Hkv, D});
  Tensor qf = heads.slice(1, 0, Hq), kf = heads.slice(1, Hq, Hq + Hkv), vf = heads.slice(1, Hq + Hkv, Hq + 2 * Hkv);
  Tensor kc = cache0.clone(), vc = cache0.clone();
  const ops::HeadNorm norm{wq, wk, 1e-6f};
  cpu::rope_store_kv(qf, kf, vf, table.at(pos), kSlots, true, kc, vc, &norm);
  EXPECT_TRUE(same_bits(qf, q3));
  EXPECT_TRUE(same_bits(kc, kcr));
  EXPECT_TRUE(same_bits(vc, vcr));
  EXPECT_TRUE(same_bits(heads.slice(1, Hq, Hq + 2 * Hkv), qkv.view({T, Hq + 2 * Hkv, D}).slice(1, Hq, Hq + 2 * Hkv)))
      << "k and v are inputs only";
}

TEST(FusedOps, MlaRopeStoreIsNormRopeRoundScatter) {
  const int64_t T = 5, H = 4, nope = 32, L = 128, R = 64;
  YarnParams y{40, 64, 32, 1, 0.707, 0.707};
  RopeTable table = RopeTable::build(int(R), 1e4, 64, true, &y);
  const auto pos = positions_of(T);
  for (bool round : {false, true}) {
    Tensor q = randn({T, H, nope + R}, 1.0f, 10), kv = randn({T, L + R}, 2.0f, 11), w = randn({L}, 0.5f, 12);
    Tensor cache0 = randn({32, L + R}, 1.0f, 13);
    // The steps MlaAttention ran before the fused op.
    Tensor qr = q.clone(), kvr = kv.clone(), cr = cache0.clone();
    Tensor latent = kvr.slice(1, 0, L);
    cpu::rms_norm(latent, w, 1e-6f, latent);
    Tensor kv3 = kvr.view({T, 1, L + R});
    cpu::rope(kv3, int(L), int(R), pos, table.cos, table.sin, true);
    cpu::rope(qr, int(nope), int(R), pos, table.cos, table.sin, true);
    if (round) cpu::round_to_bf16(kvr), cpu::round_to_bf16(qr);
    cpu::scatter_rows(kvr, kSlots, cr);

    Tensor qf = q.clone(), kvf = kv.clone(), cache = cache0.clone();
    cpu::mla_rope_store(qf, kvf, w, 1e-6f, table.at(pos), kSlots, round, cache);
    EXPECT_TRUE(same_bits(qf, qr)) << "round " << round;
    EXPECT_TRUE(same_bits(cache, cr)) << "round " << round;
    EXPECT_TRUE(same_bits(kvf, kv)) << "kv is an input only";
  }
}

// A weight of `rows` x `in`, bf16 or FP8 with 128 x 128 scale blocks, and an optional bias.
Linear make_linear(int64_t rows, int64_t in, bool fp8, bool bias, uint32_t seed) {
  ops::Weight w;
  std::mt19937 g(seed);
  if (fp8) {
    w.w = Tensor::empty(DType::F8_E4M3, {rows, in});
    for (auto& b : w.w.span<uint8_t>()) b = uint8_t(g() % 126) | uint8_t((g() & 1) << 7);
    w.scale_inv = randn({(rows + 127) / 128, (in + 127) / 128}, 0.01f, seed + 1);
  } else {
    w.w = Tensor::empty(DType::BF16, {rows, in});
    Tensor f = randn({rows, in}, 0.05f, seed);
    for (int64_t i = 0; i < f.numel(); ++i) w.w.data<uint16_t>()[i] = f32_to_bf16(f.data<float>()[i]);
  }
  return Linear(std::move(w), bias ? randn({rows}, 0.1f, seed + 2) : Tensor{});
}

TEST(FusedOps, ConcatenatedLinearGivesEachPartsOutput) {
  const int64_t T = 3, K = 200;
  Tensor x = randn({T, K}, 1.0f, 20);
  for (bool fp8 : {false, true}) {
    const bool bias = !fp8;
    Linear a = make_linear(256, K, fp8, bias, 21), b = make_linear(128, K, fp8, bias, 22),
           c = make_linear(72, K, fp8, bias, 23);  // the last part may end inside a block
    Linear cat = Linear::concat_rows({&a, &b, &c});
    ASSERT_TRUE(cat.defined()) << "fp8 " << fp8;
    Tensor y = cat(x);
    EXPECT_TRUE(same_bits(y.slice(1, 0, 256), a(x))) << "fp8 " << fp8;
    EXPECT_TRUE(same_bits(y.slice(1, 256, 384), b(x))) << "fp8 " << fp8;
    EXPECT_TRUE(same_bits(y.slice(1, 384, 456), c(x))) << "fp8 " << fp8;
  }
  // A part viewed as heads in place (as MLA's q without q_lora): strides, not a copy.
  {
    Linear a = make_linear(256, K, false, false, 27), b = make_linear(72, K, false, false, 28);
    Tensor y = Linear::concat_rows({&a, &b})(x);
    const Tensor heads = y.slice(1, 0, 256).unflatten(1, {2, 128});
    EXPECT_EQ(heads.shape(), (Shape{T, 2, 128}));
    EXPECT_EQ(heads.strides(), (Shape{328, 128, 1}));
    EXPECT_EQ(heads.raw(), y.raw());
    EXPECT_TRUE(same_bits(heads, a(x).view({T, 2, 128})));
    EXPECT_THROW(y.slice(1, 0, 256).unflatten(1, {3, 128}), Error);
  }
  Linear f = make_linear(72, K, true, false, 24), g = make_linear(128, K, true, false, 25);
  EXPECT_FALSE(Linear::concat_rows({&f, &g}).defined()) << "an FP8 boundary inside a scale block";
  Linear h = make_linear(128, K, false, true, 26);
  EXPECT_FALSE(Linear::concat_rows({&g, &h}).defined()) << "FP8 with bf16";
}

// Every fixture's attention runs one projection GEMM for q (q_a, or q_proj without q_lora) and
// k/v (or kv_a); V2-Lite's q heads are then a column slice of it (Tensor::unflatten).
TEST(FusedOps, FixtureAttentionProjectionsAreFused) {
  for (const std::string& name : test::all_fixtures()) {
    auto model = load_model(test::fixture_dir(name));
    for (const DecoderLayer& layer : model->layers)
      EXPECT_TRUE(std::visit([](const auto& a) { return a.fused_projection(); }, layer.attention)) << name;
  }
}

}  // namespace
}  // namespace ms
