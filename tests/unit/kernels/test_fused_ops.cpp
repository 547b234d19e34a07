// The fused CPU ops against the separate steps the layers ran before (add then norm; rope,
// bf16 rounding and cache scatters): bit for bit, since the fixture comparisons and every CPU
// test downstream rely on the CPU numbers not moving.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/cpu/cpu_ops.h"
#include "layers/rope.h"

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
    cpu::rope_store_kv(qf, kf, vf, table.at(pos), kSlots, c.round, kc, vc);
    const std::string name = "rot " + std::to_string(c.rot_dim) + (c.interleaved ? " interleaved" : " neox") +
                             (c.round ? " rounded" : "");
    EXPECT_TRUE(same_bits(qf, qr)) << name;
    EXPECT_TRUE(same_bits(kc, kcr)) << name;
    EXPECT_TRUE(same_bits(vc, vcr)) << name;
    EXPECT_TRUE(same_bits(kf, k) && same_bits(vf, v)) << name << ": k and v are inputs only";
  }
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

}  // namespace
}  // namespace ms
