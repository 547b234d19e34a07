// The fused routing of a decode batch (cuda::moe_route: the router product, a warp a slab and
// part of K, in one cluster of blocks or over many, whose first or last block sums the parts,
// runs the top-k, then sorts the chosen pairs by expert) against the unfused path it replaces (cuda::linear into F32 logits,
// cuda::moe_topk, then moe_experts' own sort, align_kernel): ids and weights must be
// bit-identical in every routing variant, at T = 1, 3 and 8 (and past the fused sizes, where
// moe_route is that path), with any number of parts a block, over repeated launches (the block
// counter resets itself) and replayed from a captured step with new inputs each time; the sort
// must be the one align_kernel makes (row order within an expert aside), and a whole MoE layer's
// output bit-identical, eager and replayed, with one kernel for route, top-k and sort.
// MoeRouteBench prints fused vs unfused microseconds (graphed), routing alone and the whole
// layer, when MOESERVE_BENCH_ROUTE=1: the routing as the decode step runs it (after the norm
// that makes its input, launched early), its weight rotated over copies that L2 cannot hold.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms {
namespace {
using namespace test;

struct RouteCase {
  const char* name;
  int64_t E, H;
  ops::RouterParams p;
  bool bias = false;       // correction bias
  bool gate_bias = false;  // a bias on the router's linear
  bool fp8 = false;        // FP8-block router weight
  // Integer weights and one-hot inputs: logits are weight entries, so many are equal and the
  // tie rules (lower expert, lower group) decide.
  bool ties = false;
};

ops::RouterParams router(int k, ops::Scoring s, ops::GroupRank g, int ng, int tg, bool renorm, float scale,
                         int fused = 0, int pieces = 1) {
  ops::RouterParams p;
  p.top_k = k, p.scoring = s, p.group_rank = g, p.n_group = ng, p.topk_group = tg, p.renormalize = renorm;
  p.scale = scale, p.fused_shared_replicas = fused, p.fused_shared_pieces = pieces;
  return p;
}

using S = ops::Scoring;
using G = ops::GroupRank;
const std::vector<RouteCase> kCases = {
    {"qwen3 softmax greedy renorm", 128, 2048, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
    {"v2-lite softmax greedy top-6", 64, 2048, router(6, S::Softmax, G::None, 1, 1, false, 1.0f)},
    {"qwen2 60 experts, gate bias", 60, 1024, router(4, S::Softmax, G::None, 1, 1, false, 1.0f), false, true},
    // Hidden 512: 4 warps a block, so at T = 8 the last block's warps take two tokens each.
    {"v2 group_limited_greedy", 160, 512, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f)},
    {"v3 noaux_tc", 256, 7168, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true},
    {"v3 noaux_tc fused shared x4", 256, 2048, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f, 4), true},
    {"v2-lite fused shared x2 of 2 pieces", 64, 2048, router(6, S::Softmax, G::None, 1, 1, false, 1.0f, 2, 2)},
    {"v3 noaux_tc fp8 router", 256, 2048, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true, false, true},
    {"mixtral top-2 of 8", 8, 1024, router(2, S::Softmax, G::None, 1, 1, true, 1.0f)},
    {"sigmoid greedy no renorm", 32, 512, router(4, S::Sigmoid, G::None, 1, 1, false, 1.5f), true},
    // K = 1000: the last 64-wide chunk of K is partly past the row.
    {"64 experts, hidden 1000", 64, 1000, router(6, S::Softmax, G::None, 1, 1, false, 1.0f), false, true},
    // K = 128: two chunks for four warps' parts, two of them empty (zeros).
    {"16 experts, hidden 128", 16, 128, router(4, S::Softmax, G::None, 1, 1, true, 1.0f)},
    {"v3 noaux_tc hidden 7168 fused shared x8, fp8", 256, 7168, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f, 8),
     true, false, true},
    {"512 experts (unfused)", 512, 1024, router(10, S::Softmax, G::None, 1, 1, true, 1.0f)},
    {"qwen3 ties", 128, 2048, router(8, S::Softmax, G::None, 1, 1, true, 1.0f), false, false, false, true},
    {"v3 noaux_tc ties", 256, 2048, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), false, false, false, true},
    {"v2 group_limited_greedy ties", 160, 512, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f), false, false, false,
     true},
};

