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

// BF16 rows of x: x itself when BF16 with contiguous rows, else a converted scratch copy.
Tensor rows_bf16(const Tensor& x);

// out rows (row stride os, dtype out_dtype) = x[T, K] . w^T for a BF16 weight [N, K].
void gemm_xwT(const Tensor& x, const Tensor& w_bf16, void* out, DType out_dtype, int64_t os);

}  // namespace ms::cuda
