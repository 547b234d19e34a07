// Routed experts on the GPU. Up to kGroupedMaxTokens tokens (decode, and always under graph
// capture) stay on the device: one block sorts the (token, slot) pairs by expert (count, prefix
// sum, scatter) and lists the experts that have rows; one grouped product streams each listed
// expert's gate and up rows once and writes silu(gate) * up, a second its down rows; no host
// sync. A single token takes one kernel for both (moe_one_token.cu) where it fits. More tokens
// (prefill) with BF16 weights sort the pairs on the device too and run each projection as one
// grouped tensor-core GEMM over all experts (grouped_gemm.h), gate and up
// ending in SiLU-and-mul; FP8-block weights in the default Fp8Mode::Dequant take its FP8 sibling
// (grouped_gemm_fp8) from a mean of one row an expert up to 160 (320 on its wgmma shapes; any
// count above under capture), fewer rows the streaming product. Otherwise (more rows, shapes those kernels do not take,
// MOESERVE_GROUPED_GEMM=0 / MOESERVE_FP8_GROUPED=0) the pairs are sorted on the host and each
// selected expert's projections run over its contiguous rows: cuBLASLt in BF16 (FP8 blocks
// dequantised first), or, when fp8_mode() asks for it, the FP8 block-scaled product (fp8_gemm.h)
// with each expert's rows quantised as one segment. All end in the same kernel that sums each token's k outputs
// with their router weights in a fixed slot order (moe_expert_rows stops before it, for
// moe_combine_add_rms_norm in norm.cu to do that sum on its way into the residual add and norm).
//
// Prefill moves far more bytes than it multiplies (4096 tokens x 8 slots x 2048 hidden is 134 MB
// of gathered BF16 rows per layer): every intermediate there is BF16 (gathered tokens, the
// [gate | up] products, the down products), as the reference model computes them, and every
// data-moving kernel takes 16-byte accesses. The products accumulate in f32 inside the GEMM and
// are rounded once on the way out; the combine sums in f32.
#include <map>
#include <mutex>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms::cuda {

// Mean rows an expert up to which prefill takes the grouped GEMM (see moe_experts): with the
// wgmma shapes, and with mma.sync's.
constexpr int64_t kGroupedGemmMaxMeanRowsWgmma = 1024, kGroupedGemmMaxMeanRows = 384;
// The same bounds for FP8-block experts' grouped_gemm_fp8 (fp8_grouped_takes). From a mean of one
// row an expert: since session 41's cheaper conversion its BM 16 tile beats the streaming GEMV
// (V3's 32 EP8 experts graphed, session 43: a mean of 1 row 0.285 ms against 0.406, of 2 0.375
// against 0.455, of 4 0.447 against 0.643; the shard's layer at B = 8 and 16 −29 % and −27 %;
// session 7 had set 8, when the GEMV kept up with HBM below it). Above, the host path (sort,
// dequantise each expert into BF16 scratch, per-expert cuBLASLt) costs ~3.4 ms for V3's 32 EP8
// experts whatever the rows up to ~256 an expert, paced by the host; this kernel grows with the rows (its mma.sync is
// compute-bound at ~150 TFLOP/s). Measured on the H200 (BENCHMARKS, session 7): a mean of 64 rows
// 1.30 ms against 3.44, of 256 rows 4.55 against 3.41; linearly between, they cross near 190.
// Under graph capture the host path cannot run, so captures take this kernel at any size.
// On its wgmma shapes (grouped_gemm_fp8_wgmma_enabled), session 8: a mean of 64 rows 1.20 ms, of
// 256 3.02 ms against the host path's 3.43, of 1024 9.9 ms against 6.45; linearly between, they
// cross near 340, so 320.
constexpr int64_t kFp8GroupedMinMeanRows = 1, kFp8GroupedMaxMeanRows = 160;
constexpr int64_t kFp8GroupedMaxMeanRowsWgmma = 320;
namespace {

// Expert parallelism (ExpertWeights::first_expert / total()) is being added to ops.h alongside
// this backend; read it when the interface has it, so both sides can land in either order.
template <class X>
std::pair<int, int> local_range(const X& e) {
  if constexpr (requires { e.first_expert; }) return {e.first_expert, e.total()};
  else return {0, e.num_experts()};
}

constexpr int kGatherWarps = 8;  // rows a block, a warp each
constexpr int kGatherUnroll = 4;  // 16-byte loads a lane has in flight before it stores

// xe[r] = x[token_of_row[r]] (zeros for a pad row, token -1) in 16-byte pieces, W16 a row; a
// warp a row, so the row's token is read once and each lane keeps kGatherUnroll loads in flight.
__global__ void __launch_bounds__(kGatherWarps * 32) gather_rows_x16(const uint4* __restrict__ x, int64_t xs16,
                                                                     const int32_t* __restrict__ token_of_row,
                                                                     int64_t rows, int W16, uint4* __restrict__ xe) {
  const int64_t r = int64_t(blockIdx.x) * kGatherWarps + threadIdx.x / 32;
  if (r >= rows) return;
  const int lane = threadIdx.x % 32;
  const int32_t t = token_of_row[r];
  const uint4* src = x + int64_t(t < 0 ? 0 : t) * xs16;
  uint4* dst = xe + r * W16;
  for (int c0 = lane; c0 < W16; c0 += 32 * kGatherUnroll) {
    uint4 v[kGatherUnroll];
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u) {
      const int c = c0 + 32 * u;
      v[u] = t >= 0 && c < W16 ? src[c] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kGatherUnroll; ++u)
      if (c0 + 32 * u < W16) dst[c0 + 32 * u] = v[u];
  }
}