// One case's device tensors.
struct Router {
  ops::Weight gate;
  Tensor gate_bias, bias;
  const Tensor* gb() const { return gate_bias.defined() ? &gate_bias : nullptr; }
  const Tensor* cb() const { return bias.defined() ? &bias : nullptr; }
};

Router make_router(const RouteCase& c) {
  Router r;
  if (c.fp8) {
    r.gate = random_fp8(c.E, c.H, 0.01f).gpu;
  } else {
    Tensor w = randn({c.E, c.H}, 0.03f);
    if (c.ties)
      for (auto& v : w.span<float>()) v = std::round(v * 60.f);  // small integers, exact in bf16
    r.gate.w = gpu(w);
  }
  if (c.gate_bias) r.gate_bias = randn({c.E}, 0.5f).to(Device::CUDA);
  if (c.bias) r.bias = randn({c.E}, 0.3f).to(Device::CUDA);
  return r;
}

// Inputs x [T, H] (BF16 on the device): one-hot rows for a ties case (logits = a weight column).
Tensor make_inputs(const RouteCase& c, int64_t T) {
  Tensor x = randn({T, c.H});
  if (c.ties) {
    std::memset(x.raw(), 0, x.nbytes());
    for (int64_t t = 0; t < T; ++t) x.data<float>()[t * c.H + (t * 37) % c.H] = 1.0f;
  }
  return gpu(x);
}

void unfused(const Tensor& x, const Router& r, const ops::RouterParams& p, Tensor& ids, Tensor& w) {
  Tensor logits = cuda::scratch(DType::F32, {x.size(0), r.gate.out_features()});
  cuda::linear(x, r.gate, r.gb(), logits);
  cuda::moe_topk(logits, r.cb(), p, ids, w);
}

void poison(Tensor& t) { MS_CUDA(cudaMemsetAsync(t.raw(), 0xff, t.nbytes(), cuda::stream())); }

TEST(CudaMoeRoute, FusedMatchesUnfusedInEveryVariant) {
  MS_REQUIRE_CUDA();
  for (const auto& c : kCases) {
    const Router r = make_router(c);
    for (const int64_t T : {1, 3, 8, 9}) {  // 9: past the fused sizes
      const Tensor x = make_inputs(c, T);
      const int64_t C = c.p.columns();
      Tensor ids_ref = poisoned(DType::I32, {T, C}), w_ref = poisoned(DType::F32, {T, C});
      unfused(x, r, c.p, ids_ref, w_ref);
      Tensor ids = Tensor::empty(DType::I32, {T, C}, Device::CUDA), w = Tensor::empty(DType::F32, {T, C}, Device::CUDA);
      for (int rep = 0; rep < 3; ++rep) {  // a counter left set would leave the outputs poisoned
        poison(ids), poison(w);
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
        const std::string at = std::string(c.name) + " T=" + std::to_string(T) + " launch " + std::to_string(rep);
        EXPECT_EQ(bit_mismatches(ids, ids_ref), 0) << at;
        EXPECT_EQ(bit_mismatches(w, w_ref), 0) << at;
      }
      // The op interface reaches the same code.
      poison(ids), poison(w);
      ops::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
      EXPECT_EQ(bit_mismatches(ids, ids_ref), 0) << c.name << " T=" << T << " through ops::";
      EXPECT_EQ(bit_mismatches(w, w_ref), 0) << c.name << " T=" << T << " through ops::";
    }
  }
}

// Against the CPU op (F32 logits summed in another order): the same experts in the same order,
// weights within rounding. Random logits sit far apart next to F32 rounding, and tie cases sum
// small integers exactly on both. BF16 routers only: the GPU rounds scaled FP8 weights to bf16
// (~2^-9 each), the CPU keeps them in f32.
TEST(CudaMoeRoute, MatchesHostReference) {
  MS_REQUIRE_CUDA();
  for (const auto& c : kCases) {
    if (c.E > 256 || c.fp8) continue;
    const Router r = make_router(c);
    ops::Weight hg = r.gate;
    hg.w = r.gate.w.to(Device::CPU);
    const Tensor hgb = r.gate_bias.defined() ? r.gate_bias.to(Device::CPU) : Tensor();
    const Tensor hcb = r.bias.defined() ? r.bias.to(Device::CPU) : Tensor();
    for (const int64_t T : {1, 3, 8}) {
      const Tensor x = make_inputs(c, T);
      const int64_t C = c.p.columns();
      Tensor ids = poisoned(DType::I32, {T, C}), w = poisoned(DType::F32, {T, C});
      cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
      Tensor ids_ref = Tensor::empty(DType::I32, {T, C}), w_ref = Tensor::empty(DType::F32, {T, C});
      ops::moe_route(x.to(Device::CPU).to_f32(), hg, hgb.defined() ? &hgb : nullptr, hcb.defined() ? &hcb : nullptr,
                     c.p, ids_ref, w_ref);
      const std::string at = std::string(c.name) + " T=" + std::to_string(T);
      EXPECT_EQ(to_ids(ids.to(Device::CPU)), to_ids(ids_ref)) << at;
      EXPECT_LT(rel_error(w.to(Device::CPU), w_ref), 1e-5) << at;
    }
  }
}

