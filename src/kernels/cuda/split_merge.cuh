// The arithmetic of merging split-KV partials (a split's max m, in natural-log units, its sum l
// and its unnormalised output), shared by the merge kernels (attention.cu) and the merge that
// flash_decode_kernel runs itself, so that both give the same bits from the same partials. The
// multiply-adds are explicit FMAs: left to the compiler, `a * b + c * d` may be contracted one
// way in one kernel and the other way in another.
#pragma once
#include <cmath>

namespace ms::cuda {

// The weight of a split whose max is m in a merge whose max is M: 0 for a split without keys.
__device__ __forceinline__ float split_weight(float m, float M) { return m == -INFINITY ? 0.f : expf(m - M); }

// acc + w a: one term of a merge whose max is known up front (combine_few, and the final merge
// of combine_splits' warps).
__device__ __forceinline__ float add_weighted(float acc, float w, float a) { return __fmaf_rn(w, a, acc); }

// acc keep + a w: one split into an online merge (combine_splits' warps), the running sum
// rescaled by keep to the new max.
__device__ __forceinline__ float rescale_add(float acc, float keep, float a, float w) {
  return __fmaf_rn(acc, keep, a * w);
}

// combine_splits' warps each merge every kSplitWarps-th split online; the merge fused into
// flash_decode_kernel follows the same partition and order.
constexpr int kSplitWarps = 16;
// Up to this many splits merge in one pass with the max known up front (combine_few).
constexpr int kFewSplits = 16;

}  // namespace ms::cuda
