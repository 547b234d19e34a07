// rope_store_kv_attention_o_add_norm on the GPU. A batch-1 decode merges the attention's split-KV
// partials inside o's product (merge_project: a block a head and 512 output features) and sums
// the heads' products in the post-attention norm. It is checked against the same op with that
// path off (set_merge_project(false): the attention's merge kernel, o's product and the norm as
// before) and against the CPU op, eagerly and replayed from captured steps, over head counts
// 4 to 64, hidden sizes that leave a block partly empty, and 1 to 65 splits. With two splits or
// more the attention's output must be left unwritten (the merge happened in o's product); with
// one, the op takes the three kernels itself.
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/merge_project.h"
#include "layers/rope.h"

namespace ms {
namespace cuda {
// From kernels/cuda/flash_prefill.h, whose launch structs need the CUDA headers' bf16.
int flash_decode_splits(int64_t T, int64_t Hkv, int max_visible);
}  // namespace cuda
namespace {
using namespace test;

constexpr int64_t kD = 128;

struct Shape3 {
  int64_t hq, hkv, hidden;
  std::string name() const {
    return std::to_string(hq) + "/" + std::to_string(hkv) + " heads, hidden " + std::to_string(hidden);
  }
};

// One side's tensors: what the op reads and writes (GPU), from the same host values.
struct Side {
  Tensor qkv, kc, vc, residual, out, attn;
};

struct Inputs {
  Shape3 s;
  int64_t pool;
  Tensor qkv, kc, vc, residual;  // host F32
  ops::Weight o_gpu, o_cpu;
  Tensor norm_gpu, norm_cpu, qn_gpu, kn_gpu, qn_cpu, kn_cpu;

