// Dense matrix products for the CUDA ops: cuBLASLt in BF16 with f32 accumulation (a plain
// kernel takes over for layouts no cuBLASLt algorithm accepts), cuBLASLt's FP8 block-scaled
// product (fp8_gemm.h builds on it), and the weight conversions that feed the BF16 product
// (f32/f16 weights rounded to bf16; fp8 blocks dequantised: the default FP8 mode, the MLA
// absorptions, and blocks the FP8 product does not take).
#pragma once
#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// A column-major BF16 operand: item b of a batch starts at ptr + b * batch_stride (elements);
// stored as rows x cols with leading dimension ld; `trans` applies op = transpose.
struct MatRef {
  const void* ptr;
  int64_t ld;
  int64_t batch_stride = 0;
  bool trans = false;
};

// D[m, n] = op(A)[m, k] . op(B)[k, n] for `batch` items, column-major, D in BF16 or F32
// with leading dimension ldd and batch stride d_batch_stride (elements).
void matmul(int64_t m, int64_t n, int64_t k, const MatRef& a, const MatRef& b, void* d, DType d_dtype, int64_t ldd,
            int64_t d_batch_stride = 0, int batch = 1);

// D[m, n] (column-major, BF16 or F32, leading dimension ldd) = A^T . B in e4m3 with block
// scales: A is the weight, stored k x m column-major (ld lda bytes), one f32 scale per 128x128
// block at a_scales[(i / 128) * (k / 128) + kb]; B is k x n (ld k), one scale per 128 of k at
// b_scales[kb * n + j]. k must be a multiple of 512 and n of 4, where the scale layouts leave no
// room for padding conventions. False when cuBLASLt has no algorithm for the problem
// (remembered per shape).
bool matmul_fp8_blocks(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const float* a_scales,
                       const void* b, const float* b_scales, void* d, DType d_dtype, int64_t ldd);

// The weight as BF16 [out, in] rows the tensor cores can read: the stored tensor when it is
// BF16 already, else a scratch copy (fp8 dequantised with its block scales).
Tensor weight_bf16(const ops::Weight& w);

// weight_bf16 for a weight that every call reads whole and that never changes (MLA's kv_b, which
// the absorbed decode multiplies by per head): FP8 blocks are dequantised once, by the first call,
// into a BF16 copy (weight_bf16's values) that every later call returns; other dtypes go to
// weight_bf16. The copy, and the weight it was made from (so that its memory cannot come back
// for another weight at the same address), are kept for the life of the process: a captured
// graph reads the copy's address. Cost, 2 bytes a weight on the weight's GPU: DeepSeek-V3's kv_b
// (128 heads x 256 rows x 512) is 33.5 MB a layer, 2.05 GB for 61 layers, beside 16.7 MB of FP8
// (SGLang keeps the same BF16 w_kc / w_vc). A graph capture cannot make it (nothing runs to fill
// it): an eager call first (CudaGraphRunner's warm-up step) must.
Tensor weight_bf16_kept(const ops::Weight& w);
// The copy weight_bf16_kept made for w, else weight_bf16(w).
Tensor weight_bf16_if_kept(const ops::Weight& w);
// Whether copies are kept (default on; MOESERVE_KEEP_BF16=0 turns it off): off, weight_bf16_kept
// is weight_bf16 and no kept copy is used, the behaviour tests compare with.
void set_keep_bf16(bool on);
bool keep_bf16();

// BF16 rows of x: x itself when BF16 with contiguous rows, else a converted scratch copy.
Tensor rows_bf16(const Tensor& x);

// out rows (row stride os, dtype out_dtype) = x[T, K] . w^T for a BF16 weight [N, K].
void gemm_xwT(const Tensor& x, const Tensor& w_bf16, void* out, DType out_dtype, int64_t os);

}  // namespace ms::cuda
