// Linear layers on the GPU (the MLA absorptions: mla_absorb.cu). A few rows (decode, verify) stream the
// weight through the weight-streaming product of gemv.h, FP8 blocks dequantised in registers;
// FP8 blocks at 9..kFp8GroupedMaxRows rows take the tensor-core grouped_gemm_fp8 as one group
// (weights read once as bytes, dequantised in the kernel); more rows go to cuBLASLt in BF16 (FP8
// blocks dequantised into scratch first), or, when fp8_mode() asks for it, the block-scaled FP8
// product with the activations quantised per token (fp8_gemm.h). Activations are BF16,
// accumulation f32.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe_topk.cuh"

namespace ms::cuda {
namespace {

// out[t, n] = tmp[t, n] (+ bias[n]), rounded once into out's dtype.
template <class TO>
__global__ void add_bias(const float* tmp, const float* bias, int64_t T, int64_t N, TO* out, int64_t os) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * N) return;
  int64_t t = idx / N, n = idx % N;
  store_f(out + t * os + n, tmp[idx] + (bias ? bias[n] : 0.f));
}

void finish_rows(const Tensor& tmp, const Tensor* bias, int64_t T, int64_t N, Tensor& out) {
  const int threads = 256;
  const float* b = bias ? bias->data<float>() : nullptr;
  MS_FLOAT_DISPATCH(out.dtype(), TO,
                    add_bias<TO><<<blocks_for(T * N, threads), threads, 0, stream()>>>(
                        tmp.data<float>(), b, T, N, out.data<TO>(), out.strides()[0]));
  MS_CUDA_LAUNCHED("add_bias");
}

// FP8 blocks on the tensor cores. The product covers the rows rounded up to 4 (the quantised
// block's layout), so an odd row count or a bias goes through an f32 scratch first.
void linear_fp8(const Tensor& xb, const Weight& w, const Tensor* bias, Tensor& out) {
  const int64_t T = xb.size(0), N = w.out_features();
  Fp8Rows xq = quantize_rows(xb);
  if (!bias && xq.rows == T) return fp8_gemm(xq, 0, T, w, out.raw(), out.dtype(), out.strides()[0]);
  Tensor tmp = scratch(DType::F32, {xq.rows, N});
  fp8_gemm(xq, 0, xq.rows, w, tmp.raw(), DType::F32, N);
  finish_rows(tmp, bias, T, N, out);
}

// The streaming product feeds up to 32 rows a pass over the weight to its mmas, but re-reads
// the input rows for every 16 outputs, so beyond 8 BF16 rows cuBLASLt wins (64 rows through it
// slowed B = 64 decode by 28-37 %, bench/BENCHMARKS.md). FP8 blocks beyond 8 rows take
// grouped_gemm_fp8 (the streaming product is compute-bound there: one 64-row launch took 840 us
// for ~260 MB); with MOESERVE_FP8_GROUPED=0 they keep the streaming product up to two passes
// (kGemvMaxRowsFp8Old), whose alternative then dequantises the whole weight into scratch before
// the GEMM, 5 bytes of traffic a weight against the passes' 1 each.
constexpr int64_t kGemvMaxRowsBf16 = 8, kGemvMaxRowsFp8 = 8, kGemvMaxRowsFp8Old = 64;
// Rows up to which FP8 blocks take grouped_gemm_fp8 rather than dequantise + cuBLASLt. That path
// pays a fixed ~3 bytes of traffic a weight to dequantise, then cuBLASLt's rate; this one reads a
// byte a weight but its mma.sync runs at only ~150 TFLOP/s once the rows make it compute-bound.
// Measured on the H200 (BENCHMARKS, session 7, V3's dense FP8 linears): at 256 rows the other is
// 2.2-2.3x faster; at 64 the two are about even (this one 126 us for o_proj 16384 -> 7168, 45 for
// q_b, 25 for q_a|kv_a, 261 for the dense MLP's gate|up; the other, from its 256- and 1024-row
// times, ~116, ~50, ~28, ~268). So 64. Its wgmma shapes (grouped_gemm_fp8_wgmma_enabled) are
// 1.2-1.3x faster at 64 rows but still lose at 256 (session 8: o_proj 245 us against 177, the
// dense MLP's gate|up 503 against 390), so the bound stays 64 on a Hopper too.
constexpr int64_t kFp8GroupedMaxRows = 64;

