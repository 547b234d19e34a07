// The MLA absorptions on the GPU. Head h's rows of kv_b [H (nope + v), L] are W_UK (its first
// nope) and W_UV (its last v):
//   absorb: q_latent[t, h, c] = sum_d q_nope[t, h, d] W_UK[h][d, c]   (x times W)
//   expand: out[t, h, j]      = sum_c latent[t, h, c] W_UV[h][j, c]   (x times W^T)
// Both read their half of kv_b whole for a few tokens (2 MB each for V2-Lite's 16 heads, 16.8 MB
// for V3's 128), so at decode sizes they are weight streams: kernels launched early (launch_pdl)
// that load their weights before they wait for the kernel before them — no kernel writes kv_b or
// its kept BF16 copy — and end about a round trip after their input is ready. cuBLASLt's batched
// product, launched plainly, started only then (~3.3 us each a V2-Lite layer on the H200, most of
// it the weight's latency). More tokens go to cuBLASLt; f32 accumulation, one rounding to bf16.
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_absorb.h"
#include "kernels/cuda/split_merge.cuh"

#include <cooperative_groups.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <type_traits>

namespace ms::cuda {
namespace {

namespace cg = cooperative_groups;

// Strides (elements) of a [T, H, *] activation whose last dimension is contiguous.
struct HeadRows {
  int64_t token, head;
};

// One product over every head: rows of head h's part of kv_b start at w + h * head_ld, K is the
// summed dimension and N the output's (absorb: K = nope, N = L; expand: K = L, N = v).
struct MlaStream {
  const bf16* w;
  int64_t w_ld, head_ld;
  const bf16* x;
  HeadRows xs;
  bf16* out;
  HeadRows os;
  int T, K, N;
};

// Absorb: a block takes kAbsorbCols output columns of one head, 8 lanes of 8 columns (a 128-byte
// line of a weight row) and 32 groups of lanes over the rows: group g sums rows g, g + 32, ...
// One round of loads (4 rows a group) covers V2's and V3's nope = 128, so the whole slice is in
// flight before the wait.
constexpr int kAbsorbThreads = 256;
constexpr int kAbsorbCols = 64;
constexpr int kAbsorbGroups = kAbsorbThreads / 8;
constexpr int kAbsorbRound = 4;
constexpr int kAbsorbWarps = kAbsorbThreads / 32;

template <int NT>
__global__ void __launch_bounds__(kAbsorbThreads) mla_absorb_kernel(MlaStream p) {
  extern __shared__ float smem[];
  float* xs = smem;                  // [T][K]: the head's q_nope rows
  float* red = smem + p.T * p.K;     // [warps][NT][kAbsorbCols]: each warp's sums
  const int h = blockIdx.y, lane = threadIdx.x % 32, col8 = threadIdx.x % 8, group = threadIdx.x / 8;
  const int c = blockIdx.x * kAbsorbCols + col8 * 8;
  const bf16* w = p.w + h * p.head_ld + c;
  uint4 wr[kAbsorbRound];
  auto load_round = [&](int d0) {
#pragma unroll
    for (int u = 0; u < kAbsorbRound; ++u) {
      const int d = d0 + group + u * kAbsorbGroups;
      wr[u] = c < p.N && d < p.K ? __ldg(reinterpret_cast<const uint4*>(w + int64_t(d) * p.w_ld))
                                 : make_uint4(0, 0, 0, 0);
    }
  };
  load_round(0);
  pdl_trigger();  // the attention after this may launch: it waits for q_latent
  pdl_wait();     // q_nope is the rope kernel's
  for (int i = threadIdx.x; i < p.T * p.K; i += blockDim.x) {
    const int t = i / p.K, d = i % p.K;
    xs[i] = __bfloat162float(p.x[t * p.xs.token + h * p.xs.head + d]);
  }
  __syncthreads();
  float acc[NT][8] = {};
  for (int d0 = 0; d0 < p.K; d0 += kAbsorbRound * kAbsorbGroups) {
    if (d0 > 0) load_round(d0);
#pragma unroll
    for (int u = 0; u < kAbsorbRound; ++u) {
      const int d = d0 + group + u * kAbsorbGroups;
      if (d >= p.K) break;
      float wf[8];
      unpack8(wr[u], wf);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= p.T) break;
        const float q = xs[t * p.K + d];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[t][j] = fmaf(q, wf[j], acc[t][j]);
      }
    }
  }
  // A warp's 4 groups are lanes 8 apart; then the warps meet in shared memory.
  const int warp = threadIdx.x / 32;
#pragma unroll
  for (int t = 0; t < NT; ++t)
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      acc[t][j] += __shfl_xor_sync(0xffffffffu, acc[t][j], 8);
      acc[t][j] += __shfl_xor_sync(0xffffffffu, acc[t][j], 16);
      if (lane < 8) red[(warp * NT + t) * kAbsorbCols + col8 * 8 + j] = acc[t][j];
    }
  __syncthreads();
  for (int i = threadIdx.x; i < p.T * kAbsorbCols; i += blockDim.x) {
    const int t = i / kAbsorbCols, cc = i % kAbsorbCols, col = blockIdx.x * kAbsorbCols + cc;
    if (col >= p.N) continue;
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < kAbsorbWarps; ++v) s += red[(v * NT + t) * kAbsorbCols + cc];
    p.out[t * p.os.token + h * p.os.head + col] = __float2bfloat16_rn(s);
  }
}

