#include "parallel/parallel_config.h"

#include "core/check.h"

namespace ms {

void ParallelConfig::validate() const {
  MS_CHECK(tp_size >= 1 && dp_size >= 1 && ep_size >= 1, "--tp, --dp and --ep-size must be positive");
  MS_CHECK(tp_size % dp_size == 0, "--dp ", dp_size, " must divide --tp ", tp_size);
  MS_CHECK(dp_size == 1 || enable_dp_attention, "--dp ", dp_size,
           " needs --enable-dp-attention (data parallelism across processes is not supported)");
  MS_CHECK(tp_size % ep_size == 0, "--ep-size ", ep_size, " must divide --tp ", tp_size);
  MS_CHECK(moe_dense_tp_size == 0 || moe_dense_tp_size == 1, "--moe-dense-tp-size must be 1 or unset");
  MS_CHECK(moe_a2a_backend == "none" || moe_a2a_backend == "all2all", "--moe-a2a-backend must be none or all2all");
  MS_CHECK(moe_a2a_backend == "none" || ep_size == tp_size, "--moe-a2a-backend all2all needs --ep-size equal to --tp (",
           tp_size, ")");
  MS_CHECK(nnodes >= 1 && node_rank >= 0 && node_rank < nnodes, "--node-rank must be in [0, --nnodes)");
  MS_CHECK(tp_size % nnodes == 0, "--tp ", tp_size, " must split evenly over --nnodes ", nnodes);
  MS_CHECK(nnodes == 1 || !dist_init_addr.empty(), "--nnodes ", nnodes, " needs --dist-init-addr host:port");
  MS_CHECK(base_gpu_id >= 0, "--base-gpu-id must be non-negative");
}

RankLayout RankLayout::of(const ParallelConfig& c, int rank) {
  RankLayout l;
  l.rank = rank;
  const int attn_tp = c.attn_tp_size(), moe_tp = c.moe_tp_size();
  l.attn_tp_rank = rank % attn_tp;
  l.attn_dp_rank = rank / attn_tp;
  l.moe_tp_rank = rank % moe_tp;
  l.ep_rank = rank / moe_tp;
  l.dense_tp_rank = c.dense_tp_size() == 1 ? 0 : rank;
  return l;
}

}  // namespace ms