// The same an element a thread, for rows that are not 16-byte aligned.
__global__ void gather_rows_scalar(const bf16* x, int64_t xs, const int32_t* token_of_row, int64_t rows, int64_t H,
                                   bf16* xe) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * H) return;
  int64_t r = idx / H, i = idx % H;
  const int32_t t = token_of_row[r];
  xe[idx] = t >= 0 ? x[int64_t(t) * xs + i] : __float2bfloat16_rn(0.f);
}

// out[t] = sum_j weights[t, j] * ye[row_of[t, j]], j = 0..K-1 in order (pairs of other ranks'
// experts: row -1), summed in f32 and rounded once. Eight columns a thread (H8 = H / 8), each
// expert row read once with 16-byte loads.
template <class TY, class TO>
__global__ void combine_x8(const TY* __restrict__ ye, const int32_t* __restrict__ row_of,
                           const float* __restrict__ weights, int64_t T, int K, int64_t H8, TO* __restrict__ out,
                           int64_t os) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * H8) return;
  const int64_t t = idx / H8, i = (idx % H8) * 8;
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
  for (int j = 0; j < K; ++j) {
    const int32_t r = row_of[t * K + j];
    if (r < 0) continue;
    const float w = weights[t * K + j];
    float v[8];
    load8(ye + int64_t(r) * H8 * 8 + i, v);
#pragma unroll
    for (int c = 0; c < 8; ++c) acc[c] += w * v[c];
  }
  store8(out + t * os + i, acc);
}

// The same an element a thread, for widths or outputs the vector kernel cannot take.
template <class TY, class TO>
__global__ void combine_scalar(const TY* ye, const int32_t* row_of, const float* weights, int64_t T, int K, int64_t H,
                               TO* out, int64_t os) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * H) return;
  int64_t t = idx / H, i = idx % H;
  float acc = 0.f;
  for (int j = 0; j < K; ++j) {
    const int32_t r = row_of[t * K + j];
    if (r >= 0) acc += weights[t * K + j] * load_f(ye + int64_t(r) * H + i);
  }
  store_f(out + t * os + i, acc);
}

