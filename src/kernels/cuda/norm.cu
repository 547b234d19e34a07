// RMSNorm, alone or fused with the residual add before it (add_rms_norm: a decoder block's
// x += f; h = norm(x), one launch that reads the residual and the addend once). Rows may be
// strided as in elementwise.cu; arithmetic is f32. The fused form stores the sum in the
// residual's dtype and normalises that stored value, so it gives the bits of add_inplace
// followed by rms_norm. moe_combine_add_rms_norm goes one step further back: the addend is a
// MoE block's output, made in the same launch from the experts' rows (the combine's weighted
// sum, then the shared expert), which saves the combine's launch (~4 us at batch 1) and its
// write and read of f. At batch 1 it starts further back still, from the one-token experts'
// unsummed partials (moe_slabs_add_rms_norm_kernel).
#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/merge_project.h"
#include "kernels/cuda/moe_grouped.h"

namespace ms::cuda {
namespace {

namespace cg = cooperative_groups;

struct Rows {
  int64_t n, width, stride;
};

// A tensor seen as rows [size(0), numel / size(0)] with row stride strides[0], contiguous inside.
Rows rows_of(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.device() == Device::CUDA && t.dim() >= 1, op, ": ", what, " ", t.describe(), " must be CUDA rows");
  int64_t expect = 1;
  for (int d = t.dim() - 1; d >= 1; --d) {
    MS_CHECK(t.size(d) == 1 || t.strides()[d] == expect, op, ": ", what, " ", t.describe(),
             " must have contiguous rows");
    expect *= t.size(d);
  }
  return {t.size(0), expect, t.strides()[0]};
}

// Whether rows starting at `p`, `stride` elements of 2 bytes apart, are all 16-byte aligned.
bool wide(const void* p, int64_t stride) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 8 == 0; }

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps; ++w) total += shared[w];
  return total;
}

// A block a row, any widths and dtypes. With y, the row is x + y, stored into x first; the
// stored value is what is squared and normalised (thread i reads back its own elements).
template <class T, class TY, class TW>
__global__ void rms_norm_kernel(T* x, int64_t xs, const TY* y, int64_t ys, const TW* w, float eps, int64_t D, T* out,
                                int64_t os) {
  __shared__ float partial[32];
  pdl_trigger();  // the product after a norm may start fetching its weights now
  pdl_wait();     // launched early (launch_pdl): x and y are the kernels' before
  T* xr = x + int64_t(blockIdx.x) * xs;
  T* orow = out + int64_t(blockIdx.x) * os;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
    if (y) store_f(xr + i, load_f(xr + i) + load_f(y + int64_t(blockIdx.x) * ys + i));
    float v = load_f(xr + i);
    ss += v * v;
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, partial) / float(D) + eps);
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) store_f(orow + i, load_f(xr + i) * inv * load_f(w + i));
}

constexpr int kNormPieces = 2;          // 16-byte pieces a thread, at most
constexpr int kNormMaxGroup = 1024;     // threads a row, at most: widths up to 16384
constexpr int kNormMinBlock = 128;