// Expand: a block takes kExpandRows rows of one head's W_UV, a quad of lanes a row; lane q of a
// quad loads columns 32 s + 8 q of step s (a warp's load is 8 rows x 64 contiguous bytes). One
// round of loads (16 steps) covers V2's and V3's 512-wide rows, so the whole slice is in flight
// before the wait. The latent rows sit in shared memory as f32.
constexpr int kExpandThreads = 64;
constexpr int kExpandRows = kExpandThreads / 4;
constexpr int kExpandRound = 16;

// Step s of lane q of a row's quad: its 8 weights w (columns 32 s + 8 q ..) times the latent's
// same 8 values (lat4: the token's latent row as f32, 4 a float4).
__device__ __forceinline__ float expand_step(uint4 w, const float4* lat4, int s, int q, float acc) {
  float wf[8];
  unpack8(w, wf);
  const float4 a = lat4[s * 8 + q * 2], b = lat4[s * 8 + q * 2 + 1];
  acc = fmaf(wf[0], a.x, fmaf(wf[1], a.y, fmaf(wf[2], a.z, fmaf(wf[3], a.w, acc))));
  return fmaf(wf[4], b.x, fmaf(wf[5], b.y, fmaf(wf[6], b.z, fmaf(wf[7], b.w, acc))));
}

// A row's sum over its quad of lanes (every lane of the quad gets the same bits).
__device__ __forceinline__ float quad_sum(float acc) {
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  return acc + __shfl_xor_sync(0xffffffffu, acc, 2);
}