  Inputs(Shape3 shape, int64_t pool_rows) : s(shape), pool(pool_rows) {
    qkv = randn({1, (s.hq + 2 * s.hkv) * kD}), kc = randn({pool, s.hkv, kD}), vc = randn({pool, s.hkv, kD});
    residual = randn({1, s.hidden});
    const Tensor o = randn({s.hidden, s.hq * kD}, 0.03f), norm = randn({s.hidden}, 0.5f);
    const Tensor qn = randn({kD}, 0.5f), kn = randn({kD}, 0.5f);
    o_gpu.w = gpu(o), o_cpu.w = host_as(o, DType::BF16).to_f32();
    norm_gpu = gpu(norm), norm_cpu = host_as(norm, DType::BF16).to_f32();
    qn_gpu = gpu(qn), kn_gpu = gpu(kn), qn_cpu = host_as(qn, DType::BF16).to_f32();
    kn_cpu = host_as(kn, DType::BF16).to_f32();
  }
  Side gpu_side() const {
    return {gpu(qkv).view({1, s.hq + 2 * s.hkv, kD}), gpu(kc), gpu(vc), gpu(residual),
            poisoned(DType::BF16, {1, s.hidden}), poisoned(DType::BF16, {1, s.hq, kD})};
  }
  Side cpu_side() const {
    auto bf = [](const Tensor& t) { return host_as(t, DType::BF16).to_f32(); };
    return {bf(qkv).view({1, s.hq + 2 * s.hkv, kD}), bf(kc), bf(vc), bf(residual),
            Tensor::empty(DType::F32, {1, s.hidden}), Tensor::empty(DType::F32, {1, s.hq, kD})};
  }
};

// The new token of a one-query layout: its position and its cache slot (the layout's last key).
struct NewToken {
  std::vector<int32_t> pos, loc;
  explicit NewToken(const ops::AttentionLayout& l)
      : pos{l.kv_start[1] - 1}, loc{l.kv_slots[size_t(l.kv_start[1] - 1)]} {}
};

template <class Op>
void run_op(Op op, const Inputs& in, Side& side, const RopeTable& table, const ops::AttentionLayout& layout,
            const NewToken& tok, bool on_gpu) {
  const int64_t hq = in.s.hq, hkv = in.s.hkv;
  Tensor q = side.qkv.slice(1, 0, hq);
  const ops::HeadNorm norms{on_gpu ? in.qn_gpu : in.qn_cpu, on_gpu ? in.kn_gpu : in.kn_cpu, 1e-6f};
  op(q, side.qkv.slice(1, hq, hq + hkv), side.qkv.slice(1, hq + hkv, hq + 2 * hkv), table.at(tok.pos),
     std::span<const int32_t>(tok.loc), !on_gpu, side.kc, side.vc, &norms, layout, 0.088f, side.attn,
     ops::PostAttention{on_gpu ? in.o_gpu : in.o_cpu, side.residual, on_gpu ? in.norm_gpu : in.norm_cpu, 1e-6f,
                        side.out});
}

void gpu_op(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& r, std::span<const int32_t> slots,
            bool round, Tensor& kc, Tensor& vc, const ops::HeadNorm* n, const ops::AttentionLayout& l, float scale,
            Tensor& attn, const ops::PostAttention& post) {
  cuda::rope_store_kv_attention_o_add_norm(q, k, v, r, slots, round, kc, vc, n, l, scale, attn, post);
}
void cpu_op(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& r, std::span<const int32_t> slots,
            bool round, Tensor& kc, Tensor& vc, const ops::HeadNorm* n, const ops::AttentionLayout& l, float scale,
            Tensor& attn, const ops::PostAttention& post) {
  cpu::rope_store_kv_attention_o_add_norm(q, k, v, r, slots, round, kc, vc, n, l, scale, attn, post);
}

// The merged side against the side with three kernels: the caches bit for bit (the same decode
// kernel wrote them), the residual and the normed row within a few BF16 roundings (the heads'
// products are summed in another order, and the merge runs over 8 warps instead of 16).
void expect_close(const Side& merged, const Side& apart, bool split, const std::string& what) {
  EXPECT_EQ(bit_mismatches(merged.kc, apart.kc), 0) << what << ": key cache";
  EXPECT_EQ(bit_mismatches(merged.vc, apart.vc), 0) << what << ": value cache";
  EXPECT_LT(rel_error(merged.residual, apart.residual), 4e-3) << what << ": residual";
  EXPECT_LT(rel_error(merged.out, apart.out), 8e-3) << what << ": normed";
  const Tensor poison = poisoned(DType::BF16, merged.attn.shape());
  if (split) EXPECT_EQ(bit_mismatches(merged.attn, poison), 0) << what << ": the attention's output was written";
  else EXPECT_EQ(bit_mismatches(merged.attn, apart.attn), 0) << what << ": one split, the three kernels";
}

TEST(CudaMergeProject, MatchesTheThreeKernelsAndTheCpu) {
  MS_REQUIRE_CUDA();
  const RopeTable table = RopeTable::build(int(kD), 1e6, 16384, false);
  const RopeTable table_gpu = table.to(Device::CUDA);
  struct Case {
    Shape3 s;
    int keys;
  };
  // Qwen3-30B-A3B's 32/4 heads and hidden 2048 at 33 (one split), 200, 1056, 4096 and 8300 keys
  // (65 splits: two passes of the 8 warps' merge); 16/4 heads into 1280 (the third block's
  // last 256 rows past N); 4/4 (four groups of one slab); 64/4 (eight groups of eight).
  const std::vector<Case> cases = {{{32, 4, 2048}, 33},   {{32, 4, 2048}, 200},  {{32, 4, 2048}, 1056},
                                   {{32, 4, 2048}, 4096}, {{32, 4, 2048}, 8300}, {{16, 4, 1280}, 4096},
                                   {{4, 4, 256}, 3000},   {{64, 4, 2048}, 2000}};
  for (const Case& c : cases) {
    const Inputs in(c.s, c.keys + 500);
    ASSERT_TRUE(cuda::merge_project_takes(c.s.hq, in.o_gpu)) << c.s.name();
    const auto layout = make_layout({{1, c.keys}}, int(in.pool));
    const NewToken tok(layout);
    const bool split = cuda::flash_decode_splits(1, c.s.hkv, c.keys) > 1;
    const std::string what = c.s.name() + ", " + std::to_string(c.keys) + " keys";
    Side merged = in.gpu_side(), apart = in.gpu_side(), host = in.cpu_side();
    cuda::set_merge_project(true);
    run_op(gpu_op, in, merged, table_gpu, layout, tok, true);
    cuda::set_merge_project(false);
    run_op(gpu_op, in, apart, table_gpu, layout, tok, true);
    cuda::set_merge_project(true);
    run_op(cpu_op, in, host, table, layout, tok, false);
    expect_close(merged, apart, split, what);
    EXPECT_LT(rel_error(merged.out, host.out), 1e-2) << what << ": against the CPU";
    EXPECT_LT(rel_error(merged.residual, host.residual), 1e-2) << what << ": residual against the CPU";
  }
}

// Captured at 4096 keys (the splits come from the capture's max_kv), each side in its own graph,
// replayed at other lengths: a single key (all but one split empty), a short and a long one.
TEST(CudaMergeProject, ReplayedStepsMatchTheThreeKernels) {
  MS_REQUIRE_CUDA();
  const RopeTable table = RopeTable::build(int(kD), 1e6, 16384, false).to(Device::CUDA);
  const Shape3 s{32, 4, 2048};
  const Inputs in(s, 5000);
  const auto captured = make_layout({{1, 4096}}, int(in.pool));
  const NewToken tok(captured);
  const std::vector<int32_t> ids(1, 0);
  Side merged = in.gpu_side(), apart = in.gpu_side();
  auto graph_pool = ops::make_graph_pool(Device::CUDA);
  const ops::StepArrays arrays{ids, tok.pos, tok.loc, &captured};
  auto capture = [&](Side& side, bool on) {
    cuda::set_merge_project(on);
    run_op(gpu_op, in, side, table, captured, tok, true);  // eagerly first, as the runner does
    auto graph = ops::capture_step(Device::CUDA, arrays, 4096, 4096, *graph_pool,
                                   [&] { run_op(gpu_op, in, side, table, captured, tok, true); });
    cuda::set_merge_project(true);
    return graph;
  };
  auto graph_merged = capture(merged, true), graph_apart = capture(apart, false);
  for (const int keys : {1, 50, 3000, 4096}) {
    const auto layout = make_layout({{1, keys}}, int(in.pool));
    const NewToken t2(layout);
    const Side fresh = in.gpu_side();
    for (Side* side : {&merged, &apart}) {
      side->kc.copy_from(fresh.kc), side->vc.copy_from(fresh.vc), side->residual.copy_from(fresh.residual);
      side->qkv.copy_from(fresh.qkv), side->attn.copy_from(fresh.attn);
    }
    graph_merged->replay(ops::StepArrays{ids, t2.pos, t2.loc, &layout});
    graph_apart->replay(ops::StepArrays{ids, t2.pos, t2.loc, &layout});
    expect_close(merged, apart, true, "replayed at " + std::to_string(keys) + " keys");
  }
}

}  // namespace
}  // namespace ms