// Whether the streaming product takes `w` for the rows of xb.
bool gemv_takes(const Tensor& xb, const Weight& w) {
  const int64_t T = xb.size(0), K = xb.size(1);
  const Tensor& wt = w.w;
  const int64_t fp8_max = grouped_gemm_fp8_enabled() ? kGemvMaxRowsFp8 : kGemvMaxRowsFp8Old;
  if (T > (w.is_fp8() ? fp8_max : kGemvMaxRowsBf16) || wt.strides()[1] != 1 || reinterpret_cast<uintptr_t>(wt.raw()) % 16 != 0 || !gemv_supported(K, wt.strides()[0], w.is_fp8(), xb.raw(), xb.strides()[0]))
    return false;
  if (w.is_fp8()) return gemv_fp8_block_k(w.block_k) && w.scale_inv.dtype() == DType::F32;
  return wt.dtype() == DType::BF16;
}

// A dense weight as the streaming product's single group.
GemvWeights gemv_weights(const Weight& w) {
  GemvWeights gw;
  gw.w_one = w.w.raw(), gw.ld = w.w.strides()[0], gw.fp8 = w.is_fp8(), gw.fetch_early = w.fetch_early;
  if (gw.fp8) {
    check_device_tensor(w.scale_inv, {DType::F32}, "linear", "weight_scale_inv");
    gw.s_one = w.scale_inv.data<float>(), gw.scale_ld = w.scale_inv.strides()[0];
    gw.block_n = w.block_n, gw.block_k = w.block_k;
  }
  return gw;
}

// Whether a product of x (as the bf16 rows xb) asked for `overlap` runs beside the kernel before
// (GemvInput::beside_last): not when x had to be converted, as the conversion is that kernel.
bool runs_beside(ops::Overlap overlap, const Tensor& x, const Tensor& xb) {
  return overlap == ops::Overlap::BesideLast && beside_allowed() && xb.raw() == x.raw();
}

bool try_gemv(const Tensor& xb, const Weight& w, const Tensor* bias, Tensor& out, const RouteTail* route,
              bool beside) {
  const int64_t T = xb.size(0), K = xb.size(1), N = w.out_features();
  if (!gemv_takes(xb, w)) return false;
  const GemvWeights gw = gemv_weights(w);
  GemvRows rows;
  rows.rows = int(T);
  GemvInput in{xb.data<bf16>(), xb.strides()[0]};
  in.beside_last = beside;
  GemvOutput o{out.raw(), out.dtype(), out.strides()[0], bias ? bias->data<float>() : nullptr};
  gemv(N, K, gw, rows, in, o, false, route);
  return true;
}

// gate and up in one pass of the streaming product (its SwiGLU form: both weights' rows side by
// side, the SiLU applied to the f32 sums), where each would take that product alone.
// beside: the product may run beside the kernel launched before it (ops::Overlap::BesideLast).
bool try_gated_gemv(const Tensor& xb, const Weight& gate, const Weight& up, Tensor& act, bool beside) {
  const Fp8Mode mode = fp8_mode();
  if (mode != Fp8Mode::Dequant && fp8_gemm_all_rows(mode) && (fp8_gemm_supported(gate) || fp8_gemm_supported(up)))
    return false;
  if (!gemv_takes(xb, gate) || !gemv_takes(xb, up) || act.strides()[1] != 1) return false;
  GemvWeights gw = gemv_weights(gate);
  const GemvWeights uw = gemv_weights(up);
  if (gw.fp8 != uw.fp8 || gw.ld != uw.ld || gw.scale_ld != uw.scale_ld || gw.block_n != uw.block_n ||
      gw.block_k != uw.block_k)
    return false;
  gw.w2_one = uw.w_one, gw.s2_one = uw.s_one;
  GemvRows rows;
  rows.rows = int(xb.size(0));
  GemvInput in{xb.data<bf16>(), xb.strides()[0]};
  in.beside_last = beside;
  gemv(gate.out_features(), xb.size(1), gw, rows, in, GemvOutput{act.raw(), act.dtype(), act.strides()[0]}, true);
  return true;
}