// Restores the launch shape a test changed.
struct TuningGuard {
  cuda::GemvTuning saved = cuda::gemv_tuning();
  ~TuningGuard() { cuda::set_gemv_tuning(saved); }
};

// The many-block kernel (a tuned route_tasks takes it) with one to eight parts a block (a warp
// each), against the unfused path: the same ids and weights, every part summed once. The
// automatic shape (the other tests) is one cluster wherever a case has at most 64 tasks.
TEST(CudaMoeRoute, PartsPerBlockAgree) {
  MS_REQUIRE_CUDA();
  TuningGuard guard;
  for (const auto& c : kCases) {
    if (c.E > 256) continue;  // unfused anyway
    const Router r = make_router(c);
    for (const int64_t T : {1, 3, 8}) {
      const Tensor x = make_inputs(c, T);
      const int64_t C = c.p.columns();
      Tensor ids_ref = poisoned(DType::I32, {T, C}), w_ref = poisoned(DType::F32, {T, C});
      unfused(x, r, c.p, ids_ref, w_ref);
      for (const int per_block : {1, 2, 3, 8}) {
        cuda::GemvTuning t = guard.saved;
        t.route_tasks = per_block;
        cuda::set_gemv_tuning(t);
        Tensor ids = poisoned(DType::I32, {T, C}), w = poisoned(DType::F32, {T, C});
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
        const std::string at = std::string(c.name) + " T=" + std::to_string(T) + " parts a block " +
                               std::to_string(per_block);
        EXPECT_EQ(bit_mismatches(ids, ids_ref), 0) << at;
        EXPECT_EQ(bit_mismatches(w, w_ref), 0) << at;
      }
      cuda::set_gemv_tuning(guard.saved);
    }
  }
}

// Captured once, replayed with new inputs copied into x (and the outputs poisoned) each time.
TEST(CudaMoeRoute, ReplayedFromCapturedStep) {
  MS_REQUIRE_CUDA();
  for (const auto& c : {kCases[0], kCases[4], kCases[5]})
    for (const int64_t T : {1, 3, 8}) {
      const Router r = make_router(c);
      const int64_t C = c.p.columns();
      Tensor x = make_inputs(c, T);
      Tensor ids = Tensor::empty(DType::I32, {T, C}, Device::CUDA), w = Tensor::empty(DType::F32, {T, C}, Device::CUDA);
      auto body = [&] { cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w); };
      body();
      const StepShape step(T);
      auto pool = ops::make_graph_pool(Device::CUDA);
      auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool, body);
      for (int rep = 0; rep < 4; ++rep) {
        x.copy_from(make_inputs(c, T));
        Tensor ids_ref = poisoned(DType::I32, {T, C}), w_ref = poisoned(DType::F32, {T, C});
        unfused(x, r, c.p, ids_ref, w_ref);
        poison(ids), poison(w);
        graph->replay(step.arrays());
        const std::string at = std::string(c.name) + " T=" + std::to_string(T) + " replay " + std::to_string(rep);
        EXPECT_EQ(bit_mismatches(ids, ids_ref), 0) << at;
        EXPECT_EQ(bit_mismatches(w, w_ref), 0) << at;
      }
    }
}