// The pairs (t, j) of this rank's experts [first, first + E) ordered by expert: token_of_row[r]
// is the token of permuted row r (-1: a pad row), row_of[t * K + j] the permuted row of pair
// (t, j) (-1 for another rank's expert), offsets[e] the first row of local expert e; each
// expert's rows are padded to a multiple of `pad`.
struct Permutation {
  std::vector<int32_t> token_of_row, row_of;
  std::vector<int64_t> offsets;
};

Permutation sort_by_expert(const std::vector<int32_t>& ids, int64_t T, int64_t K, int first, int E, int total,
                           int64_t pad) {
  Permutation p;
  p.offsets.assign(size_t(E) + 1, 0);
  for (int32_t e : ids) {
    MS_CHECK(e >= 0 && e < total, "moe: expert id ", e, " outside 0..", total - 1);
    if (e >= first && e < first + E) ++p.offsets[size_t(e - first) + 1];
  }
  for (int e = 0; e < E; ++e) p.offsets[e + 1] = p.offsets[e] + (p.offsets[e + 1] + pad - 1) / pad * pad;
  std::vector<int64_t> next(p.offsets.begin(), p.offsets.end() - 1);
  p.token_of_row.assign(size_t(p.offsets[E]), -1);
  p.row_of.assign(ids.size(), -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = ids[t * K + j];
      if (e < first || e >= first + E) continue;
      const int64_t r = next[e - first]++;
      p.token_of_row[r] = int32_t(t);
      p.row_of[t * K + j] = int32_t(r);
    }
  return p;
}

// slabs_ok: the caller takes a token's rows as the one-token kernel's unsummed slabs (ExpertRows::slabs).
ExpertRows grouped_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertTable& table,
                           int first, bool slabs_ok) {
  const int64_t T = x.size(0), H = x.size(1), K = ids.size(1), I = table.intermediate, pairs = T * K;
  const int E = table.experts;
  Permuted perm = permute_on_device(ids, first, E);
  if (slabs_ok) {
    Tensor parts;
    if (const int slabs = one_token_expert_parts(x, ids, perm.row_of, table, first, parts))
      return {parts, perm.row_of, weights, slabs};
  }
  Tensor ye = scratch(DType::F32, {pairs, H});
  // (Where the slabs were declined, the kernel declines this too.)
  if (!slabs_ok && one_token_experts(x, ids, perm.row_of, table, first, ye)) return {ye, perm.row_of, weights};
  Tensor act = scratch(DType::BF16, {pairs, I});
  GemvRows rows;
  rows.rows = int(pairs), rows.offsets = perm.offsets.data<int32_t>(), rows.active = perm.active.data<int32_t>();
  rows.n_active = perm.n_active.data<int32_t>();
  rows.max_groups = rows.expected_groups = int(std::min<int64_t>(E, pairs));
  GemvInput xin{x.data<bf16>(), x.strides()[0], perm.token_of_row.data<int32_t>()};
  gemv(I, H, table.gate_up, rows, xin, GemvOutput{act.raw(), DType::BF16, I}, true);
  GemvInput ain{act.data<bf16>(), I};
  gemv(H, I, table.down, rows, ain, GemvOutput{ye.raw(), DType::F32, H}, false);
  return {ye, perm.row_of, weights};
}

// The row tile for the mean rows a local expert gets: pairs / total, whichever rank it is.
Fp8RowTile fp8_tile_rows(int64_t pairs, int total) {
  return grouped_gemm_fp8_tile(std::max<int64_t>(1, pairs / total), true);
}

