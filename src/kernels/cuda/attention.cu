// Attention over the slot cache on the GPU, one kernel for GQA and absorbed MLA. A block takes
// one query token and one KV head (MLA: the single latent "head") and up to 16 of the query
// heads that share it, one warp each; keys arrive 32 at a time through shared memory, gathered
// by slot, and each warp keeps an online softmax in f32. When tokens x heads give too few blocks
// to fill the GPU (decode), the keys are split across blocks and a second kernel merges the
// partial softmaxes (split-KV). GQA with 128-dim heads and MLA over the 512 + 64 latent run on
// the tensor cores instead (flash_prefill.h): prefill (16 queries or more per sequence) in
// flash-attention kernels, decode as split-KV partials merged here; this kernel takes the rest.
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/merge_project.h"
#include "kernels/cuda/mla_absorb.h"
#include "kernels/cuda/rope_head.cuh"
#include "kernels/cuda/split_merge.cuh"
#include "kernels/cuda/step_graph_cuda.h"

namespace ms::cuda {
namespace {

constexpr int kChunk = 32;  // keys per shared-memory tile: one per lane when scoring

// MLA's expansion after the attention (mla_attention_expand): the split merge may run it.
struct MlaExpandTo {
  const ops::Weight* kv_b;
  int nope, v;
  Tensor* out;
};

// GQA's output projection after the attention (rope_store_kv_attention_o_add_norm): a batch-1
// decode's partials may be merged by o's product itself (merge_project) into per-head slabs.
struct GqaProjectTo {
  const ops::Weight* o;
  Tensor* slabs;
};

struct AttnParams {
  const bf16* qa; int64_t qa_s0, qa_s1; int da;  // query part A (GQA: q; MLA: q_latent)
  const bf16* qb; int64_t qb_s0, qb_s1; int db;  // query part B (MLA: q_rope; GQA: none)
  const bf16* k; int64_t k_s0, k_s1;             // key of (slot, kv head): da + db contiguous values
  const bf16* v; int64_t v_s0, v_s1; int dv;     // values; null: the first dv key values (MLA)
  bf16* out; int64_t o_s0, o_s1;
  float* part_acc; float* part_ml;               // split-KV partials (splits > 1)
  const int32_t* slots; const int32_t* q_kv_begin; const int32_t* q_visible;
  int T, hq, group, warps, hgroups, splits, split_len;
  int fresh;                                     // most queries of one sequence: the keys they wrote
  float scale;
  bool k_wide, v_wide;                           // rows of keys / values allow 16-byte loads
  bool mla_tc;                                   // MLA on the tensor cores (flash_mla.cu)
  bool mla_wgmma;                                // ... on Hopper's warpgroup MMAs (flash_mla_wgmma.cu)
  bool gqa_tc;                                   // GQA decode on the tensor cores (flash_decode.cu)
  bool with_rope;                                // ... roping q and the new keys itself (rope)
  GqaDecodeRope rope;
  const MlaExpandTo* expand_to;                  // MLA: the merge may expand the latent (host only)
  const GqaProjectTo* project_to;                // GQA: o's product may merge the splits (host only)
};

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Copies `words` bf16 pairs of each of the tile's keys into shared rows of `stride` words
// (rows past nk are zero-filled so no lane reads stale values): 16-byte global loads when the
// rows allow them (the padded shared rows take them as four words).
__device__ void load_tile(__nv_bfloat162* dst, int stride, const bf16* base, int64_t s0, int64_t s1, int kvh,
                          const int32_t* slots, int nk, int words, bool wide) {
  if (wide) {
    const int quads = words / 4;
    for (int idx = threadIdx.x; idx < kChunk * quads; idx += blockDim.x) {
      const int r = idx / quads, c = idx % quads;
      uint4 val = make_uint4(0, 0, 0, 0);
      if (r < nk) val = reinterpret_cast<const uint4*>(base + int64_t(slots[r]) * s0 + kvh * s1)[c];
      uint32_t* row = reinterpret_cast<uint32_t*>(dst + r * stride + 4 * c);
      row[0] = val.x, row[1] = val.y, row[2] = val.z, row[3] = val.w;
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kChunk * words; idx += blockDim.x) {
    const int r = idx / words, c = idx % words;
    __nv_bfloat162 val = __floats2bfloat162_rn(0.f, 0.f);
    if (r < nk) val = reinterpret_cast<const __nv_bfloat162*>(base + int64_t(slots[r]) * s0 + kvh * s1)[c];
    dst[r * stride + c] = val;
  }
}

template <int NCH>
__global__ void attention_kernel(AttnParams p) {
  extern __shared__ float4 smem_raw[];
  const int dk = p.da + p.db, kst = dk / 2 + 1, vst = p.dv / 2;
  float* q_s = reinterpret_cast<float*>(smem_raw);
  auto* k_s = reinterpret_cast<__nv_bfloat162*>(q_s + p.warps * dk);
  __nv_bfloat162* v_s = p.v ? k_s + kChunk * kst : k_s;
  const int v_stride = p.v ? vst : kst;

  const int t = blockIdx.x, kvh = blockIdx.y / p.hgroups, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = (blockIdx.y % p.hgroups) * p.warps + warp, h = kvh * p.group + g;
  const bool active = g < p.group;
  if (active) {
    for (int i = lane; i < dk; i += 32)
      q_s[warp * dk + i] = i < p.da ? __bfloat162float(p.qa[t * p.qa_s0 + h * p.qa_s1 + i])
                                    : __bfloat162float(p.qb[t * p.qb_s0 + h * p.qb_s1 + i - p.da]);
  }
  // split_len 0: each query divides its own keys over the splits (captured steps, whose key
  // counts change from replay to replay); a split left with none reports an empty partial.
  const int visible = p.q_visible[t];
  const int split_len =
      p.split_len > 0 ? p.split_len : ((visible + p.splits - 1) / p.splits + kChunk - 1) / kChunk * kChunk;
  const int begin = blockIdx.z * split_len, end = min(visible, begin + split_len);
  const int32_t* slots = p.slots + p.q_kv_begin[t];
  float m = -INFINITY, l = 0.f, acc[NCH][2] = {};
  for (int c0 = begin; c0 < end; c0 += kChunk) {
    const int nk = min(kChunk, end - c0);
    load_tile(k_s, kst, p.k, p.k_s0, p.k_s1, kvh, slots + c0, nk, dk / 2, p.k_wide);
    if (p.v) load_tile(v_s, vst, p.v, p.v_s0, p.v_s1, kvh, slots + c0, nk, vst, p.v_wide);
    __syncthreads();
    if (active) {
      float s = -INFINITY;
      if (lane < nk) {
        const float2* q2 = reinterpret_cast<const float2*>(q_s + warp * dk);
        const __nv_bfloat162* kr = k_s + lane * kst;
        float dot = 0.f;
        for (int c = 0; c < dk / 2; ++c) {
          float2 kf = __bfloat1622float2(kr[c]), qf = q2[c];
          dot += kf.x * qf.x + kf.y * qf.y;
        }
        s = dot * p.scale;
      }
      const float m_new = fmaxf(m, warp_max(s)), alpha = expf(m - m_new);
      const float pr = lane < nk ? expf(s - m_new) : 0.f;
      l = l * alpha + warp_sum(pr);
#pragma unroll
      for (int cc = 0; cc < NCH; ++cc) acc[cc][0] *= alpha, acc[cc][1] *= alpha;
      for (int j = 0; j < nk; ++j) {
        const float pj = __shfl_sync(0xffffffffu, pr, j);
#pragma unroll
        for (int cc = 0; cc < NCH; ++cc) {
          const int w = cc * 32 + lane;
          if (2 * w < p.dv) {
            float2 vf = __bfloat1622float2(v_s[j * v_stride + w]);
            acc[cc][0] += pj * vf.x, acc[cc][1] += pj * vf.y;
          }
        }
      }
      m = m_new;
    }
    __syncthreads();
  }
  if (!active) return;
  if (p.splits == 1) {
    const float inv = 1.0f / l;
    bf16* o = p.out + t * p.o_s0 + h * p.o_s1;
#pragma unroll
    for (int cc = 0; cc < NCH; ++cc) {
      const int d = 2 * (cc * 32 + lane);
      if (d < p.dv) reinterpret_cast<__nv_bfloat162*>(o)[d / 2] = __floats2bfloat162_rn(acc[cc][0] * inv, acc[cc][1] * inv);
    }
    return;
  }
  const int64_t row = (int64_t(blockIdx.z) * p.T + t) * p.hq + h;
#pragma unroll
  for (int cc = 0; cc < NCH; ++cc) {
    const int d = 2 * (cc * 32 + lane);
    if (d < p.dv) p.part_acc[row * p.dv + d] = acc[cc][0], p.part_acc[row * p.dv + d + 1] = acc[cc][1];
  }
  if (lane == 0) p.part_ml[2 * row] = m, p.part_ml[2 * row + 1] = l;
}

constexpr int kMergeThreads = 256;  // a block of the one-pass merge: pieces of several rows

__host__ __device__ SplitPartials partials_of(const AttnParams& p) {
  return {p.part_acc, p.part_ml, int64_t(p.T) * p.hq, p.dv, p.splits};
}

// Up to NS splits (merge_few): a thread a V-float piece of one (query, head) row, so the merge
// costs splits x rows x dv reads and nothing more: no idle warps, no shared memory, no barrier.
// Consecutive threads take consecutive pieces of a row (coalesced; the (m, l) loads of a warp
// are one or two broadcasts).
template <int V, int NS>
__global__ void __launch_bounds__(kMergeThreads) combine_few(AttnParams p) {
  pdl_wait();  // launched early (launch_pdl): the partials are the attention kernel's
  pdl_trigger();
  const int pieces = p.dv / V;
  const int64_t rows = int64_t(p.T) * p.hq, idx = int64_t(blockIdx.x) * kMergeThreads + threadIdx.x;
  if (idx >= rows * pieces) return;
  const int64_t row = idx / pieces;
  const int col = int(idx % pieces);
  float v[V];
  merge_few<V, NS>(partials_of(p), row, col, v);
  const int t = int(row / p.hq), h = int(row % p.hq);
  auto* o = reinterpret_cast<__nv_bfloat162*>(p.out + t * p.o_s0 + h * p.o_s1 + col * V);
#pragma unroll
  for (int i = 0; i < V / 2; ++i) o[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
}

template <int V>
void launch_few(const AttnParams& p) {
  const int64_t threads = int64_t(p.T) * p.hq * (p.dv / V);
  const dim3 grid(blocks_for(threads, kMergeThreads)), block(kMergeThreads);
  if (p.splits <= 2) launch_pdl(combine_few<V, 2>, grid, block, 0, p);
  else if (p.splits <= 4) launch_pdl(combine_few<V, 4>, grid, block, 0, p);
  else if (p.splits <= 8) launch_pdl(combine_few<V, 8>, grid, block, 0, p);
  else launch_pdl(combine_few<V, kFewSplits>, grid, block, 0, p);
  MS_CUDA_LAUNCHED("combine_few");
}

// More splits (merge_many): block (t * hq + h, c) writes dims [c * 32V, (c + 1) * 32V) of one
// (query, head). No pass over the splits waits on another.
template <int V>
__global__ void __launch_bounds__(kCombineWarps * 32) combine_splits(AttnParams p) {
  __shared__ MergeManyScratch<V> scratch;
  pdl_wait();  // as in combine_few
  pdl_trigger();
  const int64_t row = blockIdx.x;
  const float v = merge_many<V>(partials_of(p), row, int(blockIdx.y), scratch);
  const int d = int(blockIdx.y) * kCombineCols * V + int(threadIdx.x);
  if (threadIdx.x >= kCombineCols * V || d >= p.dv) return;
  const int t = int(row) / p.hq, h = int(row) % p.hq;
  p.out[t * p.o_s0 + h * p.o_s1 + d] = __float2bfloat16_rn(v);
}

// Merges p.splits partials into p.out: float4 pieces when rows of partials allow them (the
// scratch is 16-byte aligned, so a value width divisible by 4 does), else float2 (widths are even).
// Launched early (the attention kernels trigger at their start), so that the merge's blocks are
// resident and waiting when the last partial lands instead of being launched then.
void launch_combine(const AttnParams& p) {
  const int v = p.dv % 4 == 0 ? 4 : 2;
  if (p.splits <= kFewSplits) {
    if (v == 4) launch_few<4>(p);
    else launch_few<2>(p);
    return;
  }
  const dim3 grid(unsigned(p.T * p.hq), unsigned((p.dv + kCombineCols * v - 1) / (kCombineCols * v)));
  if (v == 4) launch_pdl(combine_splits<4>, grid, dim3(kCombineWarps * 32), 0, p);
  else launch_pdl(combine_splits<2>, grid, dim3(kCombineWarps * 32), 0, p);
  MS_CUDA_LAUNCHED("combine_splits");
}

template <int NCH>
void launch(const AttnParams& p, int kv_heads, size_t smem) {
  auto kernel = attention_kernel<NCH>;
  MS_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  dim3 grid(unsigned(p.T), unsigned(kv_heads * p.hgroups), unsigned(p.splits));
  kernel<<<grid, p.warps * 32, smem, stream()>>>(p);
  MS_CUDA_LAUNCHED("attention_kernel");
}

bool launch_all(AttnParams p, int kv_heads, const char* op);
void launch_kernel(const AttnParams& p, int kv_heads, const char* op);

// Splits of the keys per query: the tensor-core kernels size theirs to their blocks' shared
// memory; the CUDA-core kernel's fill the GPU twice, at least 64 keys each.
int choose_splits(AttnParams& p, int kv_heads, int max_visible) {
  if (p.gqa_tc) return flash_decode_splits(p.T, kv_heads, max_visible);
  if (p.mla_tc) return (p.mla_wgmma ? flash_mla_wgmma_decode_splits : flash_mla_decode_splits)(p.T, p.hq, max_visible);
  p.warps = std::min(p.group, 16);
  p.hgroups = (p.group + p.warps - 1) / p.warps;
  const int64_t blocks = int64_t(p.T) * kv_heads * p.hgroups, want = 2 * int64_t(sm_count());
  const int splits = blocks >= want ? 1 : int(std::min<int64_t>((want + blocks - 1) / blocks, (max_visible + 63) / 64));
  return std::max(splits, 1);
}

// A captured step: the layout's arrays are on the device already, and the splits are sized
// from the step's max_kv so that any replay fits the same launch.
bool run_staged(AttnParams p, int kv_heads, const StagedStep& st, const char* op) {
  p.slots = st.arrays[3].device.data<int32_t>(), p.q_kv_begin = st.begin.data<int32_t>();
  p.q_visible = st.visible.data<int32_t>();
  // Replays keep the token and sequence counts, not how the tokens fall to the sequences.
  p.fresh = p.T - st.layout->num_seqs() + 1;
  p.splits = choose_splits(p, kv_heads, st.max_kv);
  p.split_len = p.splits > 1 ? 0 : (1 << 30);  // one split: every key, however many
  return launch_all(p, kv_heads, op);
}

// Fills the layout part of `p` (uploads, split-KV choice), launches, and merges the splits; true
// when the merge also expanded MLA's latent (p.expand_to) or o's product merged them (p.project_to).
bool run(AttnParams p, int kv_heads, int64_t num_slots, const AttentionLayout& layout, const char* op) {
  if (const StagedStep* st = staged_step(); st && st->layout == &layout) return run_staged(p, kv_heads, *st, op);
  std::vector<int32_t> begin, visible;
  int max_visible = 0;
  for (int s = 0; s < layout.num_seqs(); ++s) {
    const int nq = layout.q_start[s + 1] - layout.q_start[s], nk = layout.kv_start[s + 1] - layout.kv_start[s];
    MS_CHECK(nq <= nk, op, ": sequence ", s, " has ", nq, " queries but only ", nk, " keys");
    for (int i = 0; i < nq; ++i) begin.push_back(layout.kv_start[s]), visible.push_back(nk - nq + i + 1);
    max_visible = std::max(max_visible, nk);
    p.fresh = std::max(p.fresh, nq);
  }
  MS_CHECK(int64_t(begin.size()) == p.T, op, ": layout has ", begin.size(), " queries, batch ", p.T);
  for (int32_t slot : layout.kv_slots) MS_CHECK(slot >= 0 && slot < num_slots, op, ": KV slot ", slot, " outside the pool of ", num_slots);
  if (p.T == 0) return false;
  Tensor d_slots = upload_i32(layout.kv_slots), d_begin = upload_i32(begin), d_visible = upload_i32(visible);
  p.slots = d_slots.data<int32_t>(), p.q_kv_begin = d_begin.data<int32_t>(), p.q_visible = d_visible.data<int32_t>();
  const int splits = choose_splits(p, kv_heads, max_visible);
  p.split_len = ((max_visible + splits - 1) / splits + kChunk - 1) / kChunk * kChunk;
  p.splits = (max_visible + p.split_len - 1) / p.split_len;
  return launch_all(p, kv_heads, op);
}

// Launches the attention kernel for p's value width and merges the splits (and expands, when
// mla_merge_expand takes p.expand_to, or merges and projects them by p.project_to: true).
bool launch_all(AttnParams p, int kv_heads, const char* op) {
  Tensor part_acc, part_ml;
  if (p.splits > 1) {
    part_acc = scratch(DType::F32, {p.splits, p.T, p.hq, p.dv});
    part_ml = scratch(DType::F32, {p.splits, p.T, p.hq, 2});
    p.part_acc = part_acc.data<float>(), p.part_ml = part_ml.data<float>();
  }
  if (p.mla_tc) {
    const MlaLaunch l{p.qa, p.qa_s0, p.qa_s1, p.qb, p.qb_s0, p.qb_s1, p.k, p.k_s0, p.out, p.o_s0, p.o_s1, p.slots,
                      p.q_kv_begin, p.q_visible, p.part_acc, p.part_ml, p.T, p.hq, p.splits, p.split_len, p.scale,
                      p.fresh};
    p.mla_wgmma ? flash_mla_wgmma(l) : flash_mla(l);
  } else if (p.gqa_tc) {
    flash_decode(GqaDecodeLaunch{p.qa, p.qa_s0, p.qa_s1, p.k, p.k_s0, p.k_s1, p.v, p.v_s0, p.v_s1, p.out, p.o_s0,
                                 p.o_s1, p.slots, p.q_kv_begin, p.q_visible, p.part_acc, p.part_ml, p.T, p.hq,
                                 kv_heads, p.splits, p.split_len, p.scale, p.fresh, p.with_rope, p.rope});
  } else {
    launch_kernel(p, kv_heads, op);
  }
  if (p.splits < 2) return false;
  if (p.project_to) {  // the caller checked merge_project_takes
    merge_project(partials_of(p), *p.project_to->o, *p.project_to->slabs);
    return true;
  }
  if (p.expand_to && p.dv % 4 == 0 &&
      mla_merge_expand(partials_of(p), p.T, *p.expand_to->kv_b, p.expand_to->nope, p.expand_to->v, *p.expand_to->out))
    return true;
  launch_combine(p);
  return false;
}

// The CUDA-core kernel for p's value width.
void launch_kernel(const AttnParams& p, int kv_heads, const char* op) {
  const int dk = p.da + p.db;
  const size_t smem = size_t(p.warps) * dk * 4 + size_t(kChunk) * (dk / 2 + 1) * 4 + (p.v ? size_t(kChunk) * p.dv * 2 : 0);
  const int nch = (p.dv + 63) / 64;
  if (nch <= 1) launch<1>(p, kv_heads, smem);
  else if (nch <= 2) launch<2>(p, kv_heads, smem);
  else if (nch <= 4) launch<4>(p, kv_heads, smem);
  else if (nch <= 8) launch<8>(p, kv_heads, smem);
  else fail(op, ": value width ", p.dv, " exceeds 512");
}

// Whether every row of `t` (dims [0, width)) can be read in 16-byte pieces.
bool wide_rows(const Tensor& t, int64_t width) {
  return width % 8 == 0 && reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0 && t.strides()[0] % 8 == 0 &&
         (t.dim() < 3 || t.strides()[1] % 8 == 0);
}

void check_pairs(const Tensor& t, const char* op, const char* what) {
  check_device_tensor(t, {DType::BF16}, op, what);
  MS_CHECK(t.strides().back() == 1, op, ": ", what, " ", t.describe(), " must have contiguous head dims");
  for (int d = 0; d + 1 < t.dim(); ++d)
    MS_CHECK(t.strides()[d] % 2 == 0, op, ": ", what, " strides must be even (bf16 pairs are loaded together)");
  MS_CHECK(reinterpret_cast<uintptr_t>(t.raw()) % 4 == 0, op, ": ", what, " must be 4-byte aligned");
}

// What every GQA call checks on the host (the kernels trust it).
void check_gqa(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out) {
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_cache.size(1), Dv = v_cache.size(2);
  MS_CHECK(k_cache.size(2) == D && Hq % Hkv == 0 && out.size(2) == Dv && out.size(0) == T && out.size(1) == Hq &&
               v_cache.size(1) == Hkv && D % 2 == 0 && Dv % 2 == 0,
           "attention: shapes ", q.describe(), " ", k_cache.describe(), " ", v_cache.describe(), " ", out.describe());
  check_device_tensor(q, {DType::BF16}, "attention", "q");
  MS_CHECK(q.strides()[2] == 1, "attention: q head dims must be contiguous");
  check_pairs(k_cache, "attention", "key cache");
  check_pairs(v_cache, "attention", "value cache");
  check_pairs(out, "attention", "output");
}

// The GQA launch over the split-KV kernels (the layout's part filled by run).
AttnParams gqa_params(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, float scale, Tensor& out) {
  const int64_t D = q.size(2), Dv = v_cache.size(2);
  AttnParams p{};
  p.qa = q.data<bf16>(), p.qa_s0 = q.strides()[0], p.qa_s1 = q.strides()[1], p.da = int(D);
  p.k = k_cache.data<bf16>(), p.k_s0 = k_cache.strides()[0], p.k_s1 = k_cache.strides()[1];
  p.v = v_cache.data<bf16>(), p.v_s0 = v_cache.strides()[0], p.v_s1 = v_cache.strides()[1], p.dv = int(Dv);
  p.k_wide = wide_rows(k_cache, D), p.v_wide = wide_rows(v_cache, Dv);
  p.gqa_tc = flash_decode_supported(q, k_cache, v_cache);
  p.out = out.data<bf16>(), p.o_s0 = out.strides()[0], p.o_s1 = out.strides()[1];
  p.T = int(q.size(0)), p.hq = int(q.size(1)), p.group = int(q.size(1) / k_cache.size(1)), p.scale = scale;
  return p;
}

// Whether the decode kernel ropes this step itself (rope_store_kv_attention): a query a
// sequence whose new key is its last one, BF16 heads of 128 dims all roped NeoX-style (Qwen3),
// on the tensor-core decode kernel; MOESERVE_DECODE_ROPE=0 (read once): never.
bool rope_in_decode(const Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& r,
                    std::span<const int32_t> slots, const Tensor& k_cache, const Tensor& v_cache,
                    const ops::HeadNorm* qk_norm, const AttentionLayout& layout) {
  static const bool allowed = [] {
    const char* env = std::getenv("MOESERVE_DECODE_ROPE");
    return !(env && std::string_view(env) == "0");
  }();
  const int64_t T = q.size(0);
  if (!allowed || T == 0 || T != layout.num_seqs() || int64_t(slots.size()) != T) return false;
  auto bf16_heads = [](const Tensor& t) {
    return t.device() == Device::CUDA && t.dtype() == DType::BF16 && t.dim() == 3 && t.size(2) == 128 &&
           t.strides()[2] == 1;
  };
  if (!bf16_heads(q) || !bf16_heads(k) || !bf16_heads(v) || r.rot_dim != 128 || r.interleaved ||
      k.size(0) != T || v.size(0) != T || k.size(1) != k_cache.size(1) || v.size(1) != k_cache.size(1) ||
      !flash_decode_supported(q, k_cache, v_cache) || k_cache.dtype() != DType::BF16 || v_cache.dtype() != DType::BF16)
    return false;
  if (r.cos.dim() != 2 || r.cos.size(1) != 64 || !r.cos.is_contiguous() || !r.sin.is_contiguous() ||
      r.cos.dtype() != DType::F32 || r.sin.dtype() != DType::F32)
    return false;
  if (qk_norm)
    for (const Tensor* w : {&qk_norm->q, &qk_norm->k})
      if (w->dtype() != DType::BF16 || !w->is_contiguous() || w->numel() != 128) return false;
  // Each sequence's one query writes its last key (decode).
  for (int s = 0; s < layout.num_seqs(); ++s)
    if (layout.q_start[s + 1] - layout.q_start[s] != 1 || layout.kv_start[s + 1] == layout.kv_start[s] ||
        layout.kv_slots[size_t(layout.kv_start[s + 1] - 1)] != slots[size_t(s)])
      return false;
  return true;
}

// The decode kernel roping the step itself (rope_in_decode holds), then the merge; true when o's
// product merged the splits (project_to).
bool run_decode_rope(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                     std::span<const int32_t> slots, Tensor& k_cache, Tensor& v_cache, const ops::HeadNorm* qk_norm,
                     const AttentionLayout& layout, float scale, Tensor& out, const GqaProjectTo* project_to) {
  check_gqa(q, k_cache, v_cache, out);
  check_rope("rope_store_kv_attention", rope, q.size(0), 128, slots, k_cache.size(0));
  AttnParams p = gqa_params(q, k_cache, v_cache, scale, out);
  const Tensor positions = upload_i32(rope.positions), new_slots = upload_i32(slots);
  p.with_rope = true;
  p.rope = GqaDecodeRope{k.data<bf16>(), k.strides()[0], k.strides()[1], v.data<bf16>(), v.strides()[0],
                         v.strides()[1], positions.data<int32_t>(), new_slots.data<int32_t>(), rope.cos.data<float>(),
                         rope.sin.data<float>(), qk_norm ? qk_norm->q.data<bf16>() : nullptr,
                         qk_norm ? qk_norm->k.data<bf16>() : nullptr, qk_norm ? qk_norm->eps : 0.f};
  p.project_to = project_to;
  return run(p, int(k_cache.size(1)), k_cache.size(0), layout, "rope_store_kv_attention");
}

}  // namespace

void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout,
               float scale, Tensor& out) {
  check_gqa(q, k_cache, v_cache, out);
  const int64_t T = q.size(0);
  if (T == 0) return;  // an IDLE batch (a DP rank without work)
  // Steps whose sequences bring 16 queries or more each (prefill, extend) go to the tensor cores;
  // decode keeps the split-KV kernel, and captured steps never have a host layout to tile.
  if (T >= 16 * int64_t(layout.num_seqs()) && !capturing() && flash_prefill_supported(q, k_cache, v_cache, out))
    return flash_prefill(q, k_cache, v_cache, layout, scale, out);
  run(gqa_params(q, k_cache, v_cache, scale, out), int(k_cache.size(1)), k_cache.size(0), layout, "attention");
}

void rope_store_kv_attention(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                             std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                             const ops::HeadNorm* qk_norm, const AttentionLayout& layout, float scale, Tensor& out) {
  if (!rope_in_decode(q, k, v, rope, slots, k_cache, v_cache, qk_norm, layout)) {
    cuda::rope_store_kv(q, k, v, rope, slots, round_bf16, k_cache, v_cache, qk_norm);
    return cuda::attention(q, k_cache, v_cache, layout, scale, out);
  }
  run_decode_rope(q, k, v, rope, slots, k_cache, v_cache, qk_norm, layout, scale, out, nullptr);
}

void rope_store_kv_attention_o_add_norm(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                                        std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache,
                                        Tensor& v_cache, const ops::HeadNorm* qk_norm, const AttentionLayout& layout,
                                        float scale, Tensor& attn, const ops::PostAttention& post) {
  const int64_t T = q.size(0), Hq = q.size(1), N = post.o.out_features();
  MS_CHECK(post.o.in_features() == attn.size(1) * attn.size(2) && post.residual.dim() == 2 &&
               post.residual.size(0) == T && post.residual.size(1) == N && post.out.shape() == post.residual.shape(),
           "rope_store_kv_attention_o_add_norm: o ", post.o.w.describe(), " after ", attn.describe(), " into ",
           post.residual.describe(), " and ", post.out.describe());
  if (T == 1 && merge_project_takes(Hq, post.o) && slab_norm_takes(Hq, post.residual, post.norm_weight, post.out) &&
      rope_in_decode(q, k, v, rope, slots, k_cache, v_cache, qk_norm, layout)) {
    Tensor slabs = scratch(DType::F32, {Hq, N});
    const GqaProjectTo to{&post.o, &slabs};
    if (run_decode_rope(q, k, v, rope, slots, k_cache, v_cache, qk_norm, layout, scale, attn, &to))
      return slabs_sum_add_rms_norm(slabs, post.residual, post.norm_weight, post.eps, post.out);
  } else {
    cuda::rope_store_kv_attention(q, k, v, rope, slots, round_bf16, k_cache, v_cache, qk_norm, layout, scale, attn);
  }
  // The attention wrote attn (one split: no partials to merge): the product and the norm apart.
  if (round_bf16) cuda::round_to_bf16(attn);
  Tensor y = scratch(attn.dtype(), {T, N});
  cuda::linear(attn.view({T, attn.size(1) * attn.size(2)}), post.o, nullptr, y);
  if (round_bf16) cuda::round_to_bf16(y);
  cuda::add_rms_norm(post.residual, y, post.norm_weight, post.eps, post.out);
}

namespace {

// MLA over the latent cache into out [T, H, L]; with expand_to, a decode's split merge may expand
// the latent into expand_to->out instead (true: out is left unwritten).
bool run_mla(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const AttentionLayout& layout,
             float scale, Tensor& out, const MlaExpandTo* expand_to) {
  const int64_t T = q_latent.size(0), H = q_latent.size(1), L = q_latent.size(2), R = q_rope.size(2);
  MS_CHECK(kv_cache.dim() == 2 && kv_cache.size(1) == L + R && out.size(2) == L && out.size(0) == T &&
               out.size(1) == H && q_rope.size(0) == T && q_rope.size(1) == H && (L + R) % 2 == 0 && L % 2 == 0,
           "mla_attention: shapes ", q_latent.describe(), " ", q_rope.describe(), " ", kv_cache.describe(), " ",
           out.describe());
  check_device_tensor(q_latent, {DType::BF16}, "mla_attention", "q_latent");
  check_device_tensor(q_rope, {DType::BF16}, "mla_attention", "q_rope");
  MS_CHECK(q_latent.strides()[2] == 1 && q_rope.strides()[2] == 1, "mla_attention: head dims must be contiguous");
  check_pairs(kv_cache, "mla_attention", "latent cache");
  check_pairs(out, "mla_attention", "output");
  if (T == 0) return false;  // an IDLE batch (a DP rank without work)
  // Prefill as for GQA; decode too runs on the tensor cores when the shapes allow (split-KV below).
  if (T >= 16 * int64_t(layout.num_seqs()) && !capturing() && flash_mla_supported(q_latent, q_rope, kv_cache, out)) {
    flash_mla_prefill(q_latent, q_rope, kv_cache, layout, scale, out);
    return false;
  }
  AttnParams p{};
  p.qa = q_latent.data<bf16>(), p.qa_s0 = q_latent.strides()[0], p.qa_s1 = q_latent.strides()[1], p.da = int(L);
  p.qb = q_rope.data<bf16>(), p.qb_s0 = q_rope.strides()[0], p.qb_s1 = q_rope.strides()[1], p.db = int(R);
  p.k = kv_cache.data<bf16>(), p.k_s0 = kv_cache.strides()[0], p.k_s1 = 0;
  p.v = nullptr, p.dv = int(L);
  p.k_wide = wide_rows(kv_cache, L + R);
  p.mla_tc = flash_mla_supported(q_latent, q_rope, kv_cache, out);
  p.mla_wgmma = p.mla_tc && use_flash_mla_wgmma(q_latent, q_rope, kv_cache, out);
  p.out = out.data<bf16>(), p.o_s0 = out.strides()[0], p.o_s1 = out.strides()[1];
  p.T = int(T), p.hq = int(H), p.group = int(H), p.scale = scale;
  p.expand_to = expand_to;
  return run(p, 1, kv_cache.size(0), layout, "mla_attention");
}

}  // namespace

void mla_attention(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const AttentionLayout& layout,
                   float scale, Tensor& out) {
  run_mla(q_latent, q_rope, kv_cache, layout, scale, out, nullptr);
}

void mla_attention_expand(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                          const AttentionLayout& layout, float scale, const Weight& kv_b, int nope, int v,
                          Tensor& latent, Tensor& out) {
  MS_CHECK(out.dim() == 3 && out.size(0) == q_latent.size(0) && out.size(1) == q_latent.size(1) && out.size(2) == v &&
               kv_b.out_features() == q_latent.size(1) * (nope + v) && kv_b.in_features() == q_latent.size(2),
           "mla_attention_expand: output ", out.describe(), " and kv_b ", kv_b.w.describe(), " for ",
           q_latent.describe(), ", ", nope, " + ", v, " dims a head");
  check_device_tensor(out, {DType::BF16}, "mla_attention_expand", "output");
  const MlaExpandTo to{&kv_b, nope, v, &out};
  if (!run_mla(q_latent, q_rope, kv_cache, layout, scale, latent, out.strides()[2] == 1 ? &to : nullptr))
    cuda::mla_expand_v(latent, kv_b, nope, v, out);
}

}  // namespace ms::cuda
