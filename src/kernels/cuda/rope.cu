// Rotary embedding fused with the KV-cache write, one launch per attention layer (the decode
// step's q rope, k rope and cache copies were four or five small launches before).
//   GQA: a warp per (token, head) over the Hq query heads and the Hkv key heads of every token:
//        a query warp ropes its head in place; a key warp ropes the key head into its cache slot,
//        copies the unrotated dims, and copies the value head into the value cache. Qwen3's
//        per-head q/k RMSNorm runs in the same warp before the rope (a warp reduction).
//   MLA: a grid of [tokens, 1 + query-head blocks]: block (t, 0) writes token t's cache row
//        (RMSNorm of the latent, a block reduction, then one warp ropes the key part from the
//        kv_a row into the cache), blocks (t, 1..) rope q's rope dims, a warp a head.
// Rope lanes read their pairs into registers before any lane writes, because the interleaved
// form writes its result de-interleaved (i, i + half) over the inputs (2i, 2i + 1), as the CPU
// op and the reference do. With F32 tensors and `round`, what a bf16 store would round is
// rounded (the CPU's bf16 emulation); BF16 stores round by themselves.
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

constexpr int kMaxPairsPerLane = 8;  // rot_dim up to 512
constexpr int kWarps = 8;            // warps a block

__device__ __forceinline__ float rounded(float v, bool round) {
  return round ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// One warp ropes `half` pairs of src into dst (dst may be src) with the cos/sin row of a token.
template <class TS, class TD>
__device__ void rope_head(const TS* src, TD* dst, const float* c, const float* s, int half, bool interleaved,
                          bool round, int lane) {
  float lo[kMaxPairsPerLane], hi[kMaxPairsPerLane];
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      const float a = load_f(src + (interleaved ? 2 * i : i)), b = load_f(src + (interleaved ? 2 * i + 1 : i + half));
      lo[p] = a * c[i] - b * s[i];
      hi[p] = b * c[i] + a * s[i];
    }
  }
  __syncwarp();
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      store_f(dst + i, rounded(lo[p], round));
      store_f(dst + i + half, rounded(hi[p], round));
    }
  }
}

// Copies n elements by the lanes of a warp (rounded as above when asked).
template <class T>
__device__ void copy_lanes(const T* src, T* dst, int n, bool round, int lane) {
  for (int i = lane; i < n; i += 32) store_f(dst + i, rounded(load_f(src + i), round));
}

// A head's RMSNorm by one warp, src -> dst (dst may be src), each lane its own elements; the
// stored (rounded) result is what the rope then reads, as when the norm was its own op.
template <class T, class TW>
__device__ void norm_head(const T* src, T* dst, const TW* w, float eps, int D, bool round, int lane) {
  float ss = 0.f;
  for (int i = lane; i < D; i += 32) {
    const float v = load_f(src + i);
    ss += v * v;
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  const float inv = 1.0f / sqrtf(ss / float(D) + eps);
  for (int i = lane; i < D; i += 32) store_f(dst + i, rounded(load_f(src + i) * inv * load_f(w + i), round));
  __syncwarp();
}

struct Strided3 {  // a [T, H, D] view with contiguous head dims
  int64_t s0, s1;
};

template <class TW>
struct QkNormArgs {  // null weights: no per-head norm
  const TW* q;
  const TW* k;
  float eps;
};

template <class T, class TW>
__global__ void rope_store_kv_kernel(T* q, Strided3 qs, const T* k, Strided3 ks, const T* v, Strided3 vs, T* kc,
                                     Strided3 kcs, T* vc, Strided3 vcs, int64_t tokens, int hq, int hkv, int D,
                                     int Dv, int half, const int32_t* positions, const int32_t* slots,
                                     const float* cos, const float* sin, bool interleaved, bool round,
                                     QkNormArgs<TW> norm) {
  const int64_t row = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= tokens * (hq + hkv)) return;
  const int64_t t = row / (hq + hkv);
  const int h = int(row % (hq + hkv));
  const float* c = cos + int64_t(positions[t]) * half;
  const float* s = sin + int64_t(positions[t]) * half;
  if (h < hq) {
    T* x = q + t * qs.s0 + h * qs.s1;
    if (norm.q) norm_head(x, x, norm.q, norm.eps, D, round, lane);
    rope_head(x, x, c, s, half, interleaved, round, lane);
    if (round) copy_lanes(x + 2 * half, x + 2 * half, D - 2 * half, true, lane);
    return;
  }
  const int kh = h - hq;
  const int64_t slot = slots[t];
  const T* ksrc = k + t * ks.s0 + kh * ks.s1;
  T* kdst = kc + slot * kcs.s0 + kh * kcs.s1;
  if (norm.k) {  // normalised into the cache slot, roped there
    norm_head(ksrc, kdst, norm.k, norm.eps, D, round, lane);
    rope_head(kdst, kdst, c, s, half, interleaved, round, lane);
  } else {
    rope_head(ksrc, kdst, c, s, half, interleaved, round, lane);
    copy_lanes(ksrc + 2 * half, kdst + 2 * half, D - 2 * half, round, lane);
  }
  copy_lanes(v + t * vs.s0 + kh * vs.s1, vc + slot * vcs.s0 + kh * vcs.s1, Dv, false, lane);
}