// Prefill with BF16 weights, and FP8-block weights from decode batches up, all on the device in
// five launches: the sort by expert (permute_on_device), [gate | up] and SiLU-and-mul as one
// grouped GEMM reading each token through token_of_row (no gathered copy: 4096 tokens x 8 slots x
// 2048 hidden is 134 MB written and read again saved), the down projection as a second, and the
// combine. No host sync, one launch per product instead of two per selected expert. FP8 weights
// go through grouped_gemm_fp8 (bytes streamed once, dequantised in the kernel) with the row tile
// chosen from the mean rows an expert.
ExpertRows grouped_prefill(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertTable& table,
                           int first, int total) {
  const int64_t T = x.size(0), H = x.size(1), K = ids.size(1), I = table.intermediate, pairs = T * K;
  const int E = table.experts;
  Permuted perm = permute_on_device(ids, first, E);
  // Rows past offsets[E] (pairs of other ranks' experts) are never written nor read.
  Tensor act = scratch(DType::BF16, {pairs, I}), ye = scratch(DType::BF16, {pairs, H});
  GroupedGemmArgs gu;
  gu.N = I, gu.K = H, gu.a = x.raw(), gu.a_ld = x.strides()[0], gu.a_rows = perm.token_of_row.data<int32_t>();
  gu.w = table.gate_up.w, gu.w2 = table.gate_up.w2, gu.w_ld = table.gate_up.ld;
  gu.s = table.gate_up.s, gu.s2 = table.gate_up.s2, gu.s_ld = table.gate_up.scale_ld;
  gu.offsets = perm.offsets.data<int32_t>(), gu.experts = E, gu.max_rows = pairs;
  gu.c = act.raw(), gu.c_ld = I;
  GroupedGemmArgs dn = gu;
  dn.N = H, dn.K = I, dn.a = act.raw(), dn.a_ld = I, dn.a_rows = nullptr;
  dn.w = table.down.w, dn.w2 = nullptr, dn.w_ld = table.down.ld;
  dn.s = table.down.s, dn.s2 = nullptr, dn.s_ld = table.down.scale_ld;
  dn.c = ye.raw(), dn.c_ld = H;
  if (table.fp8) {
    const Fp8RowTile tile = fp8_tile_rows(pairs, total);
    gu.bm = dn.bm = tile.bm;
    gu.wgmma = dn.wgmma = tile.wgmma;
    gu.act8 = dn.act8 = tile.act8;
    grouped_gemm_fp8(gu, true);
    grouped_gemm_fp8(dn, false);
  } else {
    grouped_gemm(gu, true);
    grouped_gemm(dn, false);
  }
  return {ye, perm.row_of, weights};
}

void check_expert(const ExpertWeights& experts, int e, int64_t H, int64_t I) {
  MS_CHECK(experts.gate[e].out_features() == I && experts.up[e].out_features() == I &&
               experts.down[e].in_features() == I && experts.down[e].out_features() == H &&
               experts.gate[e].in_features() == H,
           "moe_experts: expert ", e, " has shapes ", experts.gate[e].w.describe(), " / ",
           experts.down[e].w.describe(), " for hidden ", H, " and intermediate ", I);
}

bool all_fp8_gemm(const ExpertWeights& experts) {
  for (int e = 0; e < experts.num_experts(); ++e)
    if (!fp8_gemm_supported(experts.gate[e]) || !fp8_gemm_supported(experts.up[e]) ||
        !fp8_gemm_supported(experts.down[e]))
      return false;
  return true;
}

// gu = [gate | up] of each expert's rows in BF16 through cuBLASLt, then ye = down(silu * up).
void bf16_experts(const Tensor& x, const Permutation& perm, const ExpertWeights& experts, Tensor& gu, Tensor& act,
                  Tensor& ye) {
  const int64_t rows = perm.offsets.back(), H = x.size(1), I = act.size(1);
  const int E = experts.num_experts();
  Tensor xe = scratch(DType::BF16, {rows, H});
  gather_token_rows(x, upload_i32(perm.token_of_row), xe);
  bf16* g = gu.data<bf16>();
  for (int e = 0; e < E; ++e) {
    const int64_t off = perm.offsets[e], n = perm.offsets[e + 1] - off;
    if (n == 0) continue;
    Tensor xr = xe.narrow_rows(off, n);
    gemm_xwT(xr, weight_bf16(experts.gate[e]), g + off * 2 * I, DType::BF16, 2 * I);
    gemm_xwT(xr, weight_bf16(experts.up[e]), g + off * 2 * I + I, DType::BF16, 2 * I);
  }
  silu_and_mul(gu, act);
  for (int e = 0; e < E; ++e) {
    const int64_t off = perm.offsets[e], n = perm.offsets[e + 1] - off;
    if (n == 0) continue;
    gemm_xwT(act.narrow_rows(off, n), weight_bf16(experts.down[e]), ye.data<bf16>() + off * H, DType::BF16, H);
  }
}