// FP8 blocks (128 x 128, F32 scales) through grouped_gemm_fp8 as one group of T rows; a bias is
// added in f32 before the one rounding, through an F32 scratch.
bool try_fp8_grouped(const Tensor& xb, const Weight& w, const Tensor* bias, Tensor& out) {
  const int64_t T = xb.size(0), K = xb.size(1), N = w.out_features();
  const Tensor& wt = w.w;
  if (!w.is_fp8() || !grouped_gemm_fp8_enabled() || T > kFp8GroupedMaxRows || w.block_n != 128 ||
      w.block_k != 128 || w.scale_inv.dtype() != DType::F32 || wt.strides()[1] != 1 ||
      reinterpret_cast<uintptr_t>(wt.raw()) % 16 != 0 || w.scale_inv.strides()[1] != 1 ||
      !grouped_gemm_fp8_supported(K, wt.strides()[0], xb.raw(), xb.strides()[0]) ||
      !grouped_gemm_fp8_fits(T, 1, grouped_gemm_fp8_tile(T, false).bm))
    return false;
  check_device_tensor(w.scale_inv, {DType::F32}, "linear", "weight_scale_inv");
  GroupedGemmArgs g;
  g.N = N, g.K = K, g.a = xb.raw(), g.a_ld = xb.strides()[0];
  g.w_one = wt.raw(), g.w_ld = wt.strides()[0], g.s_one = w.scale_inv.data<float>(), g.s_ld = w.scale_inv.strides()[0];
  g.max_rows = T;
  Tensor tmp;
  if (bias) tmp = scratch(DType::F32, {T, N});
  g.c = bias ? tmp.raw() : out.raw(), g.c_ld = bias ? N : out.strides()[0];
  g.c_f32 = bias || out.dtype() == DType::F32;
  grouped_gemm_fp8(g, false);
  if (bias) finish_rows(tmp, bias, T, N, out);
  return true;
}

// linear(), and with `route` only its streaming product (returning false, with nothing
// launched, where linear takes another path).
bool linear_rows(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out, const RouteTail* route,
                 ops::Overlap overlap = ops::Overlap::AfterLast) {
  const int64_t T = x.size(0), K = x.size(1), N = w.out_features();
  MS_CHECK(w.in_features() == K, "linear: input has ", K, " features, weight ", w.w.describe());
  MS_CHECK(out.dim() == 2 && out.size(0) == T && out.size(1) == N, "linear: output ", out.describe(), " for ", T, "x",
           N);
  check_device_tensor(out, {DType::BF16, DType::F32}, "linear", "output");
  MS_CHECK(out.strides()[1] == 1, "linear: output rows must be contiguous");
  if (T == 0) return route == nullptr;
  Tensor xb = rows_bf16(x);
  if (bias) {
    check_device_tensor(*bias, {DType::F32}, "linear", "bias");
    MS_CHECK(bias->numel() == N, "linear: bias ", bias->describe(), " for ", N, " outputs");
  }
  const Fp8Mode mode = fp8_mode();
  const bool fp8_gemm = mode != Fp8Mode::Dequant && fp8_gemm_supported(w);
  if (!(fp8_gemm && fp8_gemm_all_rows(mode)) && try_gemv(xb, w, bias, out, route, runs_beside(overlap, x, xb)))
    return true;
  if (route) return false;
  if (mode == Fp8Mode::Dequant && try_fp8_grouped(xb, w, bias, out)) return true;
  if (fp8_gemm) {
    linear_fp8(xb, w, bias, out);
    return true;
  }
  Tensor wb = weight_bf16_if_kept(w);  // MLA's kv_b in an expanded prefill: its kept copy
  if (!bias) {
    gemm_xwT(xb, wb, out.raw(), out.dtype(), out.strides()[0]);
    return true;
  }
  // The bias is added in f32 before the one rounding, as a fused epilogue would.
  Tensor tmp = scratch(DType::F32, {T, N});
  gemm_xwT(xb, wb, tmp.raw(), DType::F32, N);
  finish_rows(tmp, bias, T, N, out);
  return true;
}

}  // namespace

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out, ops::Overlap overlap) {
  linear_rows(x, w, bias, out, nullptr, overlap);
}

void gated_linear(const Tensor& x, const Weight& gate, const Weight& up, bool round_bf16, Tensor& act,
                  ops::Overlap overlap) {
  check_device_tensor(act, {DType::BF16, DType::F32}, "gated_linear", "output");
  const int64_t T = x.size(0), I = gate.out_features();
  if (T == 0) return;
  const Tensor xb = rows_bf16(x);
  if (try_gated_gemv(xb, gate, up, act, runs_beside(overlap, x, xb))) return;
  Tensor gu = scratch(act.dtype(), {T, 2 * I});
  Tensor g = gu.slice(1, 0, I), u = gu.slice(1, I, 2 * I);
  cuda::linear(x, gate, nullptr, g);
  cuda::linear(x, up, nullptr, u);
  if (round_bf16) round_to_bf16(gu);
  silu_and_mul(gu, act);
}

bool linear_then_topk(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& logits, const RouteTail& tail) {
  MS_CHECK(logits.dtype() == DType::F32 && logits.is_contiguous() && tail.tp.T == x.size(0) &&
               tail.tp.E == w.out_features() && tail.tp.ls == w.out_features(),
           "linear_then_topk: logits ", logits.describe(), " for a top-k of ", tail.tp.T, " x ", tail.tp.E);
  return linear_rows(x, w, bias, logits, &tail);
}

}  // namespace ms::cuda