// Checks a sort of ids [T, C] over experts [0, E) on the host: offsets, the active list and its
// count exactly as counted from ids; every pair at a row of its own expert's range, no row taken
// twice, the row's token the pair's. (Rows of one expert may come in any order.)
void expect_sort_of(const Tensor& ids, int E, const cuda::Permuted& p, const std::string& at) {
  const Tensor hi = ids.to(Device::CPU);
  const int64_t pairs = hi.numel(), C = hi.size(1);
  std::vector<int32_t> count(size_t(E), 0), active;
  for (int32_t e : hi.span<int32_t>()) {
    ASSERT_TRUE(e >= 0 && e < E) << at << ": expert " << e;
    ++count[size_t(e)];
  }
  const Tensor off = p.offsets.to(Device::CPU), act = p.active.to(Device::CPU), na = p.n_active.to(Device::CPU);
  const Tensor tor = p.token_of_row.to(Device::CPU), ro = p.row_of.to(Device::CPU);
  const int32_t* o = off.data<int32_t>();
  int32_t base = 0;
  for (int e = 0; e < E; ++e) {
    ASSERT_EQ(o[e], base) << at << ": offsets[" << e << "]";
    base += count[size_t(e)];
    if (count[size_t(e)] > 0) active.push_back(e);
  }
  ASSERT_EQ(o[E], base) << at << ": offsets[E]";
  ASSERT_EQ(na.data<int32_t>()[0], int32_t(active.size())) << at << ": n_active";
  for (size_t i = 0; i < active.size(); ++i) ASSERT_EQ(act.data<int32_t>()[i], active[i]) << at << ": active " << i;
  std::vector<bool> taken(size_t(pairs), false);
  for (int64_t i = 0; i < pairs; ++i) {
    const int32_t e = hi.data<int32_t>()[i], r = ro.data<int32_t>()[i];
    ASSERT_TRUE(r >= o[e] && r < o[e + 1]) << at << ": pair " << i << " (expert " << e << ") at row " << r;
    ASSERT_FALSE(taken[size_t(r)]) << at << ": row " << r << " taken twice";
    taken[size_t(r)] = true;
    ASSERT_EQ(tor.data<int32_t>()[r], int32_t(i / C)) << at << ": token of row " << r;
  }
}

// Every expert id a router names: the routed ones and the pieces of the shared expert's replicas.
int all_experts(const RouteCase& c) { return int(c.E) + c.p.fused_shared_experts(); }

void poison(cuda::Permuted& p) {
  for (Tensor* t : {&p.offsets, &p.active, &p.n_active, &p.token_of_row, &p.row_of}) poison(*t);
}

// The sort moe_route made in its kernel (taken by the first permute_on_device of its ids) is the
// one align_kernel makes of the same ids (the second, the first having taken it). Both are
// poisoned once checked, so the next case's sort cannot pass on stale memory.
TEST(CudaMoeRoute, FusedSortMatchesAlignKernel) {
  MS_REQUIRE_CUDA();
  for (const auto& c : kCases) {
    const Router r = make_router(c);
    const int E = all_experts(c);
    for (const int64_t T : {1, 2, 8, 9}) {
      const Tensor x = make_inputs(c, T);
      Tensor ids = poisoned(DType::I32, {T, c.p.columns()}), w = poisoned(DType::F32, {T, c.p.columns()});
      cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
      cuda::Permuted routed = cuda::permute_on_device(ids, 0, E);
      cuda::Permuted align = cuda::permute_on_device(ids, 0, E);
      const std::string at = std::string(c.name) + " T=" + std::to_string(T);
      expect_sort_of(ids, E, routed, at + " (routing's sort)");
      expect_sort_of(ids, E, align, at + " (align_kernel)");
      poison(routed), poison(align);
    }
  }
}

// A MoE layer's routed experts for a routing case: gate / up [I, H], down [H, I] in BF16 for
// experts [first, first + count) of all_experts(c) (count 0: all of them).
struct LayerCase {
  RouteCase route;
  int64_t I;
  int first = 0, count = 0;
};

ops::ExpertWeights make_experts(const LayerCase& lc) {
  const int total = all_experts(lc.route), n = lc.count > 0 ? lc.count : total;
  const int64_t H = lc.route.H, I = lc.I;
  ops::ExpertWeights ex;
  for (int e = 0; e < n; ++e) {
    ex.gate.push_back({gpu(randn({I, H}, 0.05f))}), ex.up.push_back({gpu(randn({I, H}, 0.05f))});
    ex.down.push_back({gpu(randn({H, I}, 0.08f))});
  }
  ex.first_expert = lc.first, ex.total_experts = total;
  return ex;
}

