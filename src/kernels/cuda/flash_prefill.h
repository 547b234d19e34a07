// Prefill attention on the tensor cores (flash-attention style), for GQA heads of 128 dims and
// for absorbed MLA over DeepSeek's 512 + 64 latent cache: used by attention() / mla_attention()
// when the step's sequences bring many queries each (prefill, extend); decode steps keep the
// split-KV kernel of attention.cu.
#pragma once
#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// Whether the tensor-core kernel takes these shapes (head dims, strides and alignment).
bool flash_prefill_supported(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out);

// Same contract as ops::attention; the layout is on the host (not a captured step).
void flash_prefill(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const ops::AttentionLayout& layout,
                   float scale, Tensor& out);

bool flash_mla_supported(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const Tensor& out);

// Same contract as ops::mla_attention; the layout is on the host.
void flash_mla_prefill(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                       const ops::AttentionLayout& layout, float scale, Tensor& out);

}  // namespace ms::cuda
