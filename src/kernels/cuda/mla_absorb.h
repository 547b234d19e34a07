// The MLA absorptions (mla_absorb_q, mla_expand_v of cuda_ops.h) at decode sizes: up to
// kMlaStreamMaxTokens tokens stream kv_b through kernels of their own, launched early
// (launch_pdl); more tokens, and weights those kernels do not read, take cuBLASLt.
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace ms::cuda {

// One token: on the H200 (session 12) the streaming kernels took 1.76 / 1.79 µs against cuBLASLt's
// 2.90 / 3.37 at 16 heads and 5.4 / 5.2 against 6.4 / 6.3 at 128, but at 8 tokens 5.2 / 8.3
// against 2.9 / 3.4 (16 heads) and 20.6 / 15.3 against 6.5 / 6.3 (128): their CUDA-core sums
// grow with the tokens where cuBLASLt's tensor cores do not.
inline constexpr int64_t kMlaStreamMaxTokens = 1;

// Whether the streaming kernels may run (default on; MOESERVE_MLA_STREAM=0 keeps cuBLASLt at
// every size, for A/B timing).
void set_mla_streaming(bool on);
bool mla_streaming();

struct SplitPartials;  // split_merge.cuh

// A decode step's MLA split-KV partials (rows [T, H], dv = L) merged and expanded by W_uv into
// out [T, H, v] in one kernel (mla_merge_expand_kernel): the bits of the merge kernel's latent
// through mla_expand_v. False, with nothing launched, where the streaming expansion would not
// run (more tokens, weights it does not read) or the shapes do not fit; the caller then merges
// and expands as two ops. MOESERVE_MLA_MERGE_EXPAND=0 (read once) or set_mla_merge_expand(false):
// never.
bool mla_merge_expand(const SplitPartials& part, int64_t T, const ops::Weight& kv_b, int nope, int v, Tensor& out);
void set_mla_merge_expand(bool on);

}  // namespace ms::cuda