// What rms_norm_rows_kernel adds to x: piece c (8 columns) of row t, as f32. kMaxGroup: the
// most threads a row (the launch bound, so the registers a thread may use); kMinBlocks: the
// blocks an SM that bound asks room for.
struct NoAddend {
  static constexpr int kMaxGroup = kNormMaxGroup, kMinBlocks = 1;
};
struct RowAddend {  // rows of a bf16 tensor
  static constexpr int kMaxGroup = kNormMaxGroup, kMinBlocks = 1;
  const bf16* y;
  int64_t ys;
  __device__ void operator()(int64_t t, int c, float a[8]) const {
    unpack8(reinterpret_cast<const uint4*>(y + t * ys)[c], a);
  }
};
// Eight values of a bf16 or f32 row as raw bytes, and back to f32 (a piece in flight in registers).
struct Raw8 {
  uint4 lo, hi;  // hi: f32 only
};
__device__ __forceinline__ Raw8 load16(const bf16* p) { return {*reinterpret_cast<const uint4*>(p), {}}; }
__device__ __forceinline__ Raw8 load16(const float* p) {
  return {reinterpret_cast<const uint4*>(p)[0], reinterpret_cast<const uint4*>(p)[1]};
}
template <class TY>
__device__ __forceinline__ void unpack16(const Raw8& r, float v[8]) {
  if constexpr (std::is_same_v<TY, bf16>) {
    unpack8(r.lo, v);
  } else {
    const uint32_t u[8] = {r.lo.x, r.lo.y, r.lo.z, r.lo.w, r.hi.x, r.hi.y, r.hi.z, r.hi.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = __uint_as_float(u[i]);
  }
}

// What both MoE addends read: the experts' rows, each token's slots, the shared expert.
template <class TY>
struct MoeRows {
  const TY* rows;
  const int32_t* row_of;
  const float* weights;
  int K;
  int64_t H;
  const bf16* shared;  // null: no shared expert
  int64_t ss;
  const bf16* gate;  // null: added ungated
  int64_t gs;
  // a (the combine's sum, rounded to bf16) plus the shared expert's piece s_raw, gated by
  // sigmoid(gate_logit()) when there is a gate, rounded again.
  template <class G>
  __device__ void add_shared(uint4 s_raw, G gate_logit, float a[8]) const {
    float s[8];
    unpack8(s_raw, s);
    if (gate) {
      const float gw = 1.0f / (1.0f + expf(-gate_logit()));
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = fmaf(gw, s[i], a[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] += s[i];
    }
    unpack8(pack8(a), a);
  }
};

// A MoE block's output as the unfused ops leave it in bf16. First combine_expert_rows: the f32
// sum over slots j in order of weights[t, j] * rows[row_of[t, j]] (rows -1 skipped; fmaf is the
// contraction nvcc makes of its acc += w * v), rounded to bf16. Then, with a shared expert,
// add_inplace (f + s) or add_sigmoid_gated (fmaf(g, s, f), g = 1 / (1 + expf(-gate)) written as
// that kernel writes it), rounded again.
// BATCH slots' row numbers, then all their pieces, are loaded before the first is summed: in a
// prefill the pieces are ~90 % of the bytes a norm moves, and one slot's row number, piece and
// sum in series each was a round trip a slot (8k Qwen3 tokens: ~2.9 TB/s). Rows up to 4096 wide
// take groups of up to 512 threads, whose bound leaves 128 registers for 8 pieces in flight;
// wider ones (DeepSeek-V3's 7168) keep add_rms_norm's 1024-thread groups, so that the sum of
// squares adds up in the same order and the norm's bits match, a slot at a time (64 registers).
template <class TY, int BATCH, int MAX_GROUP>
struct MoeAddend : MoeRows<TY> {
  static constexpr int kMaxGroup = MAX_GROUP, kBatch = BATCH, kMinBlocks = 1;
  using MoeRows<TY>::rows, MoeRows<TY>::row_of, MoeRows<TY>::weights, MoeRows<TY>::K, MoeRows<TY>::H,
      MoeRows<TY>::shared, MoeRows<TY>::ss, MoeRows<TY>::gate, MoeRows<TY>::gs;
  __device__ void operator()(int64_t t, int c, float a[8]) const {
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    for (int j0 = 0; j0 < K; j0 += kBatch) {
      int32_t r[kBatch];
      float w[kBatch];
      Raw8 raw[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        r[j] = j0 + j < K ? row_of[t * K + j0 + j] : -1;
        w[j] = j0 + j < K ? weights[t * K + j0 + j] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j)
        if (r[j] >= 0) raw[j] = load16(rows + int64_t(r[j]) * H + c * 8);
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {  // slots in order: the combine's sum, bit for bit
        if (r[j] < 0) continue;
        float v[8];
        unpack16<TY>(raw[j], v);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] = fmaf(w[j], v[i], acc[i]);
      }
    }
    unpack8(pack8(acc), a);
    if (shared)
      this->add_shared(reinterpret_cast<const uint4*>(shared + t * ss)[c], [&] { return load_f(gate + t * gs); }, a);
  }
};

// MoeAddend's sum for BF16 expert rows of up to 2048 columns and up to MAX_K slots (a prefill's
// combine), the same bits, with the slots' pieces gathered into shared memory by cp.async rather
// than into registers. Why: in registers (8 x 16 bytes in flight a thread) the kernel took 84
// registers, two 256-thread blocks an SM, and ran at ~45 % of the copy rate, its warps waiting on
// the gathered loads (Nsight Compute, V2-Lite 8k tokens, session 36); staged, the 8k-token combine
// took 89 us where it took 134 (V2-Lite; Qwen3 94 against 125). Copies cost no registers:
// each thread reads back only its own pieces (no barrier), [slot][thread] so a warp's 16-byte
// reads are conflict-free; 32 KB a block at MAX_K = 8.
template <int MAX_K>
struct MoeAddendStaged : MoeRows<bf16> {
  static constexpr int kMaxGroup = 256, kMinBlocks = 4;
  __device__ void operator()(int64_t t, int c, float a[8]) const {
    __shared__ uint4 stage[MAX_K][kMaxGroup];
    int32_t r[MAX_K];
#pragma unroll
    for (int j = 0; j < MAX_K; ++j) r[j] = j < K ? row_of[t * K + j] : -1;
#pragma unroll
    for (int j = 0; j < MAX_K; ++j)
      if (r[j] >= 0) cp_async16(&stage[j][threadIdx.x], rows + int64_t(r[j]) * H + c * 8, true);
    cp_async_commit();
    uint4 s_raw = {};
    float g = 0.f;
    if (shared) {
      s_raw = reinterpret_cast<const uint4*>(shared + t * ss)[c];
      if (gate) g = load_f(gate + t * gs);
    }
    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    cp_async_wait<0>();
#pragma unroll
    for (int j = 0; j < MAX_K; ++j) {  // slots in order: MoeAddend's sum, bit for bit
      if (r[j] < 0) continue;
      const float w = weights[t * K + j];
      float v[8];
      unpack8(stage[j][threadIdx.x], v);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, v[i], acc[i]);
    }
    unpack8(pack8(acc), a);
    if (shared) add_shared(s_raw, [g] { return g; }, a);
  }
};

