// The batch-1 post-attention norm with the MoE router in its cluster (slabs_sum_add_rms_norm_route:
// norm_route_cluster_kernel) against the norm's kernel and the router's kernel one after the
// other (slabs_sum_add_rms_norm, then cuda::moe_route): the residual, the normed row, the ids, the
// weights and the sort of the chosen pairs bit for bit, over routing rules, hidden sizes that give
// the cluster 4, 5 or 8 blocks, and 8 to 64 slabs. Where the cluster cannot hold the router's
// tasks it declines and writes nothing.
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/merge_project.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms {
namespace {
using namespace test;

using S = ops::Scoring;
using G = ops::GroupRank;

ops::RouterParams router(int k, S s, G g, int ng, int tg, bool renorm, float scale, int fused = 0, int pieces = 1) {
  ops::RouterParams p;
  p.top_k = k, p.scoring = s, p.group_rank = g, p.n_group = ng, p.topk_group = tg, p.renormalize = renorm;
  p.scale = scale, p.fused_shared_replicas = fused, p.fused_shared_pieces = pieces;
  return p;
}

struct Case {
  const char* name;
  int64_t E, H, slabs;
  ops::RouterParams p;
  bool bias = false, gate_bias = false;
};

// The device tensors of one side: what the ops write, from the same values.
struct Side {
  Tensor residual, out, ids, weights;
};

struct Inputs {
  Case c;
  Tensor slabs, residual, norm;
  ops::Weight gate;
  Tensor gate_bias, bias;
  explicit Inputs(const Case& cs) : c(cs) {
    slabs = randn({c.slabs, c.H}, 0.2f).to(Device::CUDA), residual = randn({1, c.H});
    norm = gpu(randn({c.H}, 0.5f)), gate.w = gpu(randn({c.E, c.H}, 0.03f));
    if (c.gate_bias) gate_bias = randn({c.E}, 0.5f).to(Device::CUDA);
    if (c.bias) bias = randn({c.E}, 0.3f).to(Device::CUDA);
  }
  Side side() const {
    return {gpu(residual), poisoned(DType::BF16, {1, c.H}), poisoned(DType::I32, {1, c.p.columns()}),
            poisoned(DType::F32, {1, c.p.columns()})};
  }
  ops::RouteAfterNorm route(Side& s) const {
    return {gate, gate_bias.defined() ? &gate_bias : nullptr, bias.defined() ? &bias : nullptr, c.p, s.ids, s.weights};
  }
};

// The sort the routing kept for moe_experts (taken by the first permute_on_device), as tensors.
std::vector<Tensor> kept_sort(const Tensor& ids, int experts) {
  cuda::Permuted p = cuda::permute_on_device(ids, 0, experts);
  return {p.offsets, p.active, p.n_active, p.token_of_row, p.row_of};
}

TEST(CudaNormRoute, MatchesTheNormThenTheRouter) {
  MS_REQUIRE_CUDA();
  const std::vector<Case> cases = {
      {"qwen3: 32 heads' slabs, 128 experts top-8", 128, 2048, 32, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
      {"64 slabs", 128, 2048, 64, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
      {"8 slabs", 128, 2048, 8, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
      {"hidden 1280: 5 blocks of 13 tasks", 128, 1280, 16, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
      {"64 experts top-6, no renorm", 64, 2048, 32, router(6, S::Softmax, G::None, 1, 1, false, 1.0f)},
      {"sigmoid noaux_tc, correction bias", 64, 2048, 32, router(6, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true},
      {"group_limited_greedy", 64, 1024, 32, router(6, S::Softmax, G::Max, 8, 3, false, 16.0f)},
      {"60 experts, gate bias, hidden 1024", 60, 1024, 32, router(4, S::Softmax, G::None, 1, 1, false, 1.0f), false,
       true},
      {"fused shared x2 of 2 pieces", 64, 2048, 32, router(6, S::Softmax, G::None, 1, 1, false, 1.0f, 2, 2)},
  };
  for (const Case& c : cases) {
    const Inputs in(c);
    Side fused = in.side(), apart = in.side();
    const int experts = int(c.E) + c.p.fused_shared_experts();
    ASSERT_TRUE(cuda::slabs_sum_add_rms_norm_route(in.slabs, fused.residual, in.norm, 1e-6f, fused.out,
                                                   in.route(fused)))
        << c.name;
    const std::vector<Tensor> fused_sort = kept_sort(fused.ids, experts);
    cuda::slabs_sum_add_rms_norm(in.slabs, apart.residual, in.norm, 1e-6f, apart.out);
    const ops::RouteAfterNorm r = in.route(apart);
    cuda::moe_route(apart.out, r.gate, r.gate_bias, r.bias, r.params, r.ids, r.weights);
    const std::vector<Tensor> apart_sort = kept_sort(apart.ids, experts);
    EXPECT_EQ(bit_mismatches(fused.residual, apart.residual), 0) << c.name << ": residual";
    EXPECT_EQ(bit_mismatches(fused.out, apart.out), 0) << c.name << ": normed";
    EXPECT_EQ(bit_mismatches(fused.ids, apart.ids), 0) << c.name << ": ids";
    EXPECT_EQ(bit_mismatches(fused.weights, apart.weights), 0) << c.name << ": weights";
    for (size_t i = 0; i < fused_sort.size(); ++i)
      EXPECT_EQ(bit_mismatches(fused_sort[i], apart_sort[i]), 0) << c.name << ": sort tensor " << i;
  }
}

// Hidden 256 is one block of the norm: 64 router tasks do not fit its 16 warps. 256 experts make
// 128 tasks, more than a cluster's router takes. Both decline and leave every output unwritten.
TEST(CudaNormRoute, DeclinesWhatTheClusterCannotHold) {
  MS_REQUIRE_CUDA();
  for (const Case& c : {Case{"hidden 256", 128, 256, 32, router(8, S::Softmax, G::None, 1, 1, true, 1.0f)},
                        Case{"256 experts", 256, 2048, 32, router(8, S::Sigmoid, G::SumTop2, 8, 4, true, 2.5f), true}}) {
    const Inputs in(c);
    Side s = in.side();
    const Side untouched = in.side();
    EXPECT_FALSE(cuda::slabs_sum_add_rms_norm_route(in.slabs, s.residual, in.norm, 1e-6f, s.out, in.route(s)))
        << c.name;
    EXPECT_EQ(bit_mismatches(s.residual, untouched.residual), 0) << c.name << ": residual";
    EXPECT_EQ(bit_mismatches(s.out, untouched.out), 0) << c.name << ": normed";
    EXPECT_EQ(bit_mismatches(s.ids, untouched.ids), 0) << c.name << ": ids";
  }
}

}  // namespace
}  // namespace ms
