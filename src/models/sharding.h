// Which part of each weight a rank loads, from the parallel flags (SGLang's semantics):
// attention heads over the attention-TP group, dense MLPs over TP (or whole with
// --moe-dense-tp-size 1), experts over EP ranks and each expert's intermediate dimension over
// moe_tp, the lm head's vocabulary over the attention-TP group. Each split carries the flags
// that avoid it, for the FP8 block-divisibility error.
#pragma once
#include <utility>

#include "layers/decoder_layer.h"
#include "models/weight_loader.h"
#include "parallel/groups.h"

namespace ms {

class Sharding {
 public:
  Sharding(const ParallelConfig& config, const RankLayout& layout) : c_(config), l_(layout) {}

  int attn_tp() const { return c_.attn_tp_size(); }
  int attn_rank() const { return l_.attn_tp_rank; }
  Shard attn(int dim, int64_t full) const {
    return Shard::split(dim, full, attn_rank(), attn_tp(), "--enable-dp-attention --dp N, so that attention TP (tp/dp) is smaller");
  }
  Shard dense(int dim, int64_t full) const {
    return Shard::split(dim, full, l_.rank, c_.dense_tp_size(), "--moe-dense-tp-size 1");
  }
  Shard expert(int dim, int64_t full) const {
    return Shard::split(dim, full, l_.moe_tp_rank, c_.moe_tp_size(), "--ep-size, so that each rank holds whole experts");
  }
  // Piece `piece` of a gated MLP whose intermediate dimension is pieces of `width` (the fused
  // shared expert): rows or columns [piece * width, (piece + 1) * width), split as a routed
  // expert's are.
  Shard expert_piece(int dim, int64_t width, int piece) const;
  Shard shared_expert(int dim, int64_t full) const {
    if (c_.moe_a2a_backend == "all2all") return {};  // all-to-all keeps it whole on every rank
    return Shard::split(dim, full, l_.rank, c_.tp_size, "shared-experts fusion, or a smaller --tp");
  }
  // [first, first + count) of `total` experts held by this rank.
  std::pair<int, int> local_experts(int total) const;
  // Replicas of the fused shared expert (0: not fused) for a family whose fusion is `valid`.
  int fused_shared_replicas(bool valid, bool by_default = true) const;

  FfnMode dense_mode() const { return c_.dense_tp_size() > 1 ? FfnMode::TensorParallel : FfnMode::Local; }
  FfnMode moe_mode() const {
    if (c_.tp_size == 1) return FfnMode::Local;
    return c_.moe_a2a_backend == "all2all" ? FfnMode::AllToAll : FfnMode::TensorParallel;
  }

 private:
  ParallelConfig c_;
  RankLayout l_;
};

}  // namespace ms