// RMSNorm of bf16 rows (width a multiple of 8, 16-byte aligned rows and weight) by groups of
// `group` threads a row (a power of two: a part of a warp for narrow rows such as per-head
// q/k norms, up to a whole block for wide ones), so that a handful of rows, or one, still spreads
// over many threads. Each thread keeps its 16-byte pieces (and their weights, loaded at once so
// both reads are in flight together) in registers from the sum of squares to the write, so a row
// is read once and in place is safe. With an addend y, a piece is x + y rounded to bf16, written
// back to x, and that rounded value is normalised, as rms_norm_kernel does.
// Bounded for the widest group the addend allows (Addend::kMaxGroup threads): without a bound
// the MoE addend's loop took more registers than a 1024-thread block of 7168-wide rows has.
// PIECES: the 16-byte pieces a thread takes at most (1 unless a row is wider than 8 x the
// group): registers held for a second piece would cost warps an SM for nothing.
template <class TW, class Addend, int PIECES>
__global__ void __launch_bounds__(Addend::kMaxGroup, Addend::kMinBlocks)
    rms_norm_rows_kernel(bf16* x, int64_t xs, Addend y, const TW* w, float eps, int D, int64_t rows, int group,
                         bf16* out, int64_t os) {
  __shared__ float warp_ss[32];
  pdl_trigger();  // the product after a norm may start fetching its weights now
  pdl_wait();     // launched early (launch_pdl): x and the addend are the kernels' before
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x / group) + threadIdx.x / group;
  const int g = int(threadIdx.x) % group, n = D / 8;
  const bool live = row < rows;  // threads past the last row still join the reductions
  float v[PIECES][8], wt[PIECES][8], ss = 0.f;
