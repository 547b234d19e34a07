// Greedy choice on the GPU: the argmax of each row of logits, so that a batch of greedy requests
// copies one id per row to the host instead of the whole [rows, vocab] logits. Ties go to the
// lower index, as std::max_element on the host does (the sampler's greedy rule).
//
// A row of 152k logits is too much for one block (batch-1 decode had a single block scan it), so
// a row is cut into chunks: each block reduces a chunk to its (value, index), and the last block
// of a row to store its result (counted at a device counter) merges the row's results with one
// warp, so a decode step's argmax is one launch (a merge kernel after it started 1-2 us after the
// chunks ended). Chunk counts depend only on the shape, so the scratch and the launches are the
// same at every replay of a captured step.
#include <algorithm>
#include <cfloat>
#include <climits>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMinChunk = 4 * kThreads;  // at least 4 logits a thread

// (value, index) with the larger value winning and the lower index breaking ties; index < 0 is
// "no candidate yet". Merging is associative and order-free, so chunks may be merged in any order.
__device__ __forceinline__ void keep_better(float& v, int& i, float ov, int oi) {
  if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) v = ov, i = oi;
}
__device__ __forceinline__ void warp_keep_better(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) keep_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
}

// The blocks of row r that have stored their chunk's result; the row's last block resets it
// (one stream a GPU runs these launches one after another).
constexpr int kCountedRows = 1024;
__device__ unsigned g_chunks_done[kCountedRows];

// Block (r, c) reduces logits [c * chunk, (c + 1) * chunk) of row r into part_v/part_i[r * chunks + c],
// and the row's last block to store its result merges them into out[r]; with one chunk a row the
// block writes out[r] directly.
template <class T>
__global__ void argmax_chunks_kernel(const T* logits, int64_t stride, int vocab, int chunk, float* part_v,
                                     int32_t* part_i, int32_t* out) {
  const T* row = logits + int64_t(blockIdx.x) * stride;
  const int begin = int(blockIdx.y) * chunk, end = min(vocab, begin + chunk);
  float v = -FLT_MAX;
  int idx = -1;
#pragma unroll 4
  for (int j = begin + int(threadIdx.x); j < end; j += kThreads) keep_better(v, idx, load_f(row + j), j);
  warp_keep_better(v, idx);
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (lane == 0) sv[warp] = v, si[warp] = idx;
  __syncthreads();
  if (warp != 0) return;
  v = lane < kThreads / 32 ? sv[lane] : -FLT_MAX;
  idx = lane < kThreads / 32 ? si[lane] : -1;
  warp_keep_better(v, idx);
  const int chunks = int(gridDim.y);
  if (chunks > 1) {
    const int64_t base = int64_t(blockIdx.x) * chunks;
    unsigned stored = 0;
    if (lane == 0) {
      part_v[base + blockIdx.y] = v, part_i[base + blockIdx.y] = idx;
      __threadfence();
      stored = atomicAdd(&g_chunks_done[blockIdx.x], 1u) + 1;
    }
    if (__shfl_sync(0xffffffffu, stored, 0) != unsigned(chunks)) return;
    __threadfence();  // every other block's result, stored before it counted itself, is visible
    v = -FLT_MAX, idx = -1;
    for (int c = lane; c < chunks; c += 32) keep_better(v, idx, __ldcg(part_v + base + c), __ldcg(part_i + base + c));
    warp_keep_better(v, idx);
    if (lane == 0) g_chunks_done[blockIdx.x] = 0;
  }
  // A row of NaNs has no larger value: index 0, as max_element gives.
  if (lane == 0) out[blockIdx.x] = idx < 0 ? 0 : idx;
}

}  // namespace

