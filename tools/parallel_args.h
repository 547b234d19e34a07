// SGLang's parallelism flags, shared by every command that runs a model.
#pragma once
#include <CLI/CLI.hpp>

#include "parallel/parallel_config.h"

namespace ms::cli {

struct ParallelArgs {
  ParallelConfig config;
  bool enable_ep_moe = false;
  int moe_dense_tp_size = 0;

  void add(CLI::App* cmd) {
    cmd->add_option("--tp,--tp-size", config.tp_size, "tensor-parallel ranks (the world size)")->check(CLI::PositiveNumber);
    cmd->add_option("--dp,--dp-size", config.dp_size, "data-parallel attention groups (with --enable-dp-attention)")
        ->check(CLI::PositiveNumber);
    cmd->add_flag("--enable-dp-attention", config.enable_dp_attention, "attention on local tokens, attention TP = tp/dp");
    cmd->add_option("--ep-size,--ep", config.ep_size, "expert-parallel ranks (whole experts per rank)")
        ->check(CLI::PositiveNumber);
    cmd->add_flag("--enable-ep-moe", enable_ep_moe, "expert parallelism over all TP ranks (--ep-size = --tp)");
    cmd->add_option("--moe-dense-tp-size", moe_dense_tp_size, "1: dense layers whole on every rank (unset: sharded over TP)")
        ->check(CLI::IsMember({1}));
    cmd->add_option("--moe-a2a-backend", config.moe_a2a_backend, "MoE dispatch: none (all-gather) or all2all")
        ->check(CLI::IsMember({"none", "all2all"}));
    cmd->add_flag("--disable-shared-experts-fusion", config.disable_shared_experts_fusion,
                  "keep DeepSeek's shared expert out of the routed experts");
    cmd->add_option("--n-share-experts-fusion", config.n_share_experts_fusion,
                    "replicas of the fused shared expert, n_shared_experts experts each (default: --ep-size for V3/R1; DeepSeek-V2 fuses only when this is given)");
    cmd->add_option("--nnodes", config.nnodes, "nodes (one process each)")->check(CLI::PositiveNumber);
    cmd->add_option("--node-rank", config.node_rank, "this node's index")->check(CLI::NonNegativeNumber);
    cmd->add_option("--dist-init-addr", config.dist_init_addr, "host:port of node 0's rendezvous");
    cmd->add_option("--base-gpu-id", config.base_gpu_id, "GPU of this process's first rank (--device cuda)")
        ->check(CLI::NonNegativeNumber);
  }
  ParallelConfig resolved() const {
    ParallelConfig c = config;
    if (enable_ep_moe) c.ep_size = c.tp_size;
    c.moe_dense_tp_size = moe_dense_tp_size;
    c.validate();
    return c;
  }
  bool multi_rank() const { return config.tp_size > 1 || config.nnodes > 1; }
};

}  // namespace ms::cli
