// FP8 block-scaled products on the tensor cores, DeepSeek-V3's recipe: activations quantised per
// token in 1x128 groups to e4m3 (scale = amax / 448, f32), weights e4m3 with an f32 scale per
// 128x128 block (weight_scale_inv), f32 accumulation. cuBLASLt's Hopper block scaling (VEC128
// activations times BLK128x128 weights) runs the product where it has an algorithm for the shape;
// this backend's own mma.sync kernel runs the rest.
#pragma once
#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// How FP8-block weights are multiplied, process-wide. Dequant (the default): activations stay
// BF16, the checkpoint's reference arithmetic; a few rows stream the weight (gemv.h, blocks
// dequantised in registers), more rows multiply a BF16 copy through cuBLASLt. Fp8Gemm: above the
// weight-streaming rows, DeepSeek's recipe, activations quantised per token and this block-scaled
// GEMM: 1.4-2x the dequantised path's rate at 4096 rows, but rounding every activation to
// e4m3 (2.6% rms per product) moves the FP8 fixture's logits by 0.10-0.15 against its fp32
// reference (bench/BENCHMARKS.md), past the 5e-2 the fixture test allows. Fp8GemmAllRows: the
// FP8 GEMM at every row count (tests); OwnKernel: as Fp8GemmAllRows, through the own kernel even
// where cuBLASLt has an algorithm.
enum class Fp8Mode { Dequant, Fp8Gemm, Fp8GemmAllRows, OwnKernel };
void set_fp8_mode(Fp8Mode mode);
Fp8Mode fp8_mode();
inline bool fp8_gemm_all_rows(Fp8Mode m) { return m == Fp8Mode::Fp8GemmAllRows || m == Fp8Mode::OwnKernel; }

// Quantised activation rows: q [rows, K] e4m3, row stride K. Rows come in segments (a dense
// product is one; each expert's rows in the MoE path another), each a multiple of 4 rows; a
// segment's scales lie column-major, [ceil(K / 128)][segment rows], from scales + start * groups:
// the layout cuBLASLt reads for 1x128 blocks.
struct Fp8Rows {
  Tensor q, scales;
  int64_t rows = 0, K = 0;
  int64_t groups() const { return (K + 127) / 128; }
};

// Rows of x [T, K] (BF16, contiguous rows) as one segment of T rounded up to 4 (zero pad rows).
Fp8Rows quantize_rows(const Tensor& x);

// Row r of the result is x[src[r]], or zeros where src[r] < 0; segment s spans rows
// [seg_start[s], seg_start[s + 1]), each a multiple of 4.
Fp8Rows quantize_segments(const Tensor& x, const std::vector<int32_t>& src, const std::vector<int64_t>& seg_start);

// Whether fp8_gemm takes this weight: e4m3 with F32 scales of block_k 128, K a multiple of 16,
// rows 16-byte aligned.
bool fp8_gemm_supported(const ops::Weight& w);

// out rows [0, rows) (row stride os, BF16 or F32) = rows [row0, row0 + rows) of x, a whole
// segment, times w^T.
void fp8_gemm(const Fp8Rows& x, int64_t row0, int64_t rows, const ops::Weight& w, void* out, DType out_dtype,
              int64_t os);

}  // namespace ms::cuda
