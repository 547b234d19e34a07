// Tensor maps for the copy engine's tensor copies (cp.async.bulk.tensor, mbarrier.cuh's tma_load_*):
// BF16 tensors read in boxes whose inner extent is one 128-byte swizzle row (64 elements), 128-byte
// swizzled in shared memory as wgmma.cuh's layouts take them; elements outside the tensor read as zeros.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace ms::cuda {

// The map of the BF16 tensor at `address` (16-byte aligned) of `rank` dims, innermost first:
// `dims` elements each, `strides_bytes` the byte strides of dims 1 .. rank - 1 (multiples of 16),
// boxes of `box` elements (box[0] = 64). `who` names the caller in errors.
CUtensorMap tiled_bf16_map(const void* address, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                           const uint32_t* box, const char* who);

}  // namespace ms::cuda