template <int NT>
__global__ void __launch_bounds__(kExpandThreads) mla_expand_kernel(MlaStream p) {
  extern __shared__ float4 xs4[];  // [T][K / 4]: the head's latent rows
  const int h = blockIdx.y, q = threadIdx.x % 4, row0 = blockIdx.x * kExpandRows;
  const int j = row0 + threadIdx.x / 4, steps = p.K / 32;
  const bf16* w = p.w + h * p.head_ld + int64_t(j < p.N ? j : 0) * p.w_ld + q * 8;
  uint4 wr[kExpandRound];
  auto load_round = [&](int s0) {
#pragma unroll
    for (int u = 0; u < kExpandRound; ++u)
      wr[u] = j < p.N && s0 + u < steps ? __ldg(reinterpret_cast<const uint4*>(w + (s0 + u) * 32))
                                        : make_uint4(0, 0, 0, 0);
  };
  load_round(0);
  pdl_trigger();  // the o projection after this may launch and fetch its weights
  pdl_wait();     // the latent is the attention merge's
  const int vecs = p.K / 8;
  for (int i = threadIdx.x; i < p.T * vecs; i += blockDim.x) {
    const int t = i / vecs, k = i % vecs;
    float f[8];
    unpack8(reinterpret_cast<const uint4*>(p.x + t * p.xs.token + h * p.xs.head)[k], f);
    xs4[2 * i] = make_float4(f[0], f[1], f[2], f[3]);
    xs4[2 * i + 1] = make_float4(f[4], f[5], f[6], f[7]);
  }
  __syncthreads();
  float acc[NT] = {};
  for (int s0 = 0; s0 < steps; s0 += kExpandRound) {
    if (s0 > 0) load_round(s0);
#pragma unroll
    for (int u = 0; u < kExpandRound; ++u) {
      const int s = s0 + u;
      if (s >= steps) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= p.T) break;
        acc[t] = expand_step(wr[u], xs4 + t * (p.K / 4), s, q, acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    acc[t] = quad_sum(acc[t]);
    if (j < p.N && t < p.T && t % 4 == q) p.out[t * p.os.token + h * p.os.head + j] = __float2bfloat16_rn(acc[t]);
  }
}

// The split-KV merge of a decode step's MLA partials and the expansion after it, in one kernel:
// a cluster of L / 128 blocks a (token, head) row. Block c merges latent dims [128 c, 128 c + 128)
// with the arithmetic of the merge kernel the attention would launch (split_merge.cuh: NS > 0,
// up to NS splits by merge_few in the first warp; NS = 0, merge_many by 16 warps), rounds them to
// BF16 as that kernel stores them, and writes them into every block of the cluster (distributed
// shared memory); after the cluster's barrier each block expands its share of the head's v rows
// as mla_expand_kernel does (a quad of lanes a row), from weights it copied into shared memory
// before the wait. The two kernels' bits, without the latent's trip through L2 and the
// expansion's wait at a kernel boundary.
constexpr int kLatentPiece = kCombineCols * 4;  // latent dims a block merges (a float4 a lane)
constexpr int kMaxLatent = kExpandRound * 32;   // the expand_steps of one round cover the row
constexpr int kMergeExpandRows = 32;            // v rows a block expands at most: 32 KB of weights
constexpr size_t kWeightSmem = size_t(kExpandRound) * kMergeExpandRows * 4 * sizeof(uint4);
constexpr size_t kLatentSmem = kMaxLatent * sizeof(float);

struct MergeExpand {
  SplitPartials part;
  const bf16* w;  // head 0's W_UV
  int64_t w_ld, head_ld;
  bf16* out;
  HeadRows os;
  int H, v, rows;  // rows: v rows a block
};

constexpr int merge_expand_threads(int ns) { return ns > 0 ? kMergeExpandRows * 4 : kCombineWarps * 32; }

template <int NS>
__global__ void __launch_bounds__(merge_expand_threads(NS)) mla_merge_expand_kernel(MergeExpand p) {
  extern __shared__ uint4 smem_u4[];
  uint4* w_s = smem_u4;  // step u of thread i at [u * rows * 4 + i]
  float4* lat4 = reinterpret_cast<float4*>(reinterpret_cast<char*>(smem_u4) + kWeightSmem);
  cg::cluster_group cluster = cg::this_cluster();
  const int64_t row = blockIdx.x;
  const int t = int(row / p.H), h = int(row % p.H), c = int(blockIdx.y), steps = p.part.dv / 32;
  const int q = threadIdx.x % 4, j = c * p.rows + int(threadIdx.x) / 4, lanes = p.rows * 4;
  const bool expands = int(threadIdx.x) < lanes && j < p.v;
  if (expands) {
    const bf16* w = p.w + h * p.head_ld + int64_t(j) * p.w_ld + q * 8;
    for (int u = 0; u < steps; ++u) cp_async16(&w_s[u * lanes + threadIdx.x], w + u * 32, true);
  }
  cp_async_commit();
  pdl_trigger();  // the o projection after this may launch and fetch its weights
  pdl_wait();     // the partials are the attention kernel's
  float* lat = reinterpret_cast<float*>(lat4);
  auto publish = [&](int d, float x) {  // into every block's latent row, as the BF16 the merge stores
    const float b = __bfloat162float(__float2bfloat16_rn(x));
    for (unsigned r = 0; r < cluster.num_blocks(); ++r) *cluster.map_shared_rank(lat + d, r) = b;
  };
  if constexpr (NS > 0) {
    const int col = c * kCombineCols + int(threadIdx.x);  // a float4 piece
    if (threadIdx.x < kCombineCols && col * 4 < p.part.dv) {
      float m[4];
      merge_few<4, NS>(p.part, row, col, m);
#pragma unroll
      for (int i = 0; i < 4; ++i) publish(col * 4 + i, m[i]);
    }
  } else {
    auto* scratch = reinterpret_cast<MergeManyScratch<4>*>(reinterpret_cast<char*>(lat4) + kLatentSmem);
    const float m = merge_many<4>(p.part, row, c, *scratch);
    const int d = c * kLatentPiece + int(threadIdx.x);
    if (threadIdx.x < kLatentPiece && d < p.part.dv) publish(d, m);
  }
  cluster.sync();  // every piece of the latent row in every block (release / acquire)
  if (!expands) return;
  cp_async_wait<0>();  // a thread reads only the weights it copied
  float acc = 0.f;
#pragma unroll
  for (int u = 0; u < kExpandRound; ++u)
    if (u < steps) acc = expand_step(w_s[u * lanes + threadIdx.x], lat4, u, q, acc);
  acc = quad_sum(acc);
  if (q == 0) p.out[t * p.os.token + h * p.os.head + j] = __float2bfloat16_rn(acc);
}

std::atomic<bool>& merge_expand_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("MOESERVE_MLA_MERGE_EXPAND");
    return !env || std::string(env) != "0";
  }()};
  return on;
}