#pragma unroll
  for (int i = 0; i < PIECES; ++i) {
    const int c = g + group * i;
    if (!live || c >= n) break;
    uint4* xp = reinterpret_cast<uint4*>(x + row * xs) + c;
    unpack8(*xp, v[i]);
    if constexpr (!std::is_same_v<Addend, NoAddend>) {
      float add[8];
      y(row, c, add);
#pragma unroll
      for (int j = 0; j < 8; ++j) add[j] += v[i][j];
      const uint4 sum = pack8(add);
      *xp = sum;
      unpack8(sum, v[i]);
    }
    load8(w + c * 8, wt[i]);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[i][j] * v[i][j];
  }
  for (int o = min(group, 32) / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (group > 32) {  // the row's warps meet in shared memory
    if (threadIdx.x % 32 == 0) warp_ss[threadIdx.x / 32] = ss;
    __syncthreads();
    const int first = int(threadIdx.x) / group * (group / 32);
    ss = 0.f;
    for (int k = 0; k < group / 32; ++k) ss += warp_ss[first + k];
  }
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
#pragma unroll
  for (int i = 0; i < PIECES; ++i) {
    const int c = g + group * i;
    if (!live || c >= n) break;
    float o[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = v[i][j] * inv * wt[i][j];
    reinterpret_cast<uint4*>(out + row * os)[c] = pack8(o);
  }
}

// One token's MoE output left as the one-token experts' slabs (ExpertRows::slabs), summed, added
// to the residual and normed, in one launch. It replaces the experts kernel's last step (its
// blocks meeting at a counter a slot, then summing the slot's slabs into ye) and the one-block
// norm after it. One thread-block cluster of H / 256 blocks (H a multiple of 256, at most 2048):
// block b takes columns [256b, 256b + 256), thread (slot j, quad q) summing slot j's slabs of 4
// columns in slab order (sum_slot's sum, whole 32-byte sectors a warp), then a thread a column
// taking the slots in order (MoeAddend's weighted sum), the shared expert and the residual add,
// and storing the rounded sum into the residual. Those 256 columns are warp b's pieces in the
// norm's 256-thread row (a thread a piece of 8), so the block's first warp makes that warp's
// sums of squares and writes them into every block's shared memory (distributed shared memory);
// after one cluster barrier each block reduces them as rms_norm_rows_kernel does (warp w the
// pieces 32w.., lane 0's butterfly sum, then the warps in order: the same bits as the unfused
// path) and norms its own columns from registers. Where the blocks met at a device counter and
// the last reloaded the whole row (two dependent trips through L2), the combine + norm took 0.8
// (Qwen3) to 1.0 us (V2-Lite) longer a layer (BENCHMARKS, session 28). Session 23's cluster,
// whose 16-byte loads used half a sector each and kept fewer in flight, had lost.
struct MoeSlabs {
  const float* parts;  // [K * slabs, H]
  const int32_t* row_of;  // null: slot s is row s (slabs_sum_add_rms_norm's groups)
  const float* weights;   // null: every slot weighs 1
  int K, slabs;
  const bf16* shared;  // [H] or null
  const bf16* gate;    // [1] or null: added ungated
};
constexpr int kSlabQuads = 64, kSlabCols = 4 * kSlabQuads, kSlabThreads = 8 * kSlabQuads;
// Slabs a thread has in flight: Qwen3's 12 in one round trip, V2-Lite's 22 in two. All 22 at once
// (128 registers) made both models slower at batch 1 (BENCHMARKS, session 28).
constexpr int kSlabBatch = 12;
constexpr int kNormRowPieces = 256;  // the norm's 256-thread row: H / 8 <= 256 pieces
constexpr int kSlabMaxBlocks = kNormRowPieces * 8 / kSlabCols;  // 8: a portable cluster

__device__ __forceinline__ float bf16_rounded(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

template <class TW>
__global__ void __launch_bounds__(kSlabThreads) moe_slabs_add_rms_norm_kernel(MoeSlabs m, bf16* x, const TW* w,
                                                                              float eps, int H, bf16* out) {
  __shared__ float ys[8][kSlabCols];            // [slot][column]
  __shared__ float xs[kSlabCols];               // this block's columns as stored
  __shared__ float piece_ss[kNormRowPieces];    // every piece's sum of squares, from every block
  __shared__ float warp_ss[kNormRowPieces / 32];
  cg::cluster_group cluster = cg::this_cluster();
  const int j = int(threadIdx.x) / kSlabQuads, q = int(threadIdx.x) % kSlabQuads;
  const int c0 = int(blockIdx.x) * kSlabCols, col = c0 + int(threadIdx.x);
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  const bool mixes = threadIdx.x < kSlabCols;
  const float wc = mixes ? load_f(w + col) : 0.f;  // no kernel writes the norm's weight
  if (threadIdx.x < kNormRowPieces && int(threadIdx.x) >= H / 8) piece_ss[threadIdx.x] = 0.f;  // past the row
  pdl_wait();  // the parts are the experts kernel's
  // The next kernel may launch now: the experts' blocks have left, so its blocks spread over every
  // multiprocessor (launched while they streamed, Qwen3's q|k|v crowded onto the idle ones and
  // took 3.4 us more).
  pdl_trigger();
  // Every input but the parts asked for at once: the slots' rows and weights, the residual, the
  // shared expert and its gate.
  int32_t rows[8];
  float weights[8];
#pragma unroll
  for (int s = 0; s < 8; ++s) {
    rows[s] = s >= m.K ? -1 : m.row_of ? m.row_of[s] : s;
    weights[s] = s >= m.K ? 0.f : m.weights ? m.weights[s] : 1.f;
  }
  const float residual = mixes ? __bfloat162float(x[col]) : 0.f;
  const float sh = mixes && m.shared ? __bfloat162float(m.shared[col]) : 0.f;
  const float gate = m.gate ? load_f(m.gate) : 0.f;
  int32_t my_row = -1;  // rows[j], kept in registers
#pragma unroll
  for (int s = 0; s < 8; ++s)
    if (s == j) my_row = rows[s];
  float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
  if (my_row >= 0) {  // slot j's slabs in order, from 0 (sum_slot's sum)
    const float* src = m.parts + int64_t(j) * m.slabs * H + c0 + 4 * q;
    for (int k0 = 0; k0 < m.slabs; k0 += kSlabBatch) {
      float4 part[kSlabBatch];
#pragma unroll
      for (int u = 0; u < kSlabBatch; ++u)
        if (k0 + u < m.slabs) part[u] = __ldcg(reinterpret_cast<const float4*>(src + int64_t(k0 + u) * H));
#pragma unroll
      for (int u = 0; u < kSlabBatch; ++u)
        if (k0 + u < m.slabs) v.x += part[u].x, v.y += part[u].y, v.z += part[u].z, v.w += part[u].w;
    }
  }
  *reinterpret_cast<float4*>(&ys[j][4 * q]) = v;
  __syncthreads();
  float xc = 0.f;  // column col as stored: the norm's input
  if (mixes) {     // column col: the slots in order (MoeAddend's combine), rounded; the shared expert
    float a = 0.f;
#pragma unroll
    for (int s = 0; s < 8; ++s)
      if (rows[s] >= 0) a = fmaf(weights[s], ys[s][threadIdx.x], a);
    a = bf16_rounded(a);
    if (m.shared) {
      if (m.gate) a = fmaf(1.0f / (1.0f + expf(-gate)), sh, a);
      else a += sh;
      a = bf16_rounded(a);
    }
    const bf16 stored = __float2bfloat16_rn(a + residual);  // the residual add
    x[col] = stored;
    xs[threadIdx.x] = xc = __bfloat162float(stored);
  }
  __syncthreads();
  if (warp == 0) {  // piece 32b + lane: its 8 columns in order, as the norm's thread of that piece
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += xs[8 * lane + i] * xs[8 * lane + i];
    const int piece = int(blockIdx.x) * 32 + lane;
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) cluster.map_shared_rank(piece_ss, r)[piece] = ss;
  }
  cluster.sync();  // every block's pieces in every block's shared memory (release / acquire)
  if (warp < kNormRowPieces / 32) {
    float ss = piece_ss[threadIdx.x];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) warp_ss[warp] = ss;
  }
  __syncthreads();
  float ss = 0.f;
  for (int k = 0; k < kNormRowPieces / 32; ++k) ss += warp_ss[k];
  const float inv = 1.0f / sqrtf(ss / float(H) + eps);
  if (mixes) out[col] = __float2bfloat16_rn(xc * inv * wc);
}