// The same with FP8 blocks: each expert's rows (padded to 4) are one quantised segment, the
// gathered tokens for gate and up, their SiLU-and-mul again for down. Pad rows stay zero.
void fp8_experts(const Tensor& x, const Permutation& perm, const ExpertWeights& experts, Tensor& gu, Tensor& act,
                 Tensor& ye) {
  const int64_t H = x.size(1), I = act.size(1);
  const int E = experts.num_experts();
  Fp8Rows xq = quantize_segments(x, perm.token_of_row, perm.offsets);
  for (int e = 0; e < E; ++e) {
    const int64_t off = perm.offsets[e], n = perm.offsets[e + 1] - off;
    if (n == 0) continue;
    fp8_gemm(xq, off, n, experts.gate[e], gu.data<bf16>() + off * 2 * I, DType::BF16, 2 * I);
    fp8_gemm(xq, off, n, experts.up[e], gu.data<bf16>() + off * 2 * I + I, DType::BF16, 2 * I);
  }
  silu_and_mul(gu, act);
  std::vector<int32_t> same(perm.token_of_row.size());
  for (size_t r = 0; r < same.size(); ++r) same[r] = int32_t(r);
  Fp8Rows aq = quantize_segments(act, same, perm.offsets);
  for (int e = 0; e < E; ++e) {
    const int64_t off = perm.offsets[e], n = perm.offsets[e + 1] - off;
    if (n == 0) continue;
    fp8_gemm(aq, off, n, experts.down[e], ye.data<bf16>() + off * H, DType::BF16, H);
  }
}

// Whether FP8-block experts take grouped_gemm_fp8 for `pairs` (token, slot) pairs over `total`
// experts (this rank's table->experts of them). From a mean of kFp8GroupedMinMeanRows rows a local
// expert: below it (fewer pairs than experts, a token or two) the streaming GEMV
// (grouped_experts) reads the few experts picked and has no permute or tile table to launch. Up
// to kFp8GroupedMaxMeanRows outside graph capture; past it the host-sorted dequantise + cuBLASLt
// path (captures always stay on the device).
bool fp8_grouped_takes(const ExpertTable& t, const Tensor& x, int64_t pairs, int total) {
  const int64_t mean = pairs / total;
  const GemvWeights& gu = t.gate_up;
  const GemvWeights& dn = t.down;
  const int64_t max_mean = grouped_gemm_fp8_wgmma_enabled() ? kFp8GroupedMaxMeanRowsWgmma : kFp8GroupedMaxMeanRows;
  return grouped_gemm_fp8_enabled() && mean >= kFp8GroupedMinMeanRows && (mean <= max_mean || capturing()) &&
         t.hidden == x.size(1) && gu.block_n == 128 && gu.block_k == 128 && dn.block_n == 128 && dn.block_k == 128 &&
         grouped_gemm_fp8_supported(t.hidden, gu.ld, x.raw(), x.strides()[0]) &&
         grouped_gemm_fp8_supported(t.intermediate, dn.ld, nullptr, t.intermediate) &&
         grouped_gemm_fp8_fits(pairs, t.experts, fp8_tile_rows(pairs, total).bm);
}