__device__ float block_sum(float v, float* shared) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < kWarps; ++w) total += shared[w];
  return total;
}

// q [T, H, nope + R] roped at dims [qoff, qoff + R); kv rows [L + R] -> cache rows.
template <class T, class TW>
__global__ void mla_rope_store_kernel(T* q, Strided3 qs, int heads, int qoff, const T* kv, int64_t kvs,
                                      const TW* norm_w, float eps, int L, T* cache, int64_t cs, int half,
                                      const int32_t* positions, const int32_t* slots, const float* cos,
                                      const float* sin, bool interleaved, bool round) {
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x % 32;
  const float* c = cos + int64_t(positions[t]) * half;
  const float* s = sin + int64_t(positions[t]) * half;
  if (blockIdx.y > 0) {
    const int h = (int(blockIdx.y) - 1) * kWarps + int(threadIdx.x) / 32;
    if (h >= heads) return;
    T* x = q + t * qs.s0 + h * qs.s1;
    rope_head(x + qoff, x + qoff, c, s, half, interleaved, round, lane);
    if (round) copy_lanes(x, x, qoff, true, lane);
    return;
  }
  __shared__ float partial[kWarps];
  const T* src = kv + t * kvs;
  T* dst = cache + int64_t(slots[t]) * cs;
  float ss = 0.f;
  for (int i = threadIdx.x; i < L; i += blockDim.x) {
    const float v = load_f(src + i);
    ss += v * v;
  }
  const float inv = 1.0f / sqrtf(block_sum(ss, partial) / float(L) + eps);
  for (int i = threadIdx.x; i < L; i += blockDim.x)
    store_f(dst + i, rounded(load_f(src + i) * inv * load_f(norm_w + i), round));
  if (threadIdx.x < 32) rope_head(src + L, dst + L, c, s, half, interleaved, round, lane);
}

Strided3 strided3(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.device() == Device::CUDA && t.dim() == 3 && t.strides()[2] == 1, op, ": ", what, " ", t.describe(),
           " must be a CUDA [T, H, D] tensor with contiguous head dims");
  return {t.strides()[0], t.strides()[1]};
}

// The table, positions and slots every fused rope checks on the host (the kernels trust them).
void check_rope(const char* op, const ops::RopeArgs& r, int64_t tokens, int64_t width,
                std::span<const int32_t> slots, int64_t num_slots) {
  const int half = r.rot_dim / 2;
  MS_CHECK(r.rot_dim > 0 && r.rot_dim % 2 == 0 && r.rot_dim <= width && r.cos.size(1) == half &&
               half <= 32 * kMaxPairsPerLane,
           op, ": rot_dim ", r.rot_dim, " for heads of ", width, " with a table of ", r.cos.describe());
  check_device_tensor(r.cos, {DType::F32}, op, "cos table");
  check_device_tensor(r.sin, {DType::F32}, op, "sin table");
  MS_CHECK(r.cos.is_contiguous() && r.sin.is_contiguous() && r.sin.shape() == r.cos.shape(), op,
           ": rope tables must be contiguous and alike");
  MS_CHECK(int64_t(r.positions.size()) == tokens && int64_t(slots.size()) == tokens, op, ": ", tokens, " tokens, ",
           r.positions.size(), " positions, ", slots.size(), " slots");
  for (int32_t p : r.positions)
    MS_CHECK(p >= 0 && p < r.cos.size(0), "position ", p, " is beyond the rope table (max_position_embeddings ",
             r.cos.size(0), ")");
  for (int32_t s : slots) MS_CHECK(s >= 0 && s < num_slots, "KV slot ", s, " outside 0..", num_slots - 1);
}

}  // namespace