// ye [T * K, H] (F32): slot s's slabs summed in order into row row_of[s] (the one-token kernel's
// last step), for a consumer that cannot take the slabs; a block a (slot, 256 columns).
__global__ void sum_slabs_kernel(const float* parts, const int32_t* row_of, int slabs, int H, float* ye) {
  const int s = int(blockIdx.y), n = int(blockIdx.x) * 256 + int(threadIdx.x), r = row_of[s];
  if (r < 0 || n >= H) return;
  float v = 0.f;
  for (int k = 0; k < slabs; ++k) v += __ldcg(parts + (int64_t(s) * slabs + k) * H + n);
  ye[int64_t(r) * H + n] = v;
}

void check_weight(const char* op, const Tensor& weight, int64_t width) {
  MS_CHECK(weight.numel() == width, op, ": weight ", weight.describe(), " for rows of ", width);
  check_device_tensor(weight, {DType::BF16, DType::F32}, op, "weight");
  MS_CHECK(weight.is_contiguous(), op, ": weight must be contiguous");
}

// Whether rms_norm_rows_kernel takes bf16 rows x -> out of this width.
bool rows_kernel_fits(const Tensor& x, const Rows& xr, const Tensor& out, const Rows& orow, const Tensor& weight) {
  return x.dtype() == DType::BF16 && out.dtype() == DType::BF16 && xr.width % 8 == 0 &&
         xr.width <= 8 * kNormPieces * kNormMaxGroup && wide(x.raw(), xr.stride) && wide(out.raw(), orow.stride) &&
         wide(weight.raw(), 0);
}