std::atomic<bool>& streaming_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("MOESERVE_MLA_STREAM");
    return !env || std::string(env) != "0";
  }()};
  return on;
}

constexpr size_t kMaxSmem = 48 * 1024;  // no opt-in needed

// kv_b as the streaming kernels read it, or an undefined tensor where they do not run: only
// weights that no kernel of the step writes may be read before the wait — a BF16 weight as
// stored, an FP8 one's kept copy (weight_bf16_kept; with keeping off it is dequantised into
// scratch by a kernel just before, and cuBLASLt takes it) — in 16-byte rows.
Tensor streamed_weight(const Weight& kv_b, int64_t T) {
  if (T > kMlaStreamMaxTokens || !mla_streaming()) return {};
  if (kv_b.w.dtype() != DType::BF16 && !(kv_b.is_fp8() && keep_bf16())) return {};
  Tensor wb = weight_bf16_kept(kv_b);
  return aligned16(wb.raw(), wb.strides()[0] * 2) ? wb : Tensor{};
}

bool try_absorb(const Tensor& q_nope, const Weight& kv_b, int nope, int v, Tensor& q_latent) {
  const int64_t T = q_nope.size(0), H = q_nope.size(1), L = kv_b.in_features();
  Tensor wb = streamed_weight(kv_b, T);
  if (!wb.defined() || L % 8 != 0) return false;
  const int64_t ws = wb.strides()[0];
  MlaStream p{wb.data<bf16>(), ws, (nope + v) * ws, q_nope.data<bf16>(), {q_nope.strides()[0], q_nope.strides()[1]},
              q_latent.data<bf16>(), {q_latent.strides()[0], q_latent.strides()[1]}, int(T), nope, int(L)};
  const size_t smem = (size_t(T) * nope + size_t(kAbsorbWarps) * kAbsorbCols) * sizeof(float);
  if (smem > kMaxSmem) return false;
  launch_pdl(mla_absorb_kernel<1>, dim3(unsigned(blocks_for(L, kAbsorbCols)), unsigned(H)), dim3(kAbsorbThreads), smem,
             p);
  MS_CUDA_LAUNCHED("mla_absorb_kernel");
  return true;
}

bool try_expand(const Tensor& latent, const Weight& kv_b, int nope, int v, Tensor& out) {
  const int64_t T = latent.size(0), H = latent.size(1), L = kv_b.in_features();
  Tensor wb = streamed_weight(kv_b, T);
  const size_t smem = size_t(T) * L * sizeof(float);
  if (!wb.defined() || L % 32 != 0 || smem > kMaxSmem || !aligned16(latent.raw(), latent.strides()[0] * 2) ||
      latent.strides()[1] * 2 % 16 != 0)
    return false;
  const int64_t ws = wb.strides()[0];
  MlaStream p{wb.data<bf16>() + nope * ws, ws, (nope + v) * ws, latent.data<bf16>(),
              {latent.strides()[0], latent.strides()[1]}, out.data<bf16>(), {out.strides()[0], out.strides()[1]},
              int(T), int(L), v};
  launch_pdl(mla_expand_kernel<1>, dim3(unsigned(blocks_for(v, kExpandRows)), unsigned(H)), dim3(kExpandThreads), smem,
             p);
  MS_CUDA_LAUNCHED("mla_expand_kernel");
  return true;
}

}  // namespace

void set_mla_streaming(bool on) { streaming_flag().store(on); }
bool mla_streaming() { return streaming_flag().load(); }
void set_mla_merge_expand(bool on) { merge_expand_flag().store(on); }