void rope_store_kv(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& r,
                   std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                   const ops::HeadNorm* qk_norm) {
  const char* op = "rope_store_kv";
  const Strided3 qs = strided3(q, op, "q"), ks = strided3(k, op, "k"), vs = strided3(v, op, "v");
  const Strided3 kcs = strided3(k_cache, op, "key cache"), vcs = strided3(v_cache, op, "value cache");
  const int64_t T = q.size(0), D = q.size(2), Dv = v.size(2);
  MS_CHECK(k.size(0) == T && v.size(0) == T && k.size(2) == D && v.size(1) == k.size(1) &&
               k_cache.size(1) == k.size(1) && k_cache.size(2) == D && v_cache.size(1) == k.size(1) &&
               v_cache.size(2) == Dv && k_cache.size(0) == v_cache.size(0),
           op, ": q ", q.describe(), ", k ", k.describe(), ", v ", v.describe(), " into ", k_cache.describe(), " / ",
           v_cache.describe());
  for (const Tensor* t : std::initializer_list<const Tensor*>{&k, &v, &k_cache, &v_cache})
    MS_CHECK(t->dtype() == q.dtype(), op, ": ", t->describe(), " is not ", dtype_name(q.dtype()), " as q is");
  check_rope(op, r, T, D, slots, k_cache.size(0));
  if (qk_norm) {
    for (const Tensor* w : {&qk_norm->q, &qk_norm->k}) {
      check_device_tensor(*w, {DType::BF16, DType::F32}, op, "q/k norm weight");
      MS_CHECK(w->is_contiguous() && w->numel() == D && w->dtype() == qk_norm->q.dtype(), op, ": q/k norm weights ",
               qk_norm->q.describe(), ", ", qk_norm->k.describe(), " for heads of ", D);
    }
  }
  const int hq = int(q.size(1)), hkv = int(k.size(1));
  if (T == 0) return;
  Tensor pos = upload_i32(r.positions), sl = upload_i32(slots);
  const bool round = round_bf16 && q.dtype() == DType::F32;
  MS_FLOAT_DISPATCH(q.dtype(), TX, MS_FLOAT_DISPATCH(qk_norm ? qk_norm->q.dtype() : DType::F32, TW, {
    const QkNormArgs<TW> norm{qk_norm ? qk_norm->q.data<TW>() : nullptr, qk_norm ? qk_norm->k.data<TW>() : nullptr,
                              qk_norm ? qk_norm->eps : 0.f};
    rope_store_kv_kernel<TX, TW><<<blocks_for(T * (hq + hkv), kWarps), kWarps * 32, 0, stream()>>>(
        q.data<TX>(), qs, k.data<TX>(), ks, v.data<TX>(), vs, k_cache.data<TX>(), kcs, v_cache.data<TX>(), vcs, T,
        hq, hkv, int(D), int(Dv), r.rot_dim / 2, pos.data<int32_t>(), sl.data<int32_t>(), r.cos.data<float>(),
        r.sin.data<float>(), r.interleaved, round, norm);
  }));
  MS_CUDA_LAUNCHED("rope_store_kv_kernel");
}

void mla_rope_store(Tensor& q, const Tensor& kv, const Tensor& kv_norm, float eps, const ops::RopeArgs& r,
                    std::span<const int32_t> slots, bool round_bf16, Tensor& cache) {
  const char* op = "mla_rope_store";
  const Strided3 qs = strided3(q, op, "q");
  const int64_t T = q.size(0), R = r.rot_dim, L = kv.size(1) - R;
  MS_CHECK(kv.device() == Device::CUDA && kv.dim() == 2 && kv.strides()[1] == 1 && kv.size(0) == T && L > 0 &&
               cache.device() == Device::CUDA && cache.dim() == 2 && cache.strides()[1] == 1 &&
               cache.size(1) == L + R && kv.dtype() == q.dtype() && cache.dtype() == q.dtype(),
           op, ": q ", q.describe(), ", kv ", kv.describe(), " into ", cache.describe(), " with rot_dim ", R);
  check_device_tensor(kv_norm, {DType::BF16, DType::F32}, op, "latent norm weight");
  MS_CHECK(kv_norm.is_contiguous() && kv_norm.numel() == L, op, ": latent norm ", kv_norm.describe(), " for ", L,
           " columns");
  check_rope(op, r, T, q.size(2), slots, cache.size(0));
  if (T == 0) return;
  Tensor pos = upload_i32(r.positions), sl = upload_i32(slots);
  const bool round = round_bf16 && q.dtype() == DType::F32;
  const int heads = int(q.size(1));
  const dim3 grid(unsigned(T), 1u + unsigned((heads + kWarps - 1) / kWarps));
  MS_FLOAT_DISPATCH(q.dtype(), TX, MS_FLOAT_DISPATCH(kv_norm.dtype(), TW,
    mla_rope_store_kernel<TX, TW><<<grid, kWarps * 32, 0, stream()>>>(
        q.data<TX>(), qs, heads, int(q.size(2) - R), kv.data<TX>(), kv.strides()[0], kv_norm.data<TW>(), eps,
        int(L), cache.data<TX>(), cache.strides()[0], int(R / 2), pos.data<int32_t>(), sl.data<int32_t>(),
        r.cos.data<float>(), r.sin.data<float>(), r.interleaved, round)));
  MS_CUDA_LAUNCHED("mla_rope_store_kernel");
}

}  // namespace ms::cuda