const std::vector<LayerCase> kLayers = {
    {{"qwen3 128 experts top-8", 128, 512, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)}, 128},
    {{"v2-lite 64 experts top-6", 64, 512, router(6, S::Softmax, G::None, 1, 1, false, 1.0f)}, 128},
    {{"v2 group_limited_greedy", 160, 512, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f)}, 128},
    {{"v3 noaux_tc fused shared x2", 256, 512, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f, 2), true}, 64},
    {{"v2-lite fused shared, 2 pieces", 64, 512, router(6, S::Softmax, G::None, 1, 1, false, 1.0f, 1, 2)}, 128},
    // Expert parallelism: this rank's experts are not all the router names, so moe_experts
    // sorts for itself.
    {{"v2-lite, experts 16..47 of 64", 64, 512, router(6, S::Softmax, G::None, 1, 1, false, 1.0f)}, 128, 16, 32},
};

// The layer's routed output, unfused: routing in two kernels, moe_experts' own sort.
Tensor unfused_layer(const Tensor& x, const Router& r, const LayerCase& lc, const ops::ExpertWeights& ex) {
  const int64_t T = x.size(0), C = lc.route.p.columns();
  Tensor ids = poisoned(DType::I32, {T, C}), w = poisoned(DType::F32, {T, C});
  unfused(x, r, lc.route.p, ids, w);
  Tensor out = poisoned(DType::BF16, {T, lc.route.H});
  cuda::moe_experts(x, ids, w, ex, out);
  return out;
}

TEST(CudaMoeRoute, FusedLayerMatchesUnfused) {
  MS_REQUIRE_CUDA();
  for (const auto& lc : kLayers) {
    const Router r = make_router(lc.route);
    const ops::ExpertWeights ex = make_experts(lc);
    const int64_t C = lc.route.p.columns();
    for (const int64_t T : {1, 2, 8}) {
      const std::string at = std::string(lc.route.name) + " T=" + std::to_string(T);
      const Tensor x = make_inputs(lc.route, T);
      const Tensor ref = unfused_layer(x, r, lc, ex);
      for (int via_ops = 0; via_ops < 2; ++via_ops) {
        Tensor ids = poisoned(DType::I32, {T, C}), w = poisoned(DType::F32, {T, C});
        Tensor out = poisoned(DType::BF16, {T, lc.route.H});
        if (via_ops) {
          ops::moe_route(x, r.gate, r.gb(), r.cb(), lc.route.p, ids, w);
          ops::moe_experts(x, ids, w, ex, out);
        } else {
          cuda::moe_route(x, r.gate, r.gb(), r.cb(), lc.route.p, ids, w);
          cuda::moe_experts(x, ids, w, ex, out);
        }
        EXPECT_EQ(bit_mismatches(out, ref), 0) << at << (via_ops ? " through ops::" : "");
      }
    }
    // Route, top-k and sort are one kernel where the experts are all the router names.
    const int64_t T = 8;
    const Tensor x = make_inputs(lc.route, T);
    Tensor ids = poisoned(DType::I32, {T, C}), w = poisoned(DType::F32, {T, C});
    Tensor out = poisoned(DType::BF16, {T, lc.route.H});
    auto fused = [&] {
      cuda::moe_route(x, r.gate, r.gb(), r.cb(), lc.route.p, ids, w);
      cuda::moe_experts(x, ids, w, ex, out);
    };
    auto split = [&] {
      unfused(x, r, lc.route.p, ids, w);
      cuda::moe_experts(x, ids, w, ex, out);
    };
    fused(), split();  // the expert table is built outside capture
    const int saved = lc.count > 0 ? 1 : 2;  // the top-k's kernel, and the sort's unless EP
    EXPECT_EQ(kernel_nodes(fused), kernel_nodes(split) - saved) << lc.route.name;
    if (lc.count == 0) {
      EXPECT_EQ(kernel_nodes([&] {
                  cuda::moe_route(x, r.gate, r.gb(), r.cb(), lc.route.p, ids, w);
                  cuda::permute_on_device(ids, 0, all_experts(lc.route));
                }),
                1)
          << lc.route.name;
    }
  }
}

