// The attention and MoE CUDA ops against their CPU ops: GQA and MLA over a shuffled slot cache
// (prefill with a cached prefix, mixed batches, and long decodes that take the split-KV path,
// eager and replayed from a captured step), the MLA absorptions (bf16 and fp8 kv_b; an fp8 kv_b
// dequantised once, bit for bit as at every call), router
// top-k in every routing variant (ids must be identical), and the routed experts (bf16 and fp8
// weights). DecodeAttentionBench times decode attention when MOESERVE_BENCH_ATTENTION=1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>
#include <span>
#include <string>
#include <tuple>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "layers/rope.h"

namespace ms {
namespace {
using namespace test;

constexpr double kBf16Tol = 1e-2;

// B decodes of `keys` keys less (i % 7) * `less` for decode i.
std::vector<std::pair<int, int>> batch_of(int B, int keys, int less) {
  std::vector<std::pair<int, int>> seqs;
  for (int i = 0; i < B; ++i) seqs.push_back({1, keys - (i % 7) * less});
  return seqs;
}

const std::vector<std::vector<std::pair<int, int>>> kLayouts = {
    {{1, 900}, {64, 64}, {20, 300}},           // decode + prefill + prefix-cached extend
    {{1, 1000}, {1, 4000}, {1, 17}, {1, 2500}},  // a decode batch (split-KV)
    {{1, 6000}},                                // one long decode (many splits)
    // Single decodes as batch-1 decode at 1k-8k context, whose split-KV merges take, on a 132-SM
    // H200, 17, 33, 33 and 65 splits (GQA 32/4 heads, 1056, 2080, 4150 and 8300 keys) and 17,
    // 33, 65 and 130 (MLA: more than the 128 splits the merge loads in one pass).
    {{1, 1056}},
    {{1, 2080}},
    {{1, 4150}},
    {{1, 8300}},
    // Batch-1 decode at 4k (GQA: 32 splits of two 16-key steps a warp; MLA: 64 splits of two
    // tiles), a short one whose single split leaves warps without keys and a partial last step,
    // three and eight decodes of unequal lengths (later splits of the short ones are empty).
    {{1, 4096}},
    {{1, 33}},
    {{1, 4096}, {1, 1000}, {1, 33}},
    {{1, 4096}, {1, 17}, {1, 2500}, {1, 4000}, {1, 129}, {1, 3333}, {1, 64}, {1, 1}},
    {{300, 300}, {130, 1200}, {16, 16}},        // prefill tiles on the tensor cores: causal, cached prefix, partial tiles
    // Few queries a sequence (speculative verification) stay on the decode kernels: each query
    // sees its own causal count of keys, down to 1.
    {{4, 700}, {1, 50}, {3, 3}},
    // The one-pass merge of few splits (GQA 32/4 and MLA 16 heads at batch 1 on a 132-SM H200:
    // 2, 3, 8 and 16 splits of 64 keys), and DeepSeek-V2-Lite's batch-64 decode at ~256 keys
    // (MLA: 2 splits over 1024 (query, head) rows; GQA: one split, written directly), lengths
    // unequal so that the short queries' last split is partial.
    {{1, 128}},
    {{1, 192}},
    {{1, 512}},
    {{1, 1000}},
    batch_of(64, 256, 9),
};

// Query heads per KV head: 8 (Qwen3-30B-A3B), 7 (Qwen2-57B-A14B), 16 (every row of the tensor-core
// decode tile) and 1 (multi-head).
TEST(CudaOps, GqaAttentionMatchesCpu) {
  MS_REQUIRE_CUDA();
  const int64_t D = 128, pool = 16384;  // the largest layouts of kLayouts hold 14140 and 14683 keys
  for (auto [Hq, Hkv] : std::vector<std::pair<int64_t, int64_t>>{{32, 4}, {28, 4}, {64, 4}, {16, 16}}) {
    Tensor kc = randn({pool, Hkv, D}), vc = randn({pool, Hkv, D});
    Tensor kg = gpu(kc), vg = gpu(vc);
    for (const auto& seqs : kLayouts) {
      auto layout = make_layout(seqs, int(pool));
      const int64_t T = layout.q_start.back();
      Tensor q = randn({T, Hq, D}), ref = Tensor::empty(DType::F32, {T, Hq, D});
      cpu::attention(q, kc, vc, layout, 0.088f, ref);
      Tensor out = poisoned(DType::BF16, {T, Hq, D});
      cuda::attention(gpu(q), kg, vg, layout, 0.088f, out);
      EXPECT_LT(rel_error(out, ref), kBf16Tol) << Hq << "/" << Hkv << " heads, " << seqs.size() << " sequences, "
                                               << T << " queries";
    }
  }
}

// 16 heads (DeepSeek-V2-Lite) and 32 (two head groups of the tensor-core kernel).
TEST(CudaOps, MlaAttentionMatchesCpuOnStridedQueries) {
  MS_REQUIRE_CUDA();
  const int64_t L = 512, R = 64, pool = 16384;  // as above
  Tensor cache = randn({pool, L + R}), cg = gpu(cache);
  for (int64_t H : {16, 32})
  for (const auto& seqs : kLayouts) {
    auto layout = make_layout(seqs, int(pool));
    const int64_t T = layout.q_start.back();
    // q_rope is a slice of the [T, H, nope + R] projection, as MlaAttention passes it.
    Tensor ql = randn({T, H, L}, 0.3f), qfull = randn({T, H, 128 + R});
    Tensor qr = qfull.slice(2, 128, 128 + R);
    Tensor ref = Tensor::empty(DType::F32, {T, H, L});
    cpu::mla_attention(ql, qr, cache, layout, 0.06f, ref);
    Tensor out = poisoned(DType::BF16, {T, H, L});
    cuda::mla_attention(gpu(ql), gpu(qfull).slice(2, 128, 128 + R), cg, layout, 0.06f, out);
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << H << " heads, " << seqs.size() << " sequences, " << T << " queries";
  }
}

// Captured decode steps: the splits come from max_kv alone and every query divides its own keys
// over them (split_len 0), so a replay with other lengths (shorter, equal to max_kv, a single
// key) leaves some splits empty and others partly filled. GQA 32/4 and MLA 16 heads in one step,
// captured at 4096 keys (22 and 44 splits on a 132-SM H200: the merge of many splits) and at 256
// (4 splits each: the one-pass merge).
TEST(CudaOps, CapturedDecodeAttentionMatchesCpu) {
  MS_REQUIRE_CUDA();
  const int64_t D = 128, Hq = 32, Hkv = 4, H = 16, L = 512, R = 64, pool = 13000, T = 3;
  Tensor kc = randn({pool, Hkv, D}), vc = randn({pool, Hkv, D}), cache = randn({pool, L + R});
  Tensor kg = gpu(kc), vg = gpu(vc), cg = gpu(cache);
  Tensor q = randn({T, Hq, D}), ql = randn({T, H, L}, 0.3f), qr = randn({T, H, R});
  Tensor qg = gpu(q), qlg = gpu(ql), qrg = gpu(qr);
  const std::vector<int32_t> ids(T, 0), positions(T, 0), locs(T, 0);
  using Seqs = std::vector<std::pair<int, int>>;
  for (const int max_kv : {4096, 256}) {
    Tensor out = poisoned(DType::BF16, {T, Hq, D}), mla_out = poisoned(DType::BF16, {T, H, L});
    const auto captured = make_layout({{1, max_kv}, {1, max_kv / 4}, {1, 33}}, int(pool));
    auto body = [&] {
      cuda::attention(qg, kg, vg, captured, 0.088f, out);
      cuda::mla_attention(qlg, qrg, cg, captured, 0.06f, mla_out);
    };
    body();  // eagerly first, as the runner does: shared-memory limits, allocations
    auto graph_pool = ops::make_graph_pool(Device::CUDA);
    auto graph = ops::capture_step(Device::CUDA, ops::StepArrays{ids, positions, locs, &captured}, 3 * max_kv, max_kv,
                                   *graph_pool, body);
    for (const Seqs& seqs : std::vector<Seqs>{{{1, 50}, {1, max_kv}, {1, max_kv / 2}},
                                              {{1, max_kv}, {1, max_kv}, {1, max_kv}},
                                              {{1, 1}, {1, 17}, {1, 65}}}) {
      const auto layout = make_layout(seqs, int(pool));
      graph->replay(ops::StepArrays{ids, positions, locs, &layout});
      Tensor ref = Tensor::empty(DType::F32, {T, Hq, D}), mla_ref = Tensor::empty(DType::F32, {T, H, L});
      cpu::attention(q, kc, vc, layout, 0.088f, ref);
      cpu::mla_attention(ql, qr, cache, layout, 0.06f, mla_ref);
      const std::string keys = "captured at " + std::to_string(max_kv) + ", keys " + std::to_string(seqs[0].second) +
                               " " + std::to_string(seqs[1].second) + " " + std::to_string(seqs[2].second);
      EXPECT_LT(rel_error(out, ref), kBf16Tol) << "GQA, " << keys;
      EXPECT_LT(rel_error(mla_out, mla_ref), kBf16Tol) << "MLA, " << keys;
    }
  }
}

// A cache of `views` x `slots` rows of `row` bf16 values (small, finite), as `views` caches.
std::vector<Tensor> bench_caches(int views, int64_t slots, Shape row) {
  Shape shape{views * slots};
  shape.insert(shape.end(), row.begin(), row.end());
  Tensor host = Tensor::empty(DType::BF16, shape);
  uint32_t x = 12345;
  for (auto& v : host.span<uint16_t>()) x = x * 1664525u + 1013904223u, v = uint16_t(0x3c00 | ((x >> 16) & 0x83ff));
  Tensor dev = host.to(Device::CUDA);
  std::vector<Tensor> out;
  for (int i = 0; i < views; ++i) out.push_back(dev.slice(0, i * slots, (i + 1) * slots));
  return out;
}

// Microseconds a call of `call(i)` (i: 0 .. 199) takes, replayed from CUDA graphs of 20 calls
// (as a decode step replays one per layer), and eagerly (metadata upload included). The step's
// positions and cache locations are `positions` and `locs` (zeros when not given): ops that are
// passed these very vectors read them from the step's staged arrays, as a model's layers do.
template <class F>
std::pair<double, double> time_calls(const ops::AttentionLayout& layout, int max_kv, F call,
                                     std::span<const int32_t> positions = {}, std::span<const int32_t> locs = {}) {
  constexpr int kPerGraph = 20, kCalls = 200;
  const int64_t T = layout.q_start.back();
  const std::vector<int32_t> ids(size_t(T), 0);
  if (positions.empty()) positions = ids;
  if (locs.empty()) locs = ids;
  auto body = [&] {
    for (int i = 0; i < kPerGraph; ++i) call(i);
  };
  body();
  auto graph_pool = ops::make_graph_pool(Device::CUDA);
  const ops::StepArrays arrays{ids, positions, locs, &layout};
  auto graph = ops::capture_step(Device::CUDA, arrays, int64_t(layout.kv_slots.size()), max_kv, *graph_pool, body);
  graph->replay(arrays);
  cudaEvent_t start, stop;
  cudaEventCreate(&start), cudaEventCreate(&stop);
  auto timed = [&](auto&& run) {
    cudaEventRecord(start, cuda::stream());
    run();
    cudaEventRecord(stop, cuda::stream());
    cudaEventSynchronize(stop);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, start, stop);
    return 1000.0 * ms / kCalls;
  };
  const double graphed = timed([&] {
    for (int r = 0; r < kCalls / kPerGraph; ++r) graph->replay(arrays);
  });
  const double eager = timed([&] {
    for (int i = 0; i < kCalls; ++i) call(i);
  });
  cudaEventDestroy(start), cudaEventDestroy(stop);
  return {graphed, eager};
}

// The decode kernels copy keys before they wait for the kernel before them (launched early,
// programmatic launch) when those keys are older than the step's own: the rope kernel writes a
// query's last `fresh` keys just before. Here the new keys' cache rows hold NaN until the rope
// kernel writes them, right before the attention in the same stream, so a decode kernel that took
// a new key for an old one reads NaN. Long sequences (many splits, most of them early), a
// verification-like sequence of 3 queries and a short one; GQA 32/4 and MLA 16 heads.
TEST(CudaOps, DecodeRightAfterRopeReadsTheNewKeys) {
  MS_REQUIRE_CUDA();
  const int64_t pool = 12000, Hq = 32, Hkv = 4, D = 128, H = 16, nope = 128, L = 512, R = 64;
  const auto layout = make_layout({{1, 4096}, {3, 3000}, {1, 2500}, {1, 40}}, int(pool));
  std::vector<int32_t> positions, locs;  // the new tokens: each sequence's last nq keys
  for (int s = 0; s < layout.num_seqs(); ++s) {
    const int nq = layout.q_start[s + 1] - layout.q_start[s], nk = layout.kv_start[s + 1] - layout.kv_start[s];
    for (int i = 0; i < nq; ++i)
      positions.push_back(nk - nq + i), locs.push_back(layout.kv_slots[size_t(layout.kv_start[s] + nk - nq + i)]);
  }
  const int64_t T = int64_t(locs.size());
  auto with_nan_rows = [&](Tensor t) {  // F32 host cache whose new rows are NaN
    const int64_t row = t.numel() / t.size(0);
    for (int32_t slot : locs) std::fill_n(t.data<float>() + slot * row, row, NAN);
    return t;
  };
  {
    const RopeTable table = RopeTable::build(int(D), 1e6, 8192, false);
    const RopeTable table_gpu = table.to(Device::CUDA);
    Tensor kc = with_nan_rows(randn({pool, Hkv, D})), vc = with_nan_rows(randn({pool, Hkv, D}));
    Tensor kg = gpu(kc), vg = gpu(vc);
    Tensor q = randn({T, Hq, D}), k = randn({T, Hkv, D}), v = randn({T, Hkv, D});
    Tensor qg = gpu(q), ref = Tensor::empty(DType::F32, {T, Hq, D}), out = poisoned(DType::BF16, {T, Hq, D});
    cpu::rope_store_kv(q, k, v, table.at(positions), locs, false, kc, vc, nullptr);
    cpu::attention(q, kc, vc, layout, 0.088f, ref);
    cuda::rope_store_kv(qg, gpu(k), gpu(v), table_gpu.at(positions), locs, false, kg, vg, nullptr);
    cuda::attention(qg, kg, vg, layout, 0.088f, out);
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << "GQA";
  }
  {
    const RopeTable table = RopeTable::build(int(R), 1e4, 8192, true);
    const RopeTable table_gpu = table.to(Device::CUDA);
    Tensor cache = with_nan_rows(randn({pool, L + R})), cg = gpu(cache);
    Tensor q = randn({T, H, nope + R}), kv = randn({T, L + R}), w = randn({L}, 0.5f), ql = randn({T, H, L}, 0.3f);
    Tensor qg = gpu(q), ref = Tensor::empty(DType::F32, {T, H, L}), out = poisoned(DType::BF16, {T, H, L});
    cpu::mla_rope_store(q, kv, w, 1e-6f, table.at(positions), locs, false, cache);
    cpu::mla_attention(ql, q.slice(2, nope, nope + R), cache, layout, 0.06f, ref);
    cuda::mla_rope_store(qg, gpu(kv), gpu(w), 1e-6f, table_gpu.at(positions), locs, false, cg);
    cuda::mla_attention(gpu(ql), qg.slice(2, nope, nope + R), cg, layout, 0.06f, out);
    EXPECT_LT(rel_error(out, ref), kBf16Tol) << "MLA";
  }
}

// rope_store_kv_attention against its two ops in turn (rope_store_kv, then attention), both on
// the GPU: a decode step takes the attention kernel that norms and ropes its queries and writes
// the new keys and values itself, which must leave the same caches and the same output, bit for
// bit (the same rope functions, the same attention); a step with a prefill in it falls back to
// the two ops. Qwen3's 32/4 heads as head slices of one projection, with per-head norms and
// without; eager, and replayed from a captured decode step with other lengths and positions.
TEST(CudaOps, DecodeRopeInsideAttentionMatchesTheTwoOps) {
  MS_REQUIRE_CUDA();
  const int64_t pool = 13000, Hq = 32, Hkv = 4, D = 128;
  const RopeTable table = RopeTable::build(int(D), 1e6, 8192, false).to(Device::CUDA);
  Tensor c0 = gpu(randn({pool, Hkv, D})), wq = gpu(randn({D}, 0.5f)), wk = gpu(randn({D}, 0.5f));
  const ops::HeadNorm norms{wq, wk, 1e-6f};
  // Each sequence's new tokens: its last nq keys, at positions nk - nq ...
  auto new_tokens = [](const ops::AttentionLayout& l, std::vector<int32_t>& positions, std::vector<int32_t>& locs) {
    positions.clear(), locs.clear();
    for (int s = 0; s < l.num_seqs(); ++s) {
      const int nq = l.q_start[s + 1] - l.q_start[s], nk = l.kv_start[s + 1] - l.kv_start[s];
      for (int i = 0; i < nq; ++i)
        positions.push_back(nk - nq + i), locs.push_back(l.kv_slots[size_t(l.kv_start[s] + nk - nq + i)]);
    }
  };
  struct Side {
    Tensor qkv, kc, vc, out;
  };
  auto side = [&](const Tensor& qkv_host, int64_t T) {
    Side s{gpu(qkv_host).view({T, Hq + 2 * Hkv, D}), c0.clone(), c0.clone(), poisoned(DType::BF16, {T, Hq, D})};
    return s;
  };
  auto fused = [&](Side& s, const ops::AttentionLayout& l, std::span<const int32_t> pos, std::span<const int32_t> locs,
                   const ops::HeadNorm* n) {
    Tensor q = s.qkv.slice(1, 0, Hq);
    cuda::rope_store_kv_attention(q, s.qkv.slice(1, Hq, Hq + Hkv), s.qkv.slice(1, Hq + Hkv, Hq + 2 * Hkv),
                                  table.at(pos), locs, false, s.kc, s.vc, n, l, 0.088f, s.out);
  };
  auto two_ops = [&](Side& s, const ops::AttentionLayout& l, std::span<const int32_t> pos, std::span<const int32_t> locs,
                     const ops::HeadNorm* n) {
    Tensor q = s.qkv.slice(1, 0, Hq);
    cuda::rope_store_kv(q, s.qkv.slice(1, Hq, Hq + Hkv), s.qkv.slice(1, Hq + Hkv, Hq + 2 * Hkv), table.at(pos), locs,
                        false, s.kc, s.vc, n);
    cuda::attention(q, s.kc, s.vc, l, 0.088f, s.out);
  };
  auto expect_same = [](const Side& a, const Side& b, const std::string& name) {
    EXPECT_EQ(bit_mismatches(a.kc, b.kc), 0) << name << ": key cache";
    EXPECT_EQ(bit_mismatches(a.vc, b.vc), 0) << name << ": value cache";
    EXPECT_EQ(bit_mismatches(a.out, b.out), 0) << name << ": output";
  };
  using Seqs = std::vector<std::pair<int, int>>;
  for (const ops::HeadNorm* n : {&norms, static_cast<const ops::HeadNorm*>(nullptr)}) {
    for (const Seqs& seqs : std::vector<Seqs>{{{1, 4096}}, {{1, 33}}, {{1, 1}}, {{1, 4096}, {1, 1000}, {1, 33}},
                                              batch_of(8, 2000, 250), {{1, 900}, {64, 64}}}) {
      const auto layout = make_layout(seqs, int(pool));
      std::vector<int32_t> pos, locs;
      new_tokens(layout, pos, locs);
      const int64_t T = int64_t(locs.size());
      const Tensor qkv = randn({T, (Hq + 2 * Hkv) * D});
      Side a = side(qkv, T), b = side(qkv, T);
      fused(a, layout, pos, locs, n);
      two_ops(b, layout, pos, locs, n);
      expect_same(a, b, std::string(n ? "norms, " : "") + std::to_string(seqs.size()) + " sequences, first of " +
                            std::to_string(seqs[0].second) + " keys");
    }
    // Captured at 4096 keys for 3 decodes, each side in its own graph (a replay's splits come
    // from the capture's max_kv), replayed with other lengths (a split of its own for the single
    // key, some splits empty) and so other positions and new slots.
    const auto captured = make_layout({{1, 4096}, {1, 1024}, {1, 33}}, int(pool));
    std::vector<int32_t> pos, locs;
    new_tokens(captured, pos, locs);
    const std::vector<int32_t> ids(3, 0);
    const Tensor qkv = randn({3, (Hq + 2 * Hkv) * D});
    Side a = side(qkv, 3), b = side(qkv, 3);
    fused(a, captured, pos, locs, n);  // eagerly first, as the runner does
    two_ops(b, captured, pos, locs, n);
    auto graph_pool = ops::make_graph_pool(Device::CUDA);
    const ops::StepArrays arrays{ids, pos, locs, &captured};
    auto graph_a = ops::capture_step(Device::CUDA, arrays, 3 * 4096, 4096, *graph_pool,
                                     [&] { fused(a, captured, pos, locs, n); });
    auto graph_b = ops::capture_step(Device::CUDA, arrays, 3 * 4096, 4096, *graph_pool,
                                     [&] { two_ops(b, captured, pos, locs, n); });
    for (const Seqs& seqs : std::vector<Seqs>{{{1, 50}, {1, 4096}, {1, 2048}}, {{1, 1}, {1, 17}, {1, 4000}}}) {
      const auto layout = make_layout(seqs, int(pool));
      std::vector<int32_t> p2, l2;
      new_tokens(layout, p2, l2);
      for (Side* s : {&a, &b}) s->kc.copy_from(c0), s->vc.copy_from(c0), s->qkv.copy_from(gpu(qkv).view(s->qkv.shape()));
      graph_a->replay(ops::StepArrays{ids, p2, l2, &layout});
      graph_b->replay(ops::StepArrays{ids, p2, l2, &layout});
      expect_same(a, b, std::string(n ? "norms, " : "") + "replayed at " + std::to_string(seqs[0].second) + " " +
                            std::to_string(seqs[1].second) + " " + std::to_string(seqs[2].second) + " keys");
    }
  }
}

// Decode attention: µs a call (split-KV kernel and merge) and the KV bytes it streams per µs,
// GQA 32/4 heads (Qwen3-30B-A3B) and MLA 16 heads (DeepSeek-V2-Lite): batch 1 and 8 at 4096 keys
// a query, and batch 64 at 256 (V2-Lite's 2-split MLA decode, where the merge's cost shows).
// Each call reads another copy of the cache, and the copies together exceed the 50 MB L2, so the
// numbers are DRAM's. Slots shuffled over the pool (each key a random row), and in order (each
// sequence's rows contiguous): the difference is DRAM's access pattern, not the kernel's work.
// Then the fused rope + KV-cache writes of the same steps: Qwen3's (32 + 4 heads with q/k norms)
// at batch 1, V2-Lite's MLA (16 heads, latent 512 + 64) at batch 64. Opt-in (timing, not a
// check): MOESERVE_BENCH_ATTENTION=1.
TEST(CudaOps, DecodeAttentionBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_ATTENTION");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_ATTENTION=1 to time decode attention";
  for (auto [B, keys] : std::vector<std::pair<int, int>>{{1, 4096}, {8, 4096}, {64, 256}})
  for (bool shuffled : {true, false}) {
    const int64_t slots = int64_t(B) * keys;
    const auto layout = make_layout(std::vector<std::pair<int, int>>(size_t(B), {1, keys}), int(slots), shuffled);
    const char* order = shuffled ? "shuffled" : "in order";
    {
      const int64_t Hq = 32, Hkv = 4, D = 128;
      const double bytes = double(slots) * Hkv * D * 2 * 2;
      const int views = std::max(2, int(std::ceil(160e6 / bytes)));
      auto k = bench_caches(views, slots, {Hkv, D}), v = bench_caches(views, slots, {Hkv, D});
      Tensor q = gpu(randn({B, Hq, D})), out = poisoned(DType::BF16, {B, Hq, D});
      auto [graphed, eager] = time_calls(layout, keys, [&](int i) {
        cuda::attention(q, k[size_t(i % views)], v[size_t(i % views)], layout, 0.088f, out);
      });
      std::printf("[bench] GQA 32/4 heads, B=%d, %d keys, slots %s: %.2f us (%.0f GB/s) graphed, %.2f us eager, "
                  "%.1f MB a call\n",
                  B, keys, order, graphed, bytes / graphed / 1e3, eager, bytes / 1e6);
    }
    {
      const int64_t H = 16, L = 512, R = 64;
      const double bytes = double(slots) * (L + R) * 2;
      const int views = std::max(2, int(std::ceil(160e6 / bytes)));
      auto c = bench_caches(views, slots, {L + R});
      Tensor ql = gpu(randn({B, H, L}, 0.3f)), qr = gpu(randn({B, H, R})), out = poisoned(DType::BF16, {B, H, L});
      auto [graphed, eager] = time_calls(layout, keys, [&](int i) {
        cuda::mla_attention(ql, qr, c[size_t(i % views)], layout, 0.06f, out);
      });
      std::printf("[bench] MLA 16 heads, B=%d, %d keys, slots %s: %.2f us (%.0f GB/s) graphed, %.2f us eager, "
                  "%.1f MB a call\n",
                  B, keys, order, graphed, bytes / graphed / 1e3, eager, bytes / 1e6);
    }
  }
  // Rope + KV write: positions and slots are the step's arrays (a token's cache row its own);
  // 8192 rows time a prefill's (memory round trips in flight, not launch latency).
  for (auto [B, mla] : std::vector<std::pair<int, bool>>{{1, false}, {64, true}, {8192, false}, {8192, true}}) {
    const int64_t pool = std::max<int64_t>(4096, 3 * int64_t(B));
    const auto layout = make_layout(std::vector<std::pair<int, int>>(size_t(B), {1, 1}), int(B));
    std::vector<int32_t> positions(static_cast<size_t>(B)), locs(static_cast<size_t>(B));
    for (int i = 0; i < B; ++i) positions[size_t(i)] = (1000 + 37 * i) % 8192, locs[size_t(i)] = 3 * i;
    double graphed = 0, eager = 0;
    if (!mla) {
      const int64_t Hq = 32, Hkv = 4, D = 128;
      const RopeTable table = RopeTable::build(int(D), 1e6, 8192, false).to(Device::CUDA);
      Tensor qkv = gpu(randn({B, (Hq + 2 * Hkv) * D})).view({B, Hq + 2 * Hkv, D});
      Tensor q = qkv.slice(1, 0, Hq), k = qkv.slice(1, Hq, Hq + Hkv), v = qkv.slice(1, Hq + Hkv, Hq + 2 * Hkv);
      Tensor kc = gpu(randn({pool, Hkv, D})), vc = gpu(randn({pool, Hkv, D}));
      Tensor wq = gpu(randn({D}, 0.5f)), wk = gpu(randn({D}, 0.5f));
      const ops::HeadNorm norm{wq, wk, 1e-6f};
      std::tie(graphed, eager) = time_calls(layout, 1, [&](int) {
        cuda::rope_store_kv(q, k, v, table.at(positions), locs, false, kc, vc, &norm);
      }, positions, locs);
      std::printf("[bench] rope_store_kv (Qwen3 32/4 heads of 128, q/k norms), B=%d: %.2f us graphed, %.2f us eager\n",
                  B, graphed, eager);
    } else {
      const int64_t H = 16, nope = 128, L = 512, R = 64;
      const RopeTable table = RopeTable::build(int(R), 1e4, 8192, true).to(Device::CUDA);
      Tensor q = gpu(randn({B, H, nope + R})), kv = gpu(randn({B, L + R})), w = gpu(randn({L}, 0.5f));
      Tensor cache = gpu(randn({pool, L + R}));
      std::tie(graphed, eager) = time_calls(layout, 1, [&](int) {
        cuda::mla_rope_store(q, kv, w, 1e-6f, table.at(positions), locs, false, cache);
      }, positions, locs);
      std::printf("[bench] mla_rope_store (16 heads, latent 512 + 64), B=%d: %.2f us graphed, %.2f us eager\n", B,
                  graphed, eager);
    }
  }
}

TEST(CudaOps, MlaAbsorbAndExpandMatchCpu) {
  MS_REQUIRE_CUDA();
  const int H = 16, nope = 128, R = 64, v = 128, L = 512;
  for (bool fp8 : {false, true}) {
    for (int64_t T : {1, 37}) {
      ops::Weight wc, wg;
      if (fp8) {
        Fp8Weight f = random_fp8(H * (nope + v), L, 0.01f);
        wc = f.cpu, wg = f.gpu;
      } else {
        Tensor w = randn({H * (nope + v), L}, 0.05f);
        wc.w = host_as(w, DType::BF16), wg.w = gpu(w);
      }
      Tensor q = randn({T, H, nope + R});
      Tensor qn = q.slice(2, 0, nope);
      Tensor ql_ref = Tensor::empty(DType::F32, {T, H, L});
      cpu::mla_absorb_q(qn, wc, nope, v, ql_ref);
      Tensor ql = poisoned(DType::BF16, {T, H, L});
      cuda::mla_absorb_q(gpu(q).slice(2, 0, nope), wg, nope, v, ql);
      EXPECT_LT(rel_error(ql, ql_ref), kBf16Tol) << "absorb fp8=" << fp8 << " T=" << T;

      Tensor lat = randn({T, H, L});
      Tensor o_ref = Tensor::empty(DType::F32, {T, H, v});
      cpu::mla_expand_v(lat, wc, nope, v, o_ref);
      Tensor o = poisoned(DType::BF16, {T, H, v});
      cuda::mla_expand_v(gpu(lat), wg, nope, v, o);
      EXPECT_LT(rel_error(o, o_ref), kBf16Tol) << "expand fp8=" << fp8 << " T=" << T;
    }
  }
}

// Bit-for-bit equality of device tensors.
bool same_bits(const Tensor& a, const Tensor& b) {
  Tensor ha = a.to(Device::CPU), hb = b.to(Device::CPU);
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// An FP8 kv_b is dequantised once, into a kept BF16 copy (cuda::weight_bf16_kept): the
// absorptions, and a many-row linear through it (the expanded prefill's keys), give exactly what
// they give dequantising into scratch at every call (keeping off), the first call and the later
// ones; once the copy exists a captured call launches no dequantising kernel (one fewer kernel
// node a product than with keeping off); a capture cannot make a copy.
TEST(CudaOps, MlaFp8KvBIsDequantisedOnce) {
  MS_REQUIRE_CUDA();
  const int H = 16, nope = 128, v = 128, L = 512;
  const int64_t T = 64, K = 1024;  // K: beyond the rows that take FP8 blocks as bytes
  const ops::Weight kv_b = random_fp8(H * (nope + v), L, 0.01f).gpu;
  const Tensor qn = gpu(randn({T, H, nope})), lat = gpu(randn({T, H, L})), keys = gpu(randn({K, L}));
  cuda::set_fp8_mode(cuda::Fp8Mode::Dequant);
  struct Outs { Tensor ql, o, kv; };
  auto absorbs = [&](Outs& r) {
    cuda::mla_absorb_q(qn, kv_b, nope, v, r.ql);
    cuda::mla_expand_v(lat, kv_b, nope, v, r.o);
  };
  auto fresh = [&] {
    return Outs{poisoned(DType::BF16, {T, H, L}), poisoned(DType::BF16, {T, H, v}),
                poisoned(DType::BF16, {K, H * (nope + v)})};
  };
  auto run = [&] {
    Outs r = fresh();
    absorbs(r);
    cuda::linear(keys, kv_b, nullptr, r.kv);
    return r;
  };

  cuda::set_keep_bf16(false);
  const Outs ref = run();
  Outs scratch_outs = fresh();
  const int absorb_nodes_off = kernel_nodes([&] { absorbs(scratch_outs); });
  const int linear_nodes_off = kernel_nodes([&] { cuda::linear(keys, kv_b, nullptr, scratch_outs.kv); });

  cuda::set_keep_bf16(true);
  // No copy yet: a capture cannot make one.
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_ANY_THROW(cuda::mla_absorb_q(qn, kv_b, nope, v, scratch_outs.ql));
  ASSERT_EQ(cudaStreamEndCapture(cuda::stream(), &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);

  for (int call = 0; call < 2; ++call) {  // the call that makes the copy, then one that reads it
    const Outs got = run();
    EXPECT_TRUE(same_bits(got.ql, ref.ql)) << "absorb, call " << call;
    EXPECT_TRUE(same_bits(got.o, ref.o)) << "expand, call " << call;
    EXPECT_TRUE(same_bits(got.kv, ref.kv)) << "linear, call " << call;
  }
  EXPECT_EQ(kernel_nodes([&] { absorbs(scratch_outs); }), absorb_nodes_off - 2);
  EXPECT_EQ(kernel_nodes([&] { cuda::linear(keys, kv_b, nullptr, scratch_outs.kv); }), linear_nodes_off - 1);
  // The capture's products, replayed, are the eager ones too.
  Outs replayed = fresh();
  ASSERT_EQ(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  absorbs(replayed);
  ASSERT_EQ(cudaStreamEndCapture(cuda::stream(), &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, cuda::stream()), cudaSuccess);
  EXPECT_TRUE(same_bits(replayed.ql, ref.ql)) << "absorb, replayed";
  EXPECT_TRUE(same_bits(replayed.o, ref.o)) << "expand, replayed";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

struct RouterCase {
  const char* name;
  int64_t E;
  ops::RouterParams p;
  bool bias;
  DType logits_dtype;
  // Integer logits: many equal scores, group scores and choices. (No bias with them: a bias on a
  // grid would make sums such as sigmoid(k) + sigmoid(-k) equal in exact arithmetic only, whose
  // rounding the CPU's exp and the GPU's may order differently.)
  bool ties = false;
};

ops::RouterParams router(int k, ops::Scoring s, ops::GroupRank g, int ng, int tg, bool renorm, float scale,
                         int replicas = 0, int pieces = 1) {
  ops::RouterParams p;
  p.top_k = k, p.scoring = s, p.group_rank = g, p.n_group = ng, p.topk_group = tg, p.renormalize = renorm;
  p.scale = scale, p.fused_shared_replicas = replicas, p.fused_shared_pieces = pieces;
  return p;
}

TEST(CudaOps, MoeTopkMatchesCpuInEveryVariant) {
  MS_REQUIRE_CUDA();
  using S = ops::Scoring;
  using G = ops::GroupRank;
  const std::vector<RouterCase> cases = {
      {"qwen3 softmax greedy renorm", 128, router(8, S::Softmax, G::None, 1, 1, true, 1.0f), false, DType::F32},
      {"qwen2 softmax greedy bf16 logits", 60, router(4, S::Softmax, G::None, 1, 1, false, 1.0f), false, DType::BF16},
      {"v2 group_limited_greedy", 160, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f), false, DType::F32},
      {"v3 noaux_tc", 256, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true, DType::F32},
      {"mixtral softmax top-2 of 8", 8, router(2, S::Softmax, G::None, 1, 1, true, 1.0f), false, DType::BF16},
      {"512 experts top-10", 512, router(10, S::Softmax, G::None, 1, 1, true, 1.0f), false, DType::F32},
      {"qwen3 ties", 128, router(8, S::Softmax, G::None, 1, 1, true, 1.0f), false, DType::F32, true},
      {"v3 noaux_tc ties", 256, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), false, DType::F32, true},
      {"v2 group_limited_greedy ties", 160, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f), false, DType::F32, true},
      // Shared-experts fusion: V3's one column, V2-Lite's two (pieces) of 3 replicas.
      {"v3 noaux_tc fused shared x4", 256, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f, 4), true, DType::F32},
      {"v2-lite fused shared x3 of 2 pieces", 64, router(6, S::Softmax, G::None, 1, 1, true, 2.5f, 3, 2), false,
       DType::F32},
  };
  const int64_t T = 301;  // 4 tokens a block: the last block partly idle
  for (const auto& c : cases) {
    Tensor logits = randn({T, c.E}, 2.0f), bias = randn({c.E}, 0.3f);
    if (c.ties)  // ties must go to the lower expert (and group) id exactly as on the CPU
      for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = std::round(logits.data<float>()[i]);
    const int64_t C = c.p.columns();
    Tensor ids_ref = Tensor::empty(DType::I32, {T, C}), w_ref = Tensor::empty(DType::F32, {T, C});
    cpu::moe_topk(logits, c.bias ? &bias : nullptr, c.p, ids_ref, w_ref);
    Tensor ids = poisoned(DType::I32, {T, C}), w = poisoned(DType::F32, {T, C});
    Tensor bg = bias.to(Device::CUDA);
    cuda::moe_topk(gpu(logits, c.logits_dtype), c.bias ? &bg : nullptr, c.p, ids, w);
    Tensor ids_h = ids.to(Device::CPU);
    int64_t mismatched = 0;
    for (int64_t i = 0; i < T * C; ++i) mismatched += ids_h.data<int32_t>()[i] != ids_ref.data<int32_t>()[i];
    EXPECT_EQ(mismatched, 0) << c.name;
    EXPECT_LT(rel_error(w, w_ref), 1e-5) << c.name;
  }
}

ops::ExpertWeights to_device(const ops::ExpertWeights& e) {
  ops::ExpertWeights out;
  auto move = [](const std::vector<ops::Weight>& ws, std::vector<ops::Weight>& dst) {
    for (const auto& w : ws) {
      ops::Weight g = w;
      g.w = w.w.to(Device::CUDA);
      if (w.scale_inv.defined()) g.scale_inv = w.scale_inv.to(Device::CUDA);
      dst.push_back(g);
    }
  };
  move(e.gate, out.gate), move(e.up, out.up), move(e.down, out.down);
  return out;
}

// T = 1 and 100 take the grouped device path (device-side sort, weight-streaming products);
// T = 300, above kGroupedMaxTokens (128), the host-sorted tensor-core path: cuBLASLt in BF16
// (FP8 blocks dequantised), or in Fp8Gemm mode the FP8 block-scaled GEMM whose activations are
// rounded to e4m3 per 1x128 group (the FP8 bound, 5e-2: test_cuda_fp8_gemm.cpp says why). Both
// dtypes on each, FP8 in both modes.
TEST(CudaOps, MoeExpertsMatchCpu) {
  MS_REQUIRE_CUDA();
  const int64_t H = 1024, I = 512, K = 4;
  const int E = 16;
  // T = 64 with every token's first choice expert 3: one expert's 64 rows take two passes over
  // its weights in the grouped product (32 rows a pass).
  for (auto [T, skewed] : std::vector<std::pair<int64_t, bool>>{{1, false}, {100, false}, {300, false}, {64, true}})
  for (int variant : {0, 1, 2}) {  // bf16; fp8 dequantised; fp8 through the FP8 GEMM
    const bool fp8 = variant > 0;
    const cuda::Fp8Mode mode = variant == 2 ? cuda::Fp8Mode::Fp8Gemm : cuda::Fp8Mode::Dequant;
    ops::ExpertWeights ex;
    for (int e = 0; e < E; ++e) {
      if (fp8) {
        ex.gate.push_back(random_fp8(I, H).cpu), ex.up.push_back(random_fp8(I, H).cpu);
        ex.down.push_back(random_fp8(H, I).cpu);
      } else {
        ex.gate.push_back({host_as(randn({I, H}, 0.03f), DType::BF16)});
        ex.up.push_back({host_as(randn({I, H}, 0.03f), DType::BF16)});
        ex.down.push_back({host_as(randn({H, I}, 0.04f), DType::BF16)});
      }
    }
    Tensor x = randn({T, H}), ids = Tensor::empty(DType::I32, {T, K}), w = Tensor::empty(DType::F32, {T, K});
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::uniform_real_distribution<float> wd(0.1f, 1.0f);
    for (int64_t t = 0; t < T; ++t) {
      std::shuffle(all.begin(), all.end(), rng());
      if (skewed) std::swap(*std::find(all.begin(), all.end(), 3), all[0]);
      for (int64_t j = 0; j < K; ++j) ids.data<int32_t>()[t * K + j] = all[j], w.data<float>()[t * K + j] = wd(rng());
    }
    Tensor ref = Tensor::empty(DType::F32, {T, H});
    cpu::moe_experts(x, ids, w, ex, ref);
    Tensor out = poisoned(DType::BF16, {T, H});
    cuda::set_fp8_mode(mode);
    cuda::moe_experts(gpu(x), ids.to(Device::CUDA), w.to(Device::CUDA), to_device(ex), out);
    cuda::set_fp8_mode(cuda::Fp8Mode::Dequant);
    const double tol = mode == cuda::Fp8Mode::Fp8Gemm && T > 128 ? 5e-2 : kBf16Tol;
    EXPECT_LT(rel_error(out, ref), tol) << "variant " << variant << " T=" << T << (skewed ? " skewed" : "");
  }
}

}  // namespace
}  // namespace ms