// rms_norm_rows_kernel over x's rows: a thread a 16-byte piece (threads a row: a power of two),
// two pieces each past 8192 wide.
template <class Addend>
void launch_rows(const Tensor& x, const Rows& xr, Addend y, const Tensor& weight, float eps, const Tensor& out,
                 const Rows& orow) {
  int group = 1;
  while (group < Addend::kMaxGroup && group < xr.width / 8) group *= 2;
  const int block = std::max(group, kNormMinBlock), rows_per_block = block / group;
  const bool one_piece = xr.width <= 8 * int64_t(group);
  MS_FLOAT_DISPATCH(weight.dtype(), TW, {
    auto kernel = one_piece ? rms_norm_rows_kernel<TW, Addend, 1> : rms_norm_rows_kernel<TW, Addend, kNormPieces>;
    launch_pdl(kernel, dim3(unsigned(blocks_for(xr.n, rows_per_block))), dim3(unsigned(block)), 0, x.data<bf16>(),
               xr.stride, y, weight.data<TW>(), eps, int(xr.width), xr.n, group, out.data<bf16>(), orow.stride);
  });
  MS_CUDA_LAUNCHED("rms_norm_rows_kernel");
}

// out = norm(x), or with y: x += y, out = norm(x). x and out share a dtype; y may differ.
void norm_rows(const char* op, const Tensor& x, const Tensor* y, const Tensor& weight, float eps, const Tensor& out) {
  Rows xr = rows_of(x, op, "input"), orow = rows_of(out, op, "output");
  Rows yr = y ? rows_of(*y, op, "addend") : xr;
  MS_CHECK(orow.n == xr.n && orow.width == xr.width && x.dtype() == out.dtype() && yr.n == xr.n &&
               yr.width == xr.width,
           op, ": ", x.describe(), y ? " + " + y->describe() : "", " -> ", out.describe());
  check_weight(op, weight, xr.width);
  if (xr.n == 0) return;
  bf16* yb = y && y->dtype() == DType::BF16 ? y->data<bf16>() : nullptr;
  if (rows_kernel_fits(x, xr, out, orow, weight) && (!y || (yb && wide(yb, yr.stride)))) {
    if (y) launch_rows(x, xr, RowAddend{yb, yr.stride}, weight, eps, out, orow);
    else launch_rows(x, xr, NoAddend{}, weight, eps, out, orow);
    return;
  }
  const int threads = xr.width >= 1024 ? 256 : 128;
  const DType ydt = y ? y->dtype() : x.dtype();
  MS_FLOAT_DISPATCH(x.dtype(), T, MS_FLOAT_DISPATCH(ydt, TY, MS_FLOAT_DISPATCH(weight.dtype(), TW,
    launch_pdl(rms_norm_kernel<T, TY, TW>, dim3(unsigned(xr.n)), dim3(unsigned(threads)), 0, x.data<T>(), xr.stride,
               y ? y->data<TY>() : nullptr, yr.stride, weight.data<TW>(), eps, xr.width, out.data<T>(),
               orow.stride))));
  MS_CUDA_LAUNCHED("rms_norm_kernel");
}

}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  norm_rows("rms_norm", x, nullptr, weight, eps, out);
}

void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, Tensor& out) {
  MS_CHECK(residual.shape() == y.shape(), "add_rms_norm: ", residual.describe(), " + ", y.describe());
  norm_rows("add_rms_norm", residual, &y, weight, eps, out);
}

bool moe_slab_norm_takes(int64_t H, int64_t K) {
  static const bool allowed = [] {
    const char* env = std::getenv("MOESERVE_MOE_SLAB_NORM");
    return !(env && std::string_view(env) == "0");
  }();
  return allowed && H >= kSlabCols && H <= kSlabMaxBlocks * kSlabCols && H % kSlabCols == 0 && K >= 1 && K <= 8;
}

