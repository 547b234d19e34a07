// One-launch grouped GEMM for the MoE experts at prefill: every expert's rows times its own
// BF16 weights on the tensor cores (mma.sync m16n8k16, f32 sums, BF16 out), the experts' row
// ranges read from device offsets, so the host never learns the row counts. The host-sorted
// path it replaces issued two cuBLASLt calls per selected expert (~380 a Qwen3-30B layer), and
// at 4096 tokens the host's issue time, not the GPU, set its pace.
//
// Plain pointer types only (no bf16): tests compiled by the host compiler include this header.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ms::cuda {

// For each expert e < experts with rows [offsets[e], offsets[e + 1]):
//   C[r, n] = A_r . W_e[n]                                  (swiglu false)
//   C[r, n] = silu(A_r . W_e[n]) * (A_r . W2_e[n])           (swiglu true: gate w, up w2)
// for n < N. A_r is row a_rows[r] of `a` when a_rows is given (the token of a permuted row:
// no gathered copy), else row r; rows have a_ld elements (BF16). W_e = w[e] (device array of
// device pointers), [N, K] BF16 with row stride w_ld; w2 likewise. C is BF16, row stride c_ld.
// max_rows bounds offsets[experts] (sizes the grid). Rows of no expert are left untouched.
struct GroupedGemmArgs {
  int64_t N = 0, K = 0;
  const void* a = nullptr;
  int64_t a_ld = 0;
  const int32_t* a_rows = nullptr;
  const void* const* w = nullptr;
  const void* const* w2 = nullptr;
  int64_t w_ld = 0;
  const int32_t* offsets = nullptr;
  int experts = 0;
  int64_t max_rows = 0;
  void* c = nullptr;
  int64_t c_ld = 0;
  // grouped_gemm_fp8 only. Weights FP8 e4m3 with F32 block scales s[e] (s2[e] for w2) of 128x128
  // blocks, [ceil(N / 128), ceil(K / 128)] with row stride s_ld. offsets null: one group of rows
  // [0, max_rows) whose weights are w_one / w2_one with scales s_one / s2_one (host-held device
  // pointers: a dense layer needs no device arrays). c_f32: C is F32 instead of BF16. bm: rows a
  // block tile, 0 for grouped_gemm_fp8_tile's choice: 16, 32 or 64 on mma.sync, or with wgmma
  // set 64 or 128 on Hopper's warpgroup MMAs (sm_90a only).
  const float* const* s = nullptr;
  const float* const* s2 = nullptr;
  const void* w_one = nullptr;
  const void* w2_one = nullptr;
  const float* s_one = nullptr;
  const float* s2_one = nullptr;
  int64_t s_ld = 0;
  bool c_f32 = false;
  int bm = 0;
  bool wgmma = false;
  bool act8 = false;  // with bm 64 and wgmma: the FP8-activation shape (Fp8RowTile)
};

// Whether the kernel takes these operands: K, the row strides of A and W multiples of 8
// elements and A 16-byte aligned (its tiles come in 16-byte copies). The weights' own alignment
// is the caller's (ExpertTable checks it). a null: alignment not checked (a scratch tensor).
bool grouped_gemm_supported(int64_t K, int64_t w_ld, const void* a, int64_t a_ld);

// Whether the grid over max_rows rows of `experts` groups fits a launch (65535 row tiles).
bool grouped_gemm_fits(int64_t max_rows, int experts);

// MOESERVE_GROUPED_GEMM=0 sends moe_experts' BF16 prefill back to the per-expert cuBLASLt calls
// (read at every call, so a test or bench can compare both).
bool grouped_gemm_enabled();

// The block tile shapes built, by name ("BMxBNxBK": 128x128x32, 128x128x64, 128x256x32,
// 128x256x64 on mma.sync; wgmma128x128x64, wgmma128x256x64 on Hopper's warpgroup MMAs, and
// tma128x256x64, persistent with weight tiles by tensor copies, sm_90a only); by default on a
// Hopper tma128x256x64 where experts get 128+ rows on average, else wgmma128x128x64; elsewhere
// 128x128x64. MOESERVE_GROUPED_GEMM_TILE=<name> picks one (read at every
// call: a captured graph keeps the shape it was captured with; an unknown name fails the call);
// set_grouped_gemm_tile overrides the environment for later calls ("" hands the choice back), so
// that one test or bench binary can check and time every shape.
std::vector<std::string> grouped_gemm_tiles();
void set_grouped_gemm_tile(const std::string& name);
// Whether the shape grouped_gemm would take now is a Hopper (wgmma or tma) one.
bool grouped_gemm_on_wgmma();

void grouped_gemm(const GroupedGemmArgs& args, bool swiglu);

// The same product with FP8-block weights (grouped_gemm_fp8.cu): each weight is read once as a
// byte, converted in the kernel and multiplied with BF16 activations on the tensor cores (f32
// sums): the mma.sync shapes count a weight as float(e4m3) * scale (the block scale on the
// sums), the wgmma shapes as bf16(float(e4m3) * scale), the value weight_bf16 gives. Takes K and
// w_ld multiples of 16 (its weight tiles come in 16-byte copies), a_ld of 8, A 16-byte aligned
// (a null: unchecked).
bool grouped_gemm_fp8_supported(int64_t K, int64_t w_ld, const void* a, int64_t a_ld);
bool grouped_gemm_fp8_fits(int64_t max_rows, int experts, int bm);
// The row tile (16, 32 or 64) for groups of `rows` rows: exactly (one dense group) or on
// average (experts, whose counts scatter around the mean; grouped_gemm_fp8.cu says why the
// choice then leaves room above it).
int grouped_gemm_fp8_bm(int64_t rows, bool mean);
// On a Hopper with MOESERVE_FP8_WGMMA not "0" (read at every call), groups from 33 rows (a mean
// of 22) take the wgmma shapes instead: BM 64 up to 64 rows (a mean of 42), 128 above.
bool grouped_gemm_fp8_wgmma_enabled();
// act8: the activations quantised to e4m3 too (per row and 128 columns, as DeepSeek's own
// inference and SGLang do), the products on FP8 wgmmas (BM 64; K a multiple of 128).
struct Fp8RowTile {
  int bm;
  bool wgmma;
  bool act8 = false;
};
// On a Hopper with MOESERVE_FP8_ACT8=1 (read at every call), every size takes the FP8-activation
// shape (BM 64) where K is a multiple of 128, the others their usual tile; off by default.
bool grouped_gemm_fp8_act8_enabled();
Fp8RowTile grouped_gemm_fp8_tile(int64_t rows, bool mean);
// MOESERVE_FP8_GROUPED=0 sends FP8 experts and linears back to the streaming GEMV and the
// dequantise-then-cuBLASLt paths (read at every call, so a test or bench can compare both).
bool grouped_gemm_fp8_enabled();
void grouped_gemm_fp8(const GroupedGemmArgs& args, bool swiglu);

}  // namespace ms::cuda