// The layer captured once and replayed with new inputs: the routing's sort lives in the graph.
// Then a capture of moe_experts alone after an eager routing of the same ids: that routing's
// sort must not stand in for the one the graph has to make at each replay.
TEST(CudaMoeRoute, FusedLayerReplayedFromCapturedStep) {
  MS_REQUIRE_CUDA();
  for (const auto& lc : {kLayers[0], kLayers[3]})
    for (const int64_t T : {1, 2, 8}) {
      const std::string at = std::string(lc.route.name) + " T=" + std::to_string(T);
      const Router r = make_router(lc.route);
      const ops::ExpertWeights ex = make_experts(lc);
      const int64_t C = lc.route.p.columns();
      Tensor x = make_inputs(lc.route, T);
      Tensor ids = Tensor::empty(DType::I32, {T, C}, Device::CUDA), w = Tensor::empty(DType::F32, {T, C}, Device::CUDA);
      Tensor out = Tensor::empty(DType::BF16, {T, lc.route.H}, Device::CUDA);
      auto layer = [&] {
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), lc.route.p, ids, w);
        cuda::moe_experts(x, ids, w, ex, out);
      };
      layer();
      const StepShape step(T);
      auto pool = ops::make_graph_pool(Device::CUDA);
      auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool, layer);
      for (int rep = 0; rep < 3; ++rep) {
        x.copy_from(make_inputs(lc.route, T));
        const Tensor ref = unfused_layer(x, r, lc, ex);
        poison(out);
        graph->replay(step.arrays());
        EXPECT_EQ(bit_mismatches(out, ref), 0) << at << " replay " << rep;
      }

      cuda::moe_route(x, r.gate, r.gb(), r.cb(), lc.route.p, ids, w);  // eager: leaves its sort
      auto experts_only = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool,
                                            [&] { cuda::moe_experts(x, ids, w, ex, out); });
      for (int rep = 0; rep < 3; ++rep) {
        x.copy_from(make_inputs(lc.route, T));
        Tensor ids_new = poisoned(DType::I32, {T, C}), w_new = poisoned(DType::F32, {T, C});
        unfused(x, r, lc.route.p, ids_new, w_new);
        ids.copy_from(ids_new), w.copy_from(w_new);
        const Tensor ref = unfused_layer(x, r, lc, ex);
        poison(out);
        experts_only->replay(step.arrays());
        EXPECT_EQ(bit_mismatches(out, ref), 0) << at << " experts-only replay " << rep;
      }
    }
}


// A shared expert's products run beside the router and the routed experts (ops::Overlap::
// BesideLast, the MoE layer's decode order: norm, router, shared gate|up, routed experts, shared
// down, combine + norm) against the same launched after them: routing, activations, the shared
// down product and the layer's output and residual bit for bit, eager and replayed from a
// captured step, with x remade by a norm right before the router each time (a product that read x
// or the activations early would read the last round's). V2-Lite's shapes: 64 experts, top-6, a
// 2816-wide shared expert; routed experts of 704 (half V2-Lite's, to keep the weights small).
TEST(CudaMoeRoute, SharedExpertBesideTheRouterAndExpertsGivesTheSameBits) {
  MS_REQUIRE_CUDA();
  const RouteCase& c = kCases[1];
  const LayerCase lc{c, 704};
  const int64_t I = 2816, C = c.p.columns();
  const Router r = make_router(c);
  const ops::ExpertWeights ex = make_experts(lc);
  const ops::Weight gate{gpu(randn({I, c.H}, 0.03f))}, up{gpu(randn({I, c.H}, 0.03f))},
      down{gpu(randn({c.H, I}, 0.03f))};
  const Tensor norm_w = gpu(randn({c.H}, 0.2f)), next_w = gpu(randn({c.H}, 0.2f));
  struct Outputs {
    Tensor ids, w, act, shared, residual, out;
  };
  for (const int64_t T : {1, 3}) {
    auto outputs = [&] {
      return Outputs{poisoned(DType::I32, {T, C}),     poisoned(DType::F32, {T, C}),
                     poisoned(DType::BF16, {T, I}),    poisoned(DType::BF16, {T, c.H}),
                     poisoned(DType::BF16, {T, c.H}), poisoned(DType::BF16, {T, c.H})};
    };
    Tensor h = make_inputs(c, T), x = Tensor::empty(DType::BF16, {T, c.H}, Device::CUDA);
    Tensor h0 = Tensor::empty(DType::BF16, {T, c.H}, Device::CUDA);
    // The layer's order, its buffers allocated before the router runs (o: poisoned but for the
    // residual, which starts as h0).
    auto layer = [&](ops::Overlap overlap, Outputs& o) {
      o.residual.copy_from(h0);
      ops::rms_norm(h, norm_w, 1e-6f, x);
      ops::moe_route(x, r.gate, nullptr, nullptr, c.p, o.ids, o.w);
      ops::gated_linear(x, gate, up, false, o.act, overlap);
      const ops::ExpertRows routed = ops::moe_expert_rows(x, o.ids, o.w, ex);
      ops::linear(o.act, down, nullptr, o.shared, overlap);
      ops::moe_combine_add_rms_norm(routed, &o.shared, nullptr, false, o.residual, next_w, 1e-6f, o.out);
    };
    auto expect_same = [&](const Outputs& o, const Outputs& ref, const std::string& at) {
      EXPECT_EQ(bit_mismatches(o.ids, ref.ids), 0) << at;
      EXPECT_EQ(bit_mismatches(o.w, ref.w), 0) << at;
      EXPECT_EQ(bit_mismatches(o.act, ref.act), 0) << at;
      EXPECT_EQ(bit_mismatches(o.shared, ref.shared), 0) << at;
      EXPECT_EQ(bit_mismatches(o.residual, ref.residual), 0) << at;
      EXPECT_EQ(bit_mismatches(o.out, ref.out), 0) << at;
    };
    auto fresh_inputs = [&] { h.copy_from(make_inputs(c, T)), h0.copy_from(make_inputs(c, T)); };
    Outputs beside = outputs();
    for (int rep = 0; rep < 4; ++rep) {
      fresh_inputs();
      Outputs ref = outputs();
      layer(ops::Overlap::AfterLast, ref);
      layer(ops::Overlap::BesideLast, beside);
      expect_same(beside, ref, "T=" + std::to_string(T) + " eager " + std::to_string(rep));
      beside = outputs();
    }
    const StepShape step(T);
    auto pool = ops::make_graph_pool(Device::CUDA);
    auto graph = ops::capture_step(Device::CUDA, step.arrays(), T, 1, *pool,
                                   [&] { layer(ops::Overlap::BesideLast, beside); });
    for (int rep = 0; rep < 4; ++rep) {
      fresh_inputs();
      Outputs ref = outputs();
      layer(ops::Overlap::AfterLast, ref);
      for (Tensor* t : {&beside.ids, &beside.w, &beside.act, &beside.shared, &beside.out}) poison(*t);
      graph->replay(step.arrays());
      expect_same(beside, ref, "T=" + std::to_string(T) + " replay " + std::to_string(rep));
    }
  }
}