// The experts' rows as moe_expert_rows gives them; slabs_ok: one token's may be left as slabs.
ExpertRows expert_rows(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts,
                       bool slabs_ok) {
  const int64_t T = x.size(0), H = x.size(1), K = ids.size(1);
  const int E = experts.num_experts();
  check_device_tensor(x, {DType::BF16}, "moe_experts", "input");
  check_device_tensor(ids, {DType::I32}, "moe_experts", "ids");
  check_device_tensor(weights, {DType::F32}, "moe_experts", "weights");
  MS_CHECK(x.strides()[1] == 1 && ids.is_contiguous() && weights.is_contiguous() && ids.size(0) == T &&
               weights.size(0) == T && weights.size(1) == K,
           "moe_experts: ", x.describe(), " ", ids.describe(), " ", weights.describe());
  MS_CHECK(E > 0, "moe_experts: no experts");
  if (T == 0) return {scratch(DType::F32, {0, H}), scratch(DType::I32, {0, K}), weights};
  const auto [first, total] = local_range(experts);
  const ExpertTable* table = expert_table(experts);
  const Fp8Mode mode = fp8_mode();
  if (table && table->fp8 && mode == Fp8Mode::Dequant && fp8_grouped_takes(*table, x, T * K, total))
    return grouped_prefill(x, ids, weights, *table, first, total);
  const bool few_tokens = T <= kGroupedMaxTokens && !(table && table->fp8 && fp8_gemm_all_rows(mode));
  if (table && (few_tokens || capturing()) && gemv_supported(H, table->gate_up.ld, table->fp8, x.raw(), x.strides()[0]) &&
      gemv_supported(table->intermediate, table->down.ld, table->fp8, nullptr, table->intermediate))
    return grouped_experts(x, ids, weights, *table, first, slabs_ok);
  // The grouped GEMM beats per-expert cuBLASLt while experts get few rows each, where the
  // per-expert calls are small and paced by the host; with many rows cuBLASLt's own kernels catch
  // up. On mma.sync (~250 TFLOP/s) that was past ~384 rows an expert (BENCHMARKS, session 6: a
  // Qwen3 prefill of 8192 tokens, 512 rows, 66.2 -> 70.6 ms with it). The wgmma shapes (~500)
  // took both products of Qwen3 at 512 rows in 1.31 ms against 3.60 for the cuBLASLt path, and
  // V2-Lite's at 768 rows in 1.67 against 2.64 (session 7); 1024 is the measured range rounded up.
  const int64_t max_mean_rows = grouped_gemm_on_wgmma() ? kGroupedGemmMaxMeanRowsWgmma : kGroupedGemmMaxMeanRows;
  const bool few_rows_per_expert = table && T * K <= max_mean_rows * table->experts;
  if (table && !table->fp8 && grouped_gemm_enabled() && few_rows_per_expert && table->hidden == H &&
      grouped_gemm_supported(H, table->gate_up.ld, x.raw(), x.strides()[0]) &&
      grouped_gemm_supported(table->intermediate, table->down.ld, nullptr, table->intermediate) &&
      grouped_gemm_fits(T * K, table->experts))
    return grouped_prefill(x, ids, weights, *table, first, total);
  MS_CHECK(!capturing(), "moe_experts: these expert weights need the host-sorted path, which cannot be captured");
  std::vector<int32_t> host_ids(size_t(T * K));
  download(host_ids.data(), ids.raw(), host_ids.size() * sizeof(int32_t));
  const bool fp8 = mode != Fp8Mode::Dequant && all_fp8_gemm(experts);
  Permutation perm = sort_by_expert(host_ids, T, K, first, E, total, fp8 ? 4 : 1);
  const int64_t rows = perm.offsets[E], I = experts.gate[0].out_features();
  for (int e = 0; e < E; ++e)
    if (perm.offsets[e + 1] > perm.offsets[e]) check_expert(experts, e, H, I);
  Tensor row_of = upload_i32(perm.row_of);
  Tensor gu = scratch(DType::BF16, {rows, 2 * I}), act = scratch(DType::BF16, {rows, I});
  Tensor ye = scratch(DType::BF16, {rows, H});
  if (rows > 0) {  // none when every pair belongs to another rank's experts
    if (fp8) fp8_experts(x, perm, experts, gu, act, ye);
    else bf16_experts(x, perm, experts, gu, act, ye);
  }
  return {ye, row_of, weights};
}

}  // namespace

