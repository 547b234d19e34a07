// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
#include "kernels/cuda/tensor_map.h"

#include <cudaTypedefs.h>

#include <mutex>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

CUtensorMap tiled_bf16_map(const void* address, int rank, const uint64_t* dims, const uint64_t* strides_bytes,
                           const uint32_t* box, const char* who) {
  static std::once_flag once;
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult found{};
    void* fn = nullptr;
    MS_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (fn && found == cudaDriverEntryPointSuccess) encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  });
  MS_CHECK(encode, who, ": the driver has no cuTensorMapEncodeTiled");
  MS_CHECK(rank >= 1 && rank <= 5 && box[0] == 64, who, ": a tensor map of rank ", rank, ", box ", box[0]);
  CUtensorMap map;
  cuuint64_t d[5], s[4];
  cuuint32_t b[5], unit[5];
  for (int i = 0; i < rank; ++i) d[i] = dims[i], b[i] = box[i], unit[i] = 1;
  for (int i = 0; i + 1 < rank; ++i) s[i] = strides_bytes[i];
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, cuuint32_t(rank), const_cast<void*>(address), d, s,
                            b, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MS_CHECK(r == CUDA_SUCCESS, who, ": cuTensorMapEncodeTiled failed (", int(r), ") for a rank-", rank, " map of ",
           dims[0], " x ", rank > 1 ? dims[1] : 1, " elements");
  return map;
}

}  // namespace ms::cuda