namespace {

void launch_slab_norm(const MoeSlabs& m, Tensor& residual, const Tensor& weight, float eps, Tensor& out) {
  const int64_t H = residual.size(1);
  const dim3 grid(unsigned(H / kSlabCols));  // one cluster
  MS_FLOAT_DISPATCH(weight.dtype(), TW, {
    launch_pdl_cluster(moe_slabs_add_rms_norm_kernel<TW>, grid, grid, dim3(kSlabThreads), 0, m, residual.data<bf16>(),
                       weight.data<TW>(), eps, int(H), out.data<bf16>());
  });
  MS_CUDA_LAUNCHED("moe_slabs_add_rms_norm_kernel");
}

// The slabs' consumer: one launch where the token's tensors fit it (true), else nothing.
bool slabs_add_rms_norm(const ExpertRows& routed, const Tensor* shared, const Tensor* shared_gate, Tensor& residual,
                        const Tensor& weight, float eps, Tensor& out) {
  const int64_t H = residual.size(1), K = routed.weights.size(1);
  const bool fits = residual.size(0) == 1 && moe_slab_norm_takes(H, K) && residual.dtype() == DType::BF16 &&
                    out.dtype() == DType::BF16 && residual.strides()[1] == 1 && out.strides()[1] == 1 &&
                    wide(residual.raw(), 0) && wide(out.raw(), 0) && wide(weight.raw(), 0) &&
                    (!shared || (shared->dtype() == DType::BF16 && shared->strides()[1] == 1)) &&
                    (!shared_gate || shared_gate->dtype() == DType::BF16);
  if (!fits) return false;
  launch_slab_norm(MoeSlabs{routed.rows.data<float>(), routed.row_of.data<int32_t>(), routed.weights.data<float>(),
                            int(K), routed.slabs, shared ? shared->data<bf16>() : nullptr,
                            shared_gate ? shared_gate->data<bf16>() : nullptr},
                   residual, weight, eps, out);
  return true;
}

}  // namespace

// The slabs as K groups of slabs / K (K = 8, or S when S < 8): the kernel's slots of weight 1,
// each group summed in order by one thread a column piece, in one round trip up to 96 slabs.
bool slab_norm_takes(int64_t S, const Tensor& residual, const Tensor& weight, const Tensor& out) {
  const int64_t H = residual.dim() == 2 ? residual.size(1) : 0, K = std::min<int64_t>(S, 8);
  return residual.size(0) == 1 && S >= 1 && S % K == 0 && S / K <= kSlabBatch && moe_slab_norm_takes(H, K) &&
         residual.dtype() == DType::BF16 && out.dtype() == DType::BF16 && residual.strides()[1] == 1 &&
         out.strides()[1] == 1 && wide(residual.raw(), 0) && wide(out.raw(), 0) && wide(weight.raw(), 0);
}

void slabs_sum_add_rms_norm(const Tensor& slabs, Tensor& residual, const Tensor& weight, float eps, Tensor& out) {
  const int64_t S = slabs.size(0), H = residual.size(1), K = std::min<int64_t>(S, 8);
  MS_CHECK(slab_norm_takes(S, residual, weight, out) && slabs.dtype() == DType::F32 && slabs.is_contiguous() &&
               slabs.size(1) == H,
           "slabs_sum_add_rms_norm: ", slabs.describe(), " into ", residual.describe());
  launch_slab_norm(MoeSlabs{slabs.data<float>(), nullptr, nullptr, int(K), int(S / K), nullptr, nullptr}, residual,
                   weight, eps, out);
}

ExpertRows summed_slabs(const ExpertRows& routed) {
  if (routed.slabs == 0) return routed;
  const int64_t pairs = routed.row_of.numel(), H = routed.rows.size(1);
  Tensor ye = scratch(DType::F32, {pairs, H});
  sum_slabs_kernel<<<dim3(unsigned((H + 255) / 256), unsigned(pairs)), 256, 0, stream()>>>(
      routed.rows.data<float>(), routed.row_of.data<int32_t>(), routed.slabs, int(H), ye.data<float>());
  MS_CUDA_LAUNCHED("sum_slabs_kernel");
  return {ye, routed.row_of, routed.weights};
}