void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts, Tensor& out) {
  check_device_tensor(out, {DType::BF16, DType::F32}, "moe_experts", "output");
  MS_CHECK(out.strides()[1] == 1 && out.size(0) == x.size(0) && out.size(1) == x.size(1), "moe_experts: ",
           x.describe(), " -> ", out.describe());
  const ExpertRows rows = expert_rows(x, ids, weights, experts, false);
  combine_expert_rows(rows.rows, rows.row_of, rows.weights, out);
}

ExpertRows moe_expert_rows(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts) {
  return expert_rows(x, ids, weights, experts, moe_slab_norm_takes(x.size(1), ids.dim() == 2 ? ids.size(1) : 0));
}

void gather_token_rows(const Tensor& x, const Tensor& token_of_row, Tensor& xe) {
  const int64_t rows = xe.size(0), H = x.size(1);
  MS_CHECK(x.dtype() == DType::BF16 && xe.dtype() == DType::BF16 && x.strides()[1] == 1 && xe.is_contiguous() &&
               xe.size(1) == H && token_of_row.dtype() == DType::I32 && token_of_row.numel() == rows,
           "gather_token_rows: ", x.describe(), " by ", token_of_row.describe(), " -> ", xe.describe());
  if (rows == 0 || H == 0) return;
  if (H % 8 == 0 && aligned16(x.raw(), x.strides()[0] * 2) && aligned16(xe.raw(), H * 2)) {
    gather_rows_x16<<<blocks_for(rows, kGatherWarps), kGatherWarps * 32, 0, stream()>>>(
        static_cast<const uint4*>(x.raw()), x.strides()[0] / 8, token_of_row.data<int32_t>(), rows, int(H / 8),
        static_cast<uint4*>(xe.raw()));
    MS_CUDA_LAUNCHED("gather_rows_x16");
    return;
  }
  const int threads = 256;
  gather_rows_scalar<<<blocks_for(rows * H, threads), threads, 0, stream()>>>(
      x.data<bf16>(), x.strides()[0], token_of_row.data<int32_t>(), rows, H, xe.data<bf16>());
  MS_CUDA_LAUNCHED("gather_rows_scalar");
}

void combine_expert_rows(const Tensor& ye, const Tensor& row_of, const Tensor& weights, Tensor& out) {
  const int64_t T = weights.size(0), K = weights.size(1), H = ye.size(1);
  MS_CHECK(ye.is_contiguous() && row_of.dtype() == DType::I32 && row_of.numel() == T * K &&
               weights.dtype() == DType::F32 && weights.is_contiguous() && out.size(0) == T && out.size(1) == H &&
               out.strides()[1] == 1,
           "combine_expert_rows: ", ye.describe(), " ", row_of.describe(), " ", weights.describe(), " -> ",
           out.describe());
  if (T == 0 || H == 0) return;
  // Decode batches have a few hundred threads' work: small blocks spread it over more SMs.
  const int threads = T * (H / 8) >= int64_t(256) * sm_count() ? 256 : 64;
  const bool wide = H % 8 == 0 && aligned16(ye.raw(), H * int64_t(dtype_size(ye.dtype()))) &&
                    aligned16(out.raw(), out.strides()[0] * int64_t(dtype_size(out.dtype())));
  MS_FLOAT_DISPATCH(ye.dtype(), TY, MS_FLOAT_DISPATCH(out.dtype(), TO, {
    if (wide) {
      combine_x8<TY, TO><<<blocks_for(T * (H / 8), threads), threads, 0, stream()>>>(
          ye.data<TY>(), row_of.data<int32_t>(), weights.data<float>(), T, int(K), H / 8, out.data<TO>(),
          out.strides()[0]);
    } else {
      combine_scalar<TY, TO><<<blocks_for(T * H, threads), threads, 0, stream()>>>(
          ye.data<TY>(), row_of.data<int32_t>(), weights.data<float>(), T, int(K), H, out.data<TO>(),
          out.strides()[0]);
    }
  }));
  MS_CUDA_LAUNCHED("combine_expert_rows");
}

}  // namespace ms::cuda