void argmax_rows_into(const Tensor& logits, Tensor& ids) {
  check_device_tensor(logits, {DType::BF16, DType::F32}, "argmax_rows", "logits");
  MS_CHECK(logits.dim() == 2 && (logits.size(1) <= 1 || logits.strides()[1] == 1), "argmax_rows: ", logits.describe(),
           " must be [rows, vocab] with contiguous rows");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  MS_CHECK(vocab > 0 && vocab < (int64_t(1) << 31), "argmax_rows: vocabulary of ", vocab);
  if (rows == 0) return;
  // Enough chunks for two blocks a multiprocessor over all rows, none shorter than kMinChunk.
  const int64_t want = std::max<int64_t>(1, (2 * int64_t(sm_count()) + rows - 1) / rows);
  const int64_t by_len = std::max<int64_t>(1, vocab / kMinChunk);
  int chunks = int(std::min(want, by_len));
  const int chunk = int((vocab + chunks - 1) / chunks);
  chunks = int((vocab + chunk - 1) / chunk);  // every chunk non-empty
  Tensor part_v, part_i;
  if (chunks > 1) part_v = scratch(DType::F32, {rows, chunks}), part_i = scratch(DType::I32, {rows, chunks});
  // Several chunks a row only below 2 x sm_count() rows: within the counters on any GPU of up to 512 SMs.
  MS_CHECK(chunks == 1 || rows <= kCountedRows, "argmax_rows: ", rows, " rows of ", chunks, " chunks");
  MS_FLOAT_DISPATCH(logits.dtype(), T, {
    argmax_chunks_kernel<T><<<dim3(unsigned(rows), unsigned(chunks)), kThreads, 0, stream()>>>(
        logits.data<T>(), logits.strides()[0], int(vocab), chunk, chunks > 1 ? part_v.data<float>() : nullptr,
        chunks > 1 ? part_i.data<int32_t>() : nullptr, ids.data<int32_t>());
  });
  MS_CUDA_LAUNCHED("argmax_chunks_kernel");
}

std::vector<int32_t> argmax_rows(const Tensor& logits) {
  std::vector<int32_t> out(size_t(logits.dim() == 2 ? logits.size(0) : 0), 0);
  if (out.empty()) return out;
  Tensor ids = scratch(DType::I32, {logits.size(0)});
  argmax_rows_into(logits, ids);
  download(out.data(), ids.raw(), out.size() * sizeof(int32_t));
  return out;
}

