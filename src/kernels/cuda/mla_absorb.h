// The MLA absorptions (mla_absorb_q, mla_expand_v of cuda_ops.h) at decode sizes: up to
// kMlaStreamMaxTokens tokens stream kv_b through kernels of their own, launched early
// (launch_pdl); more tokens, and weights those kernels do not read, take cuBLASLt.
#pragma once
#include <cstdint>

#include "kernels/ops.h"

namespace ms::cuda {

inline constexpr int64_t kMlaStreamMaxTokens = 8;

// Whether the streaming kernels may run (default on; MOESERVE_MLA_STREAM=0 keeps cuBLASLt at
// every size, for A/B timing).
void set_mla_streaming(bool on);
bool mla_streaming();

}  // namespace ms::cuda