bool mla_merge_expand(const SplitPartials& part, int64_t T, const Weight& kv_b, int nope, int v, Tensor& out) {
  const int64_t H = out.size(1), L = kv_b.in_features(), blocks = L / kLatentPiece;
  Tensor wb = streamed_weight(kv_b, T);
  if (!merge_expand_flag().load() || !wb.defined() || part.splits < 2 || part.dv != L || L % kLatentPiece != 0 ||
      L > kMaxLatent || blocks > 8 || (v + blocks - 1) / blocks > kMergeExpandRows || part.rows != T * H ||
      out.strides()[2] != 1)
    return false;
  const int64_t ws = wb.strides()[0];
  const MergeExpand p{part,  wb.data<bf16>() + nope * ws, ws, (nope + v) * ws, out.data<bf16>(),
                      {out.strides()[0], out.strides()[1]}, int(H), v, int((v + blocks - 1) / blocks)};
  const dim3 grid(unsigned(T * H), unsigned(blocks)), cluster(1, unsigned(blocks));
  const size_t smem = kWeightSmem + kLatentSmem;  // under the 48 KB that need no opt-in
  auto launch = [&](auto kernel, int ns, size_t more) {
    launch_pdl_cluster(kernel, grid, cluster, dim3(merge_expand_threads(ns)), smem + more, p);
  };
  // The merge kernel's choice (attention.cu, launch_combine): one pass for up to 16 splits.
  if (part.splits <= 2) launch(mla_merge_expand_kernel<2>, 2, 0);
  else if (part.splits <= 4) launch(mla_merge_expand_kernel<4>, 4, 0);
  else if (part.splits <= 8) launch(mla_merge_expand_kernel<8>, 8, 0);
  else if (part.splits <= kFewSplits) launch(mla_merge_expand_kernel<kFewSplits>, kFewSplits, 0);
  else launch(mla_merge_expand_kernel<0>, 0, sizeof(MergeManyScratch<4>));
  MS_CUDA_LAUNCHED("mla_merge_expand_kernel");
  return true;
}

// Both absorptions read the whole of kv_b on every call (decode: 33.5 MB of BF16 a V3 layer for
// a few rows), so FP8 blocks are dequantised once into a kept copy (weight_bf16_kept), not into
// scratch at every call (~18 us a V3 layer a decode step on the H200).

// cuBLASLt: per head h, a strided batched product q_latent[:, h] = q_nope[:, h] . W_uk[h].
// Column-major: D[L, T] = W_uk^T-as-stored[L, nope] times q_nope[nope, T].
void mla_absorb_q(const Tensor& q_nope, const Weight& kv_b, int nope, int v, Tensor& q_latent) {
  const int64_t T = q_nope.size(0), H = q_nope.size(1), L = kv_b.in_features();
  MS_CHECK(q_nope.size(2) == nope && q_latent.size(2) == L && kv_b.out_features() == H * (nope + v),
           "mla_absorb_q: shapes ", q_nope.describe(), " ", kv_b.w.describe(), " ", q_latent.describe());
  check_device_tensor(q_nope, {DType::BF16}, "mla_absorb_q", "q_nope");
  check_device_tensor(q_latent, {DType::BF16}, "mla_absorb_q", "q_latent");
  MS_CHECK(q_nope.strides()[2] == 1 && q_latent.strides()[2] == 1, "mla_absorb_q: heads must be contiguous");
  if (T == 0 || try_absorb(q_nope, kv_b, nope, v, q_latent)) return;
  Tensor wb = weight_bf16_kept(kv_b);
  const int64_t ws = wb.strides()[0];
  matmul(L, T, nope, MatRef{wb.raw(), ws, (nope + v) * ws, false},
         MatRef{q_nope.raw(), q_nope.strides()[0], q_nope.strides()[1], false}, q_latent.raw(), DType::BF16,
         q_latent.strides()[0], q_latent.strides()[1], int(H));
}

// cuBLASLt: out[:, h] = latent[:, h] . W_uv[h]^T with W_uv[h] = kv_b's v rows of head h.
void mla_expand_v(const Tensor& latent, const Weight& kv_b, int nope, int v, Tensor& out) {
  const int64_t T = latent.size(0), H = latent.size(1), L = kv_b.in_features();
  MS_CHECK(latent.size(2) == L && out.size(2) == v && kv_b.out_features() == H * (nope + v),
           "mla_expand_v: shapes ", latent.describe(), " ", kv_b.w.describe(), " ", out.describe());
  check_device_tensor(latent, {DType::BF16}, "mla_expand_v", "latent");
  check_device_tensor(out, {DType::BF16}, "mla_expand_v", "output");
  MS_CHECK(latent.strides()[2] == 1 && out.strides()[2] == 1, "mla_expand_v: heads must be contiguous");
  if (T == 0 || try_expand(latent, kv_b, nope, v, out)) return;
  Tensor wb = weight_bf16_kept(kv_b);
  const int64_t ws = wb.strides()[0];
  const bf16* w_uv = wb.data<bf16>() + nope * ws;
  matmul(v, T, L, MatRef{w_uv, ws, (nope + v) * ws, true},
         MatRef{latent.raw(), latent.strides()[0], latent.strides()[1], false}, out.raw(), DType::BF16,
         out.strides()[0], out.strides()[1], int(H));
}

}  // namespace ms::cuda