void moe_combine_add_rms_norm(const ExpertRows& slab_or_rows, const Tensor* shared, const Tensor* shared_gate,
                              bool round_bf16, Tensor& residual, const Tensor& weight, float eps, Tensor& out) {
  const char* op = "moe_combine_add_rms_norm";
  const Rows xr = rows_of(residual, op, "residual"), orow = rows_of(out, op, "output");
  if (slab_or_rows.slabs > 0) {
    const Tensor& parts = slab_or_rows.rows;
    MS_CHECK(parts.dtype() == DType::F32 && parts.is_contiguous() && parts.dim() == 2 && parts.size(1) == xr.width &&
                 slab_or_rows.weights.dim() == 2 && slab_or_rows.weights.size(0) == xr.n &&
                 parts.size(0) == slab_or_rows.row_of.numel() * slab_or_rows.slabs,
             op, ": slabs ", parts.describe(), " (", slab_or_rows.slabs, " a slot) by ",
             slab_or_rows.row_of.describe(), " into ", residual.describe());
    check_weight(op, weight, xr.width);
    if (orow.n == xr.n && orow.width == xr.width &&
        slabs_add_rms_norm(slab_or_rows, shared, shared_gate, residual, weight, eps, out))
      return;
  }
  const ExpertRows routed = summed_slabs(slab_or_rows);
  const Tensor& ye = routed.rows;
  const int64_t T = xr.n, H = xr.width, K = routed.weights.dim() == 2 ? routed.weights.size(1) : 0;
  MS_CHECK(residual.dim() == 2 && orow.n == T && orow.width == H && ye.dim() == 2 && ye.size(1) == H &&
               ye.is_contiguous() && routed.weights.dim() == 2 && routed.weights.size(0) == T &&
               routed.weights.is_contiguous() && routed.weights.dtype() == DType::F32 &&
               routed.row_of.dtype() == DType::I32 && routed.row_of.numel() == T * K && routed.row_of.is_contiguous(),
           op, ": ", ye.describe(), " by ", routed.row_of.describe(), " and ", routed.weights.describe(), " into ",
           residual.describe(), " -> ", out.describe());
  check_device_tensor(ye, {DType::BF16, DType::F32}, op, "expert rows");
  const Rows sr = shared ? rows_of(*shared, op, "shared expert") : xr;
  const Rows gr = shared_gate ? rows_of(*shared_gate, op, "shared gate") : Rows{T, 1, 1};
  MS_CHECK(sr.n == T && sr.width == H && gr.n == T && gr.width == 1, op, ": shared expert ",
           shared ? shared->describe() : "", " gate ", shared_gate ? shared_gate->describe() : "", " for ",
           residual.describe());
  check_weight(op, weight, H);
  if (T == 0) return;
  const size_t ys = dtype_size(ye.dtype());
  const bool rows_wide = reinterpret_cast<uintptr_t>(ye.raw()) % 16 == 0 && H * int64_t(ys) % 16 == 0;
  const bool shared_fits = !shared || (shared->dtype() == DType::BF16 && wide(shared->raw(), sr.stride) &&
                                       (!shared_gate || shared_gate->dtype() == DType::BF16));
  if (rows_kernel_fits(residual, xr, out, orow, weight) && rows_wide && shared_fits) {
    auto moe_rows = [&]<class TY>(const TY* expert_rows) {
      return MoeRows<TY>{expert_rows,
                         routed.row_of.data<int32_t>(),
                         routed.weights.data<float>(),
                         int(K),
                         H,
                         shared ? shared->data<bf16>() : nullptr,
                         sr.stride,
                         shared_gate ? shared_gate->data<bf16>() : nullptr,
                         gr.stride};
    };
    if (ye.dtype() == DType::BF16 && H <= 8 * 256 && K <= 8) {  // a prefill's rows: MoeAddendStaged
      launch_rows(residual, xr, MoeAddendStaged<8>{moe_rows(ye.data<bf16>())}, weight, eps, out, orow);
      return;
    }
    MS_FLOAT_DISPATCH(ye.dtype(), TY, {
      auto launch = [&]<class A>(A) { launch_rows(residual, xr, A{moe_rows(ye.data<TY>())}, weight, eps, out, orow); };
      if (H <= 8 * 512) launch(MoeAddend<TY, 8, 512>{});
      else launch(MoeAddend<TY, 1, kNormMaxGroup>{});
    });
    return;
  }
  // Other dtypes and layouts: the unfused ops in the layer's order.
  Tensor f = scratch(residual.dtype(), {T, H});
  combine_expert_rows(ye, routed.row_of, routed.weights, f);
  if (round_bf16) round_to_bf16(f);
  if (shared) {
    if (shared_gate) add_sigmoid_gated(f, *shared_gate, *shared);
    else add_inplace(f, *shared);
    if (round_bf16) round_to_bf16(f);
  }
  add_rms_norm(residual, f, weight, eps, out);
}

}  // namespace ms::cuda
