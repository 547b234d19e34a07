// Weights moved into L2 ahead of the product that reads them, on a side stream beside the
// latency-bound kernels in between (rope, attention and its merge, the router): a batch-1 decode
// step leaves HBM mostly idle there, and the product that follows then reads L2. The prefetches
// are TMA bulk prefetches (cp.async.bulk.prefetch.L2): fire and forget, a few blocks issue
// megabytes, nothing is written, so no result can change. The side stream forks from this
// thread's stream where a prefetch is asked for (it starts once the work queued before has
// finished) and joins it again before a graph capture ends, and outside capture at the next fork.
#pragma once
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/gemv.h"

namespace ms::cuda {

// Where prefetches are asked for; MOESERVE_L2_PREFETCH (a mask of these, read once; default all)
// turns them on and off for before/after timings in one binary.
enum PrefetchSite : unsigned {
  kPrefetchAskedWeights = 1,   // ops::prefetch_weight (attention's o_proj, after its first product)
  kPrefetchExpertDown = 2,     // the selected experts' down weights, once the router has chosen
  kPrefetchExpertGateUp = 4,   // the selected experts' gate and up weights, beside their own product
};
bool l2_prefetch_on(unsigned site);

// Asks L2 for the weight's bytes (and FP8 scales) once the work queued so far has finished.
void l2_prefetch_weight(const ops::Weight& w);

// Asks L2 for the weights of the groups in rows.active[0 .. *rows.n_active) (w, and w2 when
// `pair`), each [n, ld]; with `must_fit`, only when rows.max_groups of them fit in 3/4 of L2 (a
// batch whose experts would evict each other gains nothing and streams them twice). `keep` holds
// the device arrays the prefetch reads until it is joined.
void l2_prefetch_groups(const GemvWeights& w, bool pair, int64_t n, const GemvRows& rows, bool must_fit,
                        std::vector<Tensor> keep);

// Makes this thread's stream wait for the prefetches asked for so far (a graph capture must
// join every stream it forked before it ends).
void join_l2_prefetches();

}  // namespace ms::cuda