// Drawing a token for temperature > 0 (sample_rows_into), one block a row, with the host
// sampler's numbers (kernels/cpu/sampling.cpp): weights exp((l - max) * (1 / T)) in double, the
// same splitmix64 draw, ranks by decreasing logit with ties to the lower id. No sort: the rank
// where a bound is crossed (the top_k-th token, the top_p prefix, the draw) is found with a
// 2048-bin histogram of counts and weights a level: the weights' first level is linear in the
// logit (the host's buckets), the next ones narrow a range of logit keys (the float's bits
// made monotone, as offsets below the largest) to a single key, then the position inside that
// key's ties (in id order) is found. Weights are summed in 2^-63 fixed point in 128 bits:
// integer adds are exact and order-free, so the sums are the exact sums of the weights (the host
// adds doubles: they differ from these by rounding only, a token differs when u lands within
// ~1e-14 of a boundary) and the result does not depend on how the atomics interleave.
namespace {

constexpr int kSampleThreads = 1024, kSampleWarps = kSampleThreads / 32;
constexpr int kBins = 2048;
using u128 = unsigned __int128;

struct Hist {
  unsigned long long lo[kBins];  // low 64 bits of a bin's weight (2^-63 units)
  uint32_t hi[kBins];            // its carries
  uint32_t cnt[kBins];
  int32_t first[kBins];  // lowest id, on levels whose bins are single keys
};
constexpr size_t kSampleSmem = 2 * sizeof(Hist);

// A range of key offsets [a, b] (offset = largest key - key: 0 is the best) cut into bins of
// 2^s offsets; the last bin also takes every offset past the others. s < 0: the weights' first
// level, binned linearly in the logit (RowCtx::bucket). bucket >= 0: only the tokens of that
// first-level bin.
struct Level {
  uint32_t a, b;
  int s;
  int bucket = -1;
};
// Where a search stopped: a single key, the candidates above it and the weight they carry.
struct Found {
  bool found;
  uint32_t key;
  uint32_t cnt;  // candidates with that key
  int first;     // the lowest of their ids, -1 when not tracked
  unsigned long long above_cnt;
  u128 above_mass;
};
// What a search looks for: the first rank whose count through it exceeds r (kind 0), whose
// weight through it exceeds (1) or reaches (2) bound.
struct Crit {
  int kind;
  unsigned long long r;
  u128 bound;
};
struct Shared {
  uint32_t kmax, kmin;
  int argmax;
  int bin;
  unsigned long long base_cnt;
  u128 base_mass;
  u128 total, minp_mass;
  uint32_t minp_cnt;
  int tie;
  uint32_t warp_key[kSampleWarps], warp_kmin[kSampleWarps];
  int warp_idx[kSampleWarps];
  uint32_t warp_cnt[kSampleWarps];
  u128 warp_mass[kSampleWarps];
};

__device__ __forceinline__ uint32_t key_of(float x) {
  if (isnan(x)) return 0;  // below everything (-inf is 0x007fffff)
  const uint32_t b = __float_as_uint(x == 0.0f ? 0.0f : x);  // -0 ties +0, as the host compares
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float value_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
// The host's weight, exp((x - top) * (1 / T)) in double; under 2^-63 it is 0 in fixed point
// anyway (and no longer moves a host sum that holds the best token's 1).
__device__ __forceinline__ double weight(float x, double top, double inv_t) {
  const double d = __dmul_rn(__dsub_rn(double(x), top), inv_t);
  return d >= -44.0 ? exp(d) : 0.0;
}
__device__ __forceinline__ unsigned long long fixed(double w) { return (unsigned long long)(ldexp(w, 63)); }
__device__ __forceinline__ double to_double(u128 v) {
  return ldexp(double((unsigned long long)(v >> 64)), 1) + ldexp(double((unsigned long long)v), -63);
}
__device__ __forceinline__ u128 to_fixed(double x) {
  if (!(x > 0)) return 0;
  if (!(x < 1e30)) return ~u128(0);
  const double hi = floor(x * 0.5);
  return (u128((unsigned long long)hi) << 64) | (unsigned long long)(ldexp(x - 2.0 * hi, 63));
}
__device__ __forceinline__ u128 bin_mass(const Hist& h, int b) { return (u128(h.hi[b]) << 64) | h.lo[b]; }
__device__ __forceinline__ bool crosses(const Crit& c, unsigned long long cnt, u128 m) {
  return c.kind == 0 ? cnt > c.r : c.kind == 1 ? m > c.bound : m >= c.bound;
}
__device__ __forceinline__ u128 shfl_up_u128(u128 v, int o) {
  const unsigned long long lo = __shfl_up_sync(0xffffffffu, (unsigned long long)v, o);
  const unsigned long long hi = __shfl_up_sync(0xffffffffu, (unsigned long long)(v >> 64), o);
  return (u128(hi) << 64) | lo;
}
__device__ __forceinline__ u128 shfl_xor_u128(u128 v, int o) {
  const unsigned long long lo = __shfl_xor_sync(0xffffffffu, (unsigned long long)v, o);
  const unsigned long long hi = __shfl_xor_sync(0xffffffffu, (unsigned long long)(v >> 64), o);
  return (u128(hi) << 64) | lo;
}

__device__ uint64_t splitmix64_dev(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// ops::uniform_draw, bit for bit.
__device__ double uniform_draw_dev(uint64_t seed, uint64_t step) {
  const uint64_t bits = splitmix64_dev(splitmix64_dev(seed) ^ (step * 0xD1B54A32D192ED03ull));
  return double(bits >> 11) * 0x1.0p-53;
}

__device__ __forceinline__ int shift_for(uint32_t width) {
  int s = 0;
  while ((width >> s) >= uint32_t(kBins)) ++s;
  return s;
}

// The row's context: candidates are the ids i with offset o < ok, or o == ok and i <= ik (top_k).
template <class T>
struct RowCtx {
  const T* row;
  int V;
  uint32_t kmax, ok;
  int ik;
  double top, inv_t;
  float min_p;
  double scale;  // first-level bins a logit unit
  // The first-level bin: the host sampler's bucketing, linear in (top - x). Float keys are
  // logarithmic near 0, so bins of keys put most of a model's logits in a dozen bins (and their
  // atomics on a dozen words); linear bins spread them.
  __device__ int bucket(float x) const {
    const double d = (top - double(x)) * scale;
    return d < double(kBins - 1) ? int(d) : kBins - 1;  // also -inf and NaN
  }
};

// Counts (and with `mass`, weighs) the candidates of level L's range into h. With `totals`, also
// the whole weight and the count and weight of the candidates weighing at least min_p.
template <class T>
__device__ void hist_pass(const RowCtx<T>& c, const Level& L, bool mass, bool totals, Hist& h, Shared& sh) {
  __syncthreads();  // the previous user of h is done
  for (int b = int(threadIdx.x); b < kBins; b += kSampleThreads) h.lo[b] = 0, h.hi[b] = 0, h.cnt[b] = 0, h.first[b] = INT_MAX;
  __syncthreads();
  const bool track_first = L.s == 0, linear = L.s < 0;
  uint32_t minp_cnt = 0;
  u128 total = 0, minp_mass = 0;
  const int lane = int(threadIdx.x) % 32;
  // Whole warps run every round (the bound is the block's), so the warp collectives below see
  // all 32 lanes; a lane with nothing to add has bin -1.
  for (int base = 0; base < c.V; base += kSampleThreads) {
    const int i = base + int(threadIdx.x);
    int bin = -1;
    unsigned long long f = 0;
    if (i < c.V) {
      const float x = load_f(c.row + i);
      const uint32_t o = c.kmax - key_of(x);
      if (o >= L.a && o <= L.b && (o < c.ok || (o == c.ok && i <= c.ik)) &&
          (L.bucket < 0 || c.bucket(x) == L.bucket)) {
        bin = linear ? c.bucket(x) : int(min((o - L.a) >> L.s, uint32_t(kBins - 1)));
        if (mass) {
          const double w = weight(x, c.top, c.inv_t);
          f = fixed(w);
          if (totals) {
            total += f;
            if (w >= double(c.min_p) && f > 0) ++minp_cnt, minp_mass += f;
          }
        }
      }
    }
    // Lanes that share a bin add once: a flat bf16 row has 150k tokens on a few logit values,
    // and -inf-masked tokens all share the last bin; one word taking 32 atomics at a time is the
    // pass's slowest part. Two rounds, each for the bin of the lowest lane still pending, when
    // at least 4 lanes share it; the others add their own.
    unsigned pending = __ballot_sync(0xffffffffu, bin >= 0);
    for (int round = 0; round < 2 && pending; ++round) {
      const int lead = __ffs(pending) - 1;
      const int lb = __shfl_sync(0xffffffffu, bin, lead);
      const unsigned same = __ballot_sync(0xffffffffu, bin == lb);
      if (__popc(same) < 4) break;
      u128 m = bin == lb ? u128(f) : u128(0);
      if (mass)
        for (int o = 16; o > 0; o >>= 1) m += shfl_xor_u128(m, o);
      if (lane == lead) {  // the lowest lane: the group's lowest id
        atomicAdd(&h.cnt[lb], unsigned(__popc(same)));
        if (track_first) atomicMin(&h.first[lb], i);
        const unsigned long long lo = (unsigned long long)m;
        const uint32_t hi = uint32_t(m >> 64);
        const unsigned long long old = lo ? atomicAdd(&h.lo[lb], lo) : 0;
        const uint32_t carry = hi + (old + lo < old ? 1u : 0u);
        if (carry) atomicAdd(&h.hi[lb], carry);
      }
      if (bin == lb) bin = -1;
      pending &= ~same;
    }
    if (bin >= 0) {
      atomicAdd(&h.cnt[bin], 1u);
      if (track_first) atomicMin(&h.first[bin], i);
      if (f) {
        const unsigned long long old = atomicAdd(&h.lo[bin], f);
        if (old + f < old) atomicAdd(&h.hi[bin], 1u);
      }
    }
  }
  if (totals) {
    for (int o = 16; o > 0; o >>= 1) {
      total += shfl_xor_u128(total, o);
      minp_mass += shfl_xor_u128(minp_mass, o);
      minp_cnt += __shfl_xor_sync(0xffffffffu, minp_cnt, o);
    }
    const int warp = int(threadIdx.x) / 32;
    if (threadIdx.x % 32 == 0) sh.warp_mass[warp] = total, sh.warp_cnt[warp] = minp_cnt;
    __syncthreads();
    if (threadIdx.x < 32) {
      u128 t = sh.warp_mass[threadIdx.x];
      for (int o = 16; o > 0; o >>= 1) t += shfl_xor_u128(t, o);
      if (threadIdx.x == 0) sh.total = t;
    }
    __syncthreads();
    if (threadIdx.x % 32 == 0) sh.warp_mass[warp] = minp_mass;
    __syncthreads();
    if (threadIdx.x < 32) {
      u128 t = sh.warp_mass[threadIdx.x];
      uint32_t n = sh.warp_cnt[threadIdx.x];
      for (int o = 16; o > 0; o >>= 1) t += shfl_xor_u128(t, o), n += __shfl_xor_sync(0xffffffffu, n, o);
      if (threadIdx.x == 0) sh.minp_mass = t, sh.minp_cnt = n;
    }
  }
  __syncthreads();
}

// The first non-empty bin (best first) where the criterion, counted from sh.base_*, is met:
// sh.bin (-1: none) and sh.base_* advanced past the bins before it. One warp: each lane sums 64
// bins, a scan of the lanes finds the lane, that lane walks its bins.
__device__ void find_bin(const Hist& h, const Crit& c, Shared& sh) {
  if (threadIdx.x < 32) {
    const int lane = int(threadIdx.x), b0 = lane * (kBins / 32);
    const unsigned long long base_cnt = sh.base_cnt;
    const u128 base_mass = sh.base_mass;
    unsigned long long cnt = 0;
    u128 m = 0;
    for (int k = 0; k < kBins / 32; ++k) {
      const int b = b0 + ((k + lane) & (kBins / 32 - 1));  // rotated: the lanes hit distinct banks
      cnt += h.cnt[b];
      m += bin_mass(h, b);
    }
    unsigned long long ic = cnt;
    u128 im = m;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned long long pc = __shfl_up_sync(0xffffffffu, ic, o);
      const u128 pm = shfl_up_u128(im, o);
      if (lane >= o) ic += pc, im += pm;
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, crosses(c, base_cnt + ic, base_mass + im));
    if (ballot == 0) {
      if (lane == 0) sh.bin = -1;
    } else if (lane == __ffs(ballot) - 1) {
      unsigned long long cc = base_cnt + ic - cnt;
      u128 cm = base_mass + im - m;
      int found = -1;
      for (int b = b0; b < b0 + kBins / 32; ++b) {
        if (h.cnt[b] == 0) continue;
        const unsigned long long nc = cc + h.cnt[b];
        const u128 nm = cm + bin_mass(h, b);
        if (crosses(c, nc, nm)) {
          found = b;
          break;
        }
        cc = nc, cm = nm;
      }
      sh.bin = found, sh.base_cnt = cc, sh.base_mass = cm;
    }
  }
  __syncthreads();
}

// The key offsets linear bin b of level L can hold: its logit bounds (top - (b + 1) / scale,
// top - b / scale], widened by far more than the double rounding of the bin index (also where a
// bound is near 0 and float steps are tiny) and then by two floats. Keys of other bins that this
// takes in are left out by the passes' bin test.
template <class T>
__device__ uint2 bucket_keys(const RowCtx<T>& c, const Level& L, int b) {
  if (c.scale == 0.0) return make_uint2(L.a, L.b);
  const double slack = (fabs(c.top) + double(b + 1) / c.scale) * 1e-12;
  const float hi = nextafterf(nextafterf(float(c.top - double(b) / c.scale + slack), INFINITY), INFINITY);
  const uint32_t a = b == 0 ? L.a : max(L.a, c.kmax - min(c.kmax, key_of(hi)));
  if (b == kBins - 1) return make_uint2(a, L.b);
  const float lo =
      nextafterf(nextafterf(float(c.top - double(b + 1) / c.scale - slack), -INFINITY), -INFINITY);
  return make_uint2(a, max(a, min(L.b, c.kmax - min(c.kmax, key_of(lo)))));
}

// Narrows level L (its histogram in h) down to the key where the criterion is met. `work` holds
// the deeper levels (it may be h: h is read before it is reused).
template <class T>
__device__ Found descend(const RowCtx<T>& c, Level L, const Crit& crit, bool mass, Hist* h, Hist* work, Shared& sh) {
  __syncthreads();
  if (threadIdx.x == 0) sh.base_cnt = 0, sh.base_mass = 0;
  __syncthreads();
  for (int level = 0;; ++level) {
    find_bin(*h, crit, sh);
    const int bin = sh.bin;
    if (bin < 0) return Found{false, 0, 0, -1, sh.base_cnt, sh.base_mass};
    if (L.s < 0) {  // into a linear bin: the keys its logits can have, by the keys after
      const uint2 r = bucket_keys(c, L, bin);
      L = Level{r.x, r.y, shift_for(r.y - r.x), bin};
      hist_pass(c, L, mass, false, *work, sh);
      h = work;
      continue;
    }
    const uint64_t a = uint64_t(L.a) + (uint64_t(bin) << L.s);
    const uint64_t b = bin == kBins - 1 ? uint64_t(L.b) : min(uint64_t(L.b), a + (uint64_t(1) << L.s) - 1);
    if (a == b || level == 7)
      return Found{true, c.kmax - uint32_t(a), h->cnt[bin], L.s == 0 ? h->first[bin] : -1, sh.base_cnt, sh.base_mass};
    L = Level{uint32_t(a), uint32_t(b), shift_for(uint32_t(b - a)), L.bucket};
    hist_pass(c, L, mass, false, *work, sh);
    h = work;
  }
}

// The j-th lowest id (from 0) among the candidates with key `key`: each warp counts a
// contiguous slice, the warp whose slice holds it finds it.
template <class T>
__device__ int tie_pass(const RowCtx<T>& c, uint32_t key, uint32_t j, Shared& sh) {
  const int limit = c.kmax - key == c.ok ? c.ik : INT_MAX;
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int chunk = (c.V + kSampleWarps - 1) / kSampleWarps;
  const int lo = warp * chunk, hi = min(c.V, lo + chunk);
  __syncthreads();
  if (threadIdx.x == 0) sh.tie = -1;
  uint32_t n = 0;
  for (int base = lo; base < hi; base += 32) {
    const int i = base + lane;
    n += __popc(__ballot_sync(0xffffffffu, i < hi && i <= limit && key_of(load_f(c.row + i)) == key));
  }
  if (lane == 0) sh.warp_cnt[warp] = n;
  __syncthreads();
  uint32_t before = 0;
  for (int w = 0; w < warp; ++w) before += sh.warp_cnt[w];
  if (before <= j && j < before + n) {
    for (int base = lo; base < hi; base += 32) {
      const int i = base + lane;
      unsigned m = __ballot_sync(0xffffffffu, i < hi && i <= limit && key_of(load_f(c.row + i)) == key);
      const uint32_t here = uint32_t(__popc(m));
      if (j < before + here) {
        for (uint32_t k = 0; k < j - before; ++k) m &= m - 1;
        if (lane == 0) sh.tie = base + __ffs(m) - 1;
        break;
      }
      before += here;
    }
  }
  __syncthreads();
  return sh.tie;
}

template <class T>
__device__ int pick(const RowCtx<T>& c, const Found& f, uint32_t j, Shared& sh) {
  if (j == 0 && f.first >= 0) return f.first;
  const int t = tie_pass(c, f.key, j, sh);
  return t >= 0 ? t : sh.argmax;  // not reached: the tie group holds j
}

template <class T>
__global__ void __launch_bounds__(kSampleThreads) sample_rows_kernel(const T* logits, int64_t stride, int V,
                                                                     const ops::RowSampling* rows, int32_t* ids) {
  extern __shared__ __align__(16) unsigned char smem[];
  Hist* h = reinterpret_cast<Hist*>(smem);
  __shared__ Shared sh;
  const T* row = logits + int64_t(blockIdx.x) * stride;
  const ops::RowSampling p = rows[blockIdx.x];
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;

  // The largest key (its lowest id: the greedy token) and the smallest.
  uint32_t best = 0, least = 0xffffffffu;
  int idx = INT_MAX;
  for (int i = int(threadIdx.x); i < V; i += kSampleThreads) {
    const uint32_t k = key_of(load_f(row + i));
    if (k > best || idx == INT_MAX) best = k, idx = i;
    least = min(least, k);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
    least = min(least, __shfl_xor_sync(0xffffffffu, least, o));
  }
  if (lane == 0) sh.warp_key[warp] = best, sh.warp_idx[warp] = idx, sh.warp_kmin[warp] = least;
  __syncthreads();
  if (threadIdx.x < 32) {
    best = sh.warp_key[lane], idx = sh.warp_idx[lane], least = sh.warp_kmin[lane];
    for (int o = 16; o > 0; o >>= 1) {
      const uint32_t ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
      if (ob > best || (ob == best && oi < idx)) best = ob, idx = oi;
      least = min(least, __shfl_xor_sync(0xffffffffu, least, o));
    }
    if (lane == 0) sh.kmax = best, sh.argmax = idx == INT_MAX ? 0 : idx, sh.kmin = least;
  }
  __syncthreads();
  if (p.temperature <= 0.0f || p.top_k == 1) {
    if (threadIdx.x == 0) ids[blockIdx.x] = sh.argmax;
    return;
  }
  RowCtx<T> c{row, V, sh.kmax, 0xffffffffu, INT_MAX, double(value_of(sh.kmax)), 1.0 / double(p.temperature), p.min_p,
              0.0};
  const uint32_t omax = sh.kmax - sh.kmin;

  // The first level: linear bins from the best logit down to the lowest, or to 45 temperatures
  // below the best (lower ones weigh nothing and share the last bin).
  const double low = fmax(double(value_of(sh.kmin)), c.top - 45.0 * double(p.temperature));
  c.scale = c.top > low ? double(kBins - 1) / (c.top - low) : 0.0;
  const Level L0{0, omax, -1};

  // top_k: the k-th ranked token bounds the candidates (its ties by id).
  unsigned long long ncand = unsigned(V);
  if (p.top_k > 0 && p.top_k < V) {
    hist_pass(c, L0, false, false, h[1], sh);
    const Found f = descend(c, L0, Crit{0, (unsigned long long)(p.top_k - 1), 0}, false, &h[1], &h[1], sh);
    const uint32_t j = uint32_t((unsigned long long)(p.top_k - 1) - f.above_cnt);
    const int last = j + 1 < f.cnt ? pick(c, f, j, sh) : INT_MAX;
    c.ok = c.kmax - f.key, c.ik = last;
    ncand = unsigned(p.top_k);
  }

  hist_pass(c, L0, true, true, h[0], sh);
  const double total = to_double(sh.total);
  unsigned long long count = ncand;
  double kept = total;
  if (p.top_p < 1.0f) {  // the shortest prefix reaching top_p of the weight
    const double bound = double(p.top_p) * total;
    const Found f = descend(c, L0, Crit{2, 0, to_fixed(bound)}, true, &h[0], &h[1], sh);
    if (f.found) {
      const double w = weight(value_of(f.key), c.top, c.inv_t), above = to_double(f.above_mass);
      const double q = w > 0 ? ceil((bound - above) / w) - 1.0 : 0.0;
      const uint32_t j = uint32_t(fmin(fmax(q, 0.0), double(f.cnt - 1)));
      count = f.above_cnt + j + 1, kept = above + double(j + 1) * w;
    }
  }
  if (p.min_p > 0.0f) {  // then the ranks under min_p (the best weighs 1)
    const unsigned long long n = max(sh.minp_cnt, 1u);
    if (n < count) count = n, kept = sh.minp_cnt >= 1 ? to_double(sh.minp_mass) : 1.0;
  }
  // The draw: the first rank whose cumulative weight exceeds u of the kept weight.
  const double bound = uniform_draw_dev(p.seed, p.step) * kept;
  Found f = descend(c, L0, Crit{1, 0, to_fixed(bound)}, true, &h[0], &h[1], sh);
  unsigned long long rank = ncand;
  uint32_t j = 0;
  if (f.found) {
    const double w = weight(value_of(f.key), c.top, c.inv_t), above = to_double(f.above_mass);
    const double q = w > 0 ? floor((bound - above) / w) : 0.0;
    j = uint32_t(fmin(fmax(q, 0.0), double(f.cnt - 1)));
    rank = f.above_cnt + j;
  }
  if (rank >= count) {  // past the kept ranks (rounding): the last kept one
    rank = count - 1;
    f = descend(c, L0, Crit{0, rank, 0}, false, &h[0], &h[1], sh);
    j = uint32_t(rank - f.above_cnt);
  }
  const int token = pick(c, f, j, sh);
  if (threadIdx.x == 0) ids[blockIdx.x] = token;
}

}  // namespace

void sample_rows_into(const Tensor& logits, std::span<const ops::RowSampling> rows, Tensor& ids) {
  check_device_tensor(logits, {DType::BF16, DType::F32}, "sample_rows", "logits");
  MS_CHECK(logits.dim() == 2 && (logits.size(1) <= 1 || logits.strides()[1] == 1), "sample_rows: ",
           logits.describe(), " must be [rows, vocab] with contiguous rows");
  const int64_t n = logits.size(0), vocab = logits.size(1);
  MS_CHECK(vocab > 0 && vocab < (int64_t(1) << 31), "sample_rows: vocabulary of ", vocab);
  if (n == 0) return;
  static_assert(sizeof(ops::RowSampling) == 32 && alignof(ops::RowSampling) == 8);
  const Tensor params = upload_i32(std::span<const int32_t>(reinterpret_cast<const int32_t*>(rows.data()), rows.size() * 8));
  MS_FLOAT_DISPATCH(logits.dtype(), T, {
    static PerDeviceOnce smem_limit;
    smem_limit([] {
      MS_CUDA(cudaFuncSetAttribute(sample_rows_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSampleSmem)));
    });
    sample_rows_kernel<T><<<unsigned(n), kSampleThreads, kSampleSmem, stream()>>>(
        logits.data<T>(), logits.strides()[0], int(vocab), reinterpret_cast<const ops::RowSampling*>(params.raw()),
        ids.data<int32_t>());
  });
  MS_CUDA_LAUNCHED("sample_rows_kernel");
}

