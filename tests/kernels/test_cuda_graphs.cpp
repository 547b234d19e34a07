// Decode steps replayed from CUDA graphs against the same steps run op by op: the fixtures'
// models (GQA, MLA, FP8 blocks), batches padded to the captured size, several steps per graph
// (the staged metadata must change with every replay), and the padding slot left to dummies.
#include <cmath>
#include <cstring>
#include <random>

#include "cuda_test_util.h"
#include "runtime/cuda_graph_runner.h"

namespace ms {
namespace {
using namespace test;

// Sequence b owns slots [b * cap, (b + 1) * cap); `lens[b]` are cached; each gets `ids[b]`.
ForwardBatch batch_of(const std::vector<std::vector<int32_t>>& ids, const std::vector<int>& lens, int cap) {
  ForwardBatch fb;
  fb.attn.q_start = {0}, fb.attn.kv_start = {0};
  for (size_t b = 0; b < ids.size(); ++b) {
    for (size_t i = 0; i < ids[b].size(); ++i) {
      fb.input_ids.push_back(ids[b][i]);
      fb.positions.push_back(lens[b] + int(i));
      fb.out_cache_loc.push_back(int(b) * cap + lens[b] + int(i));
    }
    for (int p = 0; p < lens[b] + int(ids[b].size()); ++p) fb.attn.kv_slots.push_back(int(b) * cap + p);
    fb.attn.q_start.push_back(int32_t(fb.input_ids.size()));
    fb.attn.kv_start.push_back(int32_t(fb.attn.kv_slots.size()));
  }
  return fb;
}

Tensor eager(const CausalLM& m, KvCache& kv, const ForwardBatch& fb) {
  ForwardContext ctx{fb, kv};
  ctx.device = m.device, ctx.act_dtype = m.act_dtype;
  return m.forward(ctx).to_f32();
}

// Rows whose top logit leads the runner-up by more than `margin` must pick the same token
// (the graph's attention splits its keys differently, so near ties may resolve either way).
void expect_same_choices(const Tensor& got, const Tensor& want, float margin, const std::string& what) {
  const int64_t V = want.size(1);
  const auto g = ops::argmax_rows(got), w = ops::argmax_rows(want);
  for (int64_t r = 0; r < want.size(0); ++r) {
    const float* row = want.data<float>() + r * V;
    float second = -INFINITY;
    for (int64_t v = 0; v < V; ++v)
      if (v != w[r]) second = std::max(second, row[v]);
    if (row[w[r]] - second > margin) {
      EXPECT_EQ(g[r], w[r]) << what << " row " << r;
    }
  }
}

class CudaGraphTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGraphTest, ReplayedDecodeMatchesEager) {
  MS_REQUIRE_CUDA();
  LoadOptions o;
  o.device = Device::CUDA, o.act_dtype = DType::BF16, o.load_mtp = false;
  auto model = load_model(fixture_dir(GetParam()), o);
  const int cap = 64, steps = 4;
  std::uniform_int_distribution<int32_t> tok(0, model->config.vocab_size - 1);
  for (int B : {1, 3}) {  // 3 pads to a graph of 4
    KvCache kv_e = model->make_kv_cache(int64_t(B) * cap + 1), kv_g = model->make_kv_cache(int64_t(B) * cap + 1);
    CudaGraphRunner graphs(*model, kv_g, CudaGraphOptions{8, int32_t(B * cap), cap, false});
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(B));
    std::vector<int> lens(static_cast<size_t>(B), 0);
    for (int b = 0; b < B; ++b)
      for (int i = 0; i < 5 + 7 * b; ++i) prompts[b].push_back(tok(rng()));
    ForwardBatch pre = batch_of(prompts, lens, cap);
    Tensor le = eager(*model, kv_e, pre);
    eager(*model, kv_g, pre);
    for (int b = 0; b < B; ++b) lens[b] = int(prompts[b].size());
    for (int s = 0; s < steps; ++s) {
      std::vector<int32_t> next = ops::argmax_rows(le);
      std::vector<std::vector<int32_t>> one(static_cast<size_t>(B));
      for (int b = 0; b < B; ++b) one[b] = {next[b]};
      ForwardBatch fb = batch_of(one, lens, cap);
      auto lg = graphs.decode(fb);
      ASSERT_TRUE(lg.has_value()) << "B=" << B;
      Tensor g = lg->to_f32();
      le = eager(*model, kv_e, fb);
      EXPECT_LT(rel_error(g, le), 1e-2) << GetParam() << " B=" << B << " step " << s;
      expect_same_choices(g, le, 5e-2f, GetParam() + " B=" + std::to_string(B) + " step " + std::to_string(s));
      for (int b = 0; b < B; ++b) ++lens[b];
    }
  }
}

// Device tensors made after the captures (as an expert table built at a later eager forward, or
// a result kept from step to step) never lie in memory the replays rewrite: the graphs allocate
// from their own pool. Without it, freed intermediates of a capture are handed to these tensors.
TEST(CudaGraphPool, TensorsMadeAfterTheCapturesSurviveTheirReplays) {
  MS_REQUIRE_CUDA();
  LoadOptions o;
  o.device = Device::CUDA, o.act_dtype = DType::BF16, o.load_mtp = false;
  auto model = load_model(fixture_dir("deepseek-v3-tiny"), o);
  const int cap = 32, B = 4;
  KvCache kv = model->make_kv_cache(int64_t(B) * cap + 1);
  CudaGraphRunner graphs(*model, kv, CudaGraphOptions{B, int32_t(B * cap), cap, false});
  graphs.capture_all();
  std::vector<Tensor> host, kept;  // every block size the allocator hands out, up to 4 MiB
  for (int64_t n = 128; n <= (int64_t(1) << 20); n = n * 3 / 2) {
    Tensor h = Tensor::empty(DType::F32, {n}, Device::CPU);
    for (int64_t i = 0; i < n; ++i) h.data<float>()[i] = float(int64_t(host.size()) * 1000003 + i);
    kept.push_back(h.to(Device::CUDA));
    host.push_back(std::move(h));
  }
  std::vector<int> lens(B, 0);
  for (int s = 0; s < 3; ++s)
    for (int n : {1, 2, 3, 4}) {
      std::vector<std::vector<int32_t>> one(static_cast<size_t>(n), std::vector<int32_t>{7 + s});
      ASSERT_TRUE(graphs.decode(batch_of(one, std::vector<int>(lens.begin(), lens.begin() + n), cap)).has_value());
    }
  for (size_t t = 0; t < kept.size(); ++t) {
    Tensor back = kept[t].to(Device::CPU);
    EXPECT_EQ(0, std::memcmp(back.data<float>(), host[t].data<float>(), size_t(host[t].numel()) * sizeof(float)))
        << "tensor " << t << " of " << host[t].numel() << " floats was overwritten by a replay";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaGraphTest,
                         ::testing::Values("qwen3-moe-tiny", "deepseek-v2-lite-tiny", "deepseek-v3-fp8-tiny"));

}  // namespace
}  // namespace ms
