// SGLang's parallelism flags and the rank layout they imply (world size = tp_size):
// attention TP = tp / dp with DP attention (else tp); MoE: experts split over ep ranks, each
// expert's intermediate dimension over moe_tp = tp / ep; dense layers sharded over tp, or
// replicated with --moe-dense-tp-size 1.
#pragma once
#include <string>

namespace ms {

struct ParallelConfig {
  int tp_size = 1;
  int dp_size = 1;
  bool enable_dp_attention = false;
  int ep_size = 1;
  int moe_dense_tp_size = 0;          // 0: unset (dense layers sharded over tp); 1: replicated
  std::string moe_a2a_backend = "none";  // "none": all-gather dispatch; "all2all": routed tokens only
  bool disable_shared_experts_fusion = false;
  int n_share_experts_fusion = 0;     // replicas of the fused shared expert (0: ep_size)
  int nnodes = 1, node_rank = 0;
  std::string dist_init_addr;
  int base_gpu_id = 0;                // this process's local rank i drives GPU base_gpu_id + i

  void validate() const;  // throws naming the flag for impossible combinations
  int attn_tp_size() const { return enable_dp_attention ? tp_size / dp_size : tp_size; }
  int moe_tp_size() const { return tp_size / ep_size; }
  int dense_tp_size() const { return moe_dense_tp_size == 1 ? 1 : tp_size; }
  bool dp_gather() const { return enable_dp_attention && dp_size > 1; }
  int ranks_per_node() const { return tp_size / nnodes; }
  int gpu_of(int local_rank) const { return base_gpu_id + local_rank; }
};

// Where one rank sits in every group.
struct RankLayout {
  int rank = 0;
  int attn_tp_rank = 0, attn_dp_rank = 0;
  int moe_tp_rank = 0, ep_rank = 0;
  int dense_tp_rank = 0;

  static RankLayout of(const ParallelConfig& c, int rank);
};

}  // namespace ms