namespace {
// Pinned host memory the copy lands in (mapped: copy_kernels), and an event the host waits on
// instead of the stream.
class CudaReadback final : public ops::HostReadback {
 public:
  explicit CudaReadback(int64_t capacity) : capacity_(capacity) {
    host_ = static_cast<int32_t*>(alloc_mapped(size_t(std::max<int64_t>(capacity, 1)) * sizeof(int32_t)));
    mapped_ = mapped_device_ptr(host_);
    MS_CUDA(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~CudaReadback() override {
    cudaEventSynchronize(done_);  // no copy may land in freed memory
    cudaEventDestroy(done_);
    cudaFreeHost(host_);
  }
  void start(const Tensor& ids) override {
    check_device_tensor(ids, {DType::I32}, "readback", "ids");
    MS_CHECK(ids.numel() <= capacity_ && ids.is_contiguous(), "readback of ", ids.describe(), ", capacity ", capacity_);
    MS_CUDA(cudaEventSynchronize(done_));  // the previous copy's values were read
    count_ = size_t(ids.numel());
    if (copy_kernels()) copy_words(ids.raw(), mapped_, int64_t(count_));
    else MS_CUDA(cudaMemcpyAsync(host_, ids.raw(), count_ * sizeof(int32_t), cudaMemcpyDeviceToHost, stream()));
    MS_CUDA(cudaEventRecord(done_, stream()));
  }
  std::span<const int32_t> wait() override {
    MS_CUDA(cudaEventSynchronize(done_));
    return {host_, count_};
  }

 private:
  int64_t capacity_;
  int32_t* host_ = nullptr;
  void* mapped_ = nullptr;  // host_'s device address
  cudaEvent_t done_ = nullptr;
  size_t count_ = 0;
};
}  // namespace

std::unique_ptr<ops::HostReadback> make_host_readback(int64_t capacity) {
  return std::make_unique<CudaReadback>(capacity);
}

}  // namespace ms::cuda
