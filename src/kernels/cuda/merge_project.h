// A batch-1 GQA decode's split merge inside the output projection (merge_project.cu), and the
// post-attention norm that sums its per-head outputs (norm.cu): rope_store_kv_attention_o_add_norm
// on the GPU.
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace ms::cuda {

struct SplitPartials;  // split_merge.cuh

// Whether merge_project takes one query of `hq` 128-dim heads projected by o (BF16 [N, hq * 128]).
// MOESERVE_MERGE_PROJECT=0 (read once) or set_merge_project(false): never.
bool merge_project_takes(int64_t hq, const ops::Weight& o);
void set_merge_project(bool on);

// One query's split-KV partials (rows: its hq heads, dv = 128) merged and projected by o into
// slabs [hq, N] (F32): slab h is head h's merged output (rounded to BF16, as the merge kernel
// stores it) times o's columns [128 h, 128 h + 128). A block takes one head and 512 output
// features: it copies their weights into shared memory (the last rows into registers) before it
// waits for the attention, so that o's weight streams while the attention runs; after the wait it
// merges its head's splits and multiplies. Needs merge_project_takes and at least two splits.
void merge_project(const SplitPartials& part, const ops::Weight& o, Tensor& slabs);

// residual [1, H] += the sum of slabs [S, H] (F32: S in groups of up to 8, each summed in order,
// then the groups in order, rounded to BF16 as a product's output); out = rms_norm(residual) *
// weight. One thread-block cluster (norm.cu, as the MoE combine + norm). False, with nothing
// launched, where it does not fit (H a multiple of 256 up to 2048; S up to 8 or a multiple of 8
// up to 96; BF16 rows).
bool slab_norm_takes(int64_t S, const Tensor& residual, const Tensor& weight, const Tensor& out);
void slabs_sum_add_rms_norm(const Tensor& slabs, Tensor& residual, const Tensor& weight, float eps, Tensor& out);

}  // namespace ms::cuda