TEST(CudaMoeRoute, MoeRouteBench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_ROUTE");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_ROUTE=1 to time the routing";
  const std::vector<RouteCase> shapes = {
      {"qwen3-30b-a3b (128 experts top-8, hidden 2048)", 128, 2048, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
      {"v2-lite (64 experts top-6, hidden 2048)", 64, 2048, router(6, S::Softmax, G::None, 1, 1, false, 1.0f)},
      {"v3 (256 experts, 8 groups top-4, top-8, hidden 7168)", 256, 7168,
       router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true},
  };
  TuningGuard guard;
  for (const auto& c : shapes)
    for (const int64_t T : {1, 8}) {
      const Router r = make_router(c);
      const Tensor x = make_inputs(c, T);
      const int E = all_experts(c);
      Tensor ids = Tensor::empty(DType::I32, {T, c.p.columns()}, Device::CUDA);
      Tensor w = Tensor::empty(DType::F32, {T, c.p.columns()}, Device::CUDA);
      // As a decode step runs it: after the norm that makes its input (launched early, so the
      // routing's weight loads overlap it), its weight the next of `copies` that L2 (50 MB) cannot
      // hold together, as a step's experts evict it. Routing = (norm + routing) - norm alone.
      const int copies = int(std::max<int64_t>(16, (int64_t(96) << 20) / (c.E * c.H * 2)));
      std::vector<ops::Weight> gates(static_cast<size_t>(copies));
      for (auto& g : gates) {
        g.w = Tensor::empty(DType::BF16, {c.E, c.H}, Device::CUDA);
        g.w.copy_from(r.gate.w);
      }
      const Tensor x0 = make_inputs(c, T), norm_w = gpu(randn({c.H}, 0.1f));
      Tensor xn = Tensor::empty(DType::BF16, {T, c.H}, Device::CUDA);
      auto norm = [&] { cuda::rms_norm(x0, norm_w, 1e-6f, xn); };
      const double t_norm = graphed_us(T, norm, copies);
      size_t next = 0;
      auto after_norm = [&](auto&& route) {
        return graphed_us(T, [&] {
                 norm();
                 route(gates[next++ % gates.size()]);
               }, copies) - t_norm;
      };
      std::string shapes_us;
      for (const int per_block : {0, 1, 2, 4}) {
        cuda::GemvTuning t = guard.saved;
        t.route_tasks = per_block;
        cuda::set_gemv_tuning(t);
        const double us = after_norm([&](const ops::Weight& g) { cuda::moe_route(xn, g, r.gb(), r.cb(), c.p, ids, w); });
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f", us);
        shapes_us += (per_block ? ", " + std::to_string(per_block) : std::string("auto")) + ": " + buf;
      }
      cuda::set_gemv_tuning(guard.saved);
      const double split_mem = after_norm([&](const ops::Weight& g) {
        Router rg = r;
        rg.gate = g;
        unfused(xn, rg, c.p, ids, w);
      });
      std::printf("[bench] route after norm, weight from memory, %s T=%lld: fused (parts a block: us) %s; unfused "
                  "(product + topk_kernel) %.2f us; norm alone %.2f us (graphed, %d weight copies)\n",
                  c.name, (long long)T, shapes_us.c_str(), split_mem, t_norm, copies);
      // Back to back, the weight in L2: throughput rather than the step's critical path.
      const double fused = graphed_us(T, [&] { cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w); });
      const double split = graphed_us(T, [&] { unfused(x, r, c.p, ids, w); });
      std::printf("[bench] route %s T=%lld: fused %.2f us, unfused (product + topk_kernel) %.2f us (graphed)\n",
                  c.name, (long long)T, fused, split);
      // With the sort by expert moe_experts needs: in the routing's kernel (one kernel), after it
      // (align_kernel: two), or after the unfused routing (three).
      const double sorted = graphed_us(T, [&] {
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
        cuda::permute_on_device(ids, 0, E);
      });
      const double then_align = graphed_us(T, [&] {
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
        cuda::drop_routed_pairs();
        cuda::permute_on_device(ids, 0, E);
      });
      const double split_align = graphed_us(T, [&] {
        unfused(x, r, c.p, ids, w);
        cuda::permute_on_device(ids, 0, E);
      });
      std::printf("[bench] route+align %s T=%lld: one kernel %.2f us, fused route then align_kernel %.2f us, "
                  "unfused (product + topk_kernel + align_kernel) %.2f us (graphed)\n",
                  c.name, (long long)T, sorted, then_align, split_align);
    }
  // Whole routed layers (expert weights zero: streaming time does not depend on the values).
  const std::vector<std::pair<RouteCase, int64_t>> layers = {{shapes[0], 768}, {shapes[1], 1408}};
  for (const auto& [c, I] : layers) {
    const Router r = make_router(c);
    ops::ExpertWeights ex;
    for (int e = 0; e < all_experts(c); ++e) {
      ex.gate.push_back({Tensor::empty(DType::BF16, {I, c.H}, Device::CUDA)});
      ex.up.push_back({Tensor::empty(DType::BF16, {I, c.H}, Device::CUDA)});
      ex.down.push_back({Tensor::empty(DType::BF16, {c.H, I}, Device::CUDA)});
    }
    for (const int64_t T : {1, 8}) {
      const Tensor x = make_inputs(c, T);
      Tensor ids = Tensor::empty(DType::I32, {T, c.p.columns()}, Device::CUDA);
      Tensor w = Tensor::empty(DType::F32, {T, c.p.columns()}, Device::CUDA);
      Tensor out = Tensor::empty(DType::BF16, {T, c.H}, Device::CUDA);
      const double fused = graphed_us(T, [&] {
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
        cuda::moe_experts(x, ids, w, ex, out);
      });
      const double then_align = graphed_us(T, [&] {
        cuda::moe_route(x, r.gate, r.gb(), r.cb(), c.p, ids, w);
        cuda::drop_routed_pairs();
        cuda::moe_experts(x, ids, w, ex, out);
      });
      const double split = graphed_us(T, [&] {
        unfused(x, r, c.p, ids, w);
        cuda::moe_experts(x, ids, w, ex, out);
      });
      std::printf("[bench] moe layer %s intermediate %lld T=%lld: sort in the routing's kernel %.2f us, "
                  "fused route then align_kernel %.2f us, unfused routing %.2f us (graphed)\n",
                  c.name, (long long)I, (long long)T, fused, then_align, split);
    }
  }
}

}  // namespace
}  // namespace ms
