// What a whole-step persistent kernel could make of a batch-1 decode step (issue 9): the byte
// structure of Qwen3-30B-A3B's layer at batch 1 (bf16, 4096 keys) as a chain of dependent
// matrix-vector phases, run four ways on the same code:
//   launches:   one launch a phase (captured in a CUDA graph), as the engine's kernels are;
//   persistent: one kernel, the phases met at grid barriers, each block's weights fetched only
//               once the phase's inputs are ready;
//   streamed:   one kernel, each block's producer warp fetching the next phases' weights into its
//               shared-memory ring while the block still computes or waits at a barrier: only
//               the experts' weights wait (for the router), as their addresses depend on it;
//   dataflow:   streamed, without grid barriers: a block's chunks of rows are every 132nd, each
//               published (a counter a chunk) once written, and a third warp brings each
//               phase's x in as the rows it comes from are published, into one of two buffers,
//               so the next phase's x arrives while the block still works on this one.
// Session 34 measured a grid barrier at 1.20 µs, about twice PDL's kernel boundary; the question
// here is whether streaming weights across the barriers (which kernel boundaries prevent: the
// next kernel's blocks find no room beside the last's) brings a layer near its bytes over the
// copy bandwidth (28.6 µs) where the engine's kernels take ~51 µs (BENCHMARKS, session 34).
//
// A layer's phases, y = W x over the previous phase's output (the math is a stand-in for the
// real ops; the bytes, the rows a block owns and the dependencies are the layer's):
//   qkv    5120 x 2048   x = rmsnorm(hidden)
//   keys  16384 x  256   the 4096 keys' K and V of 4 heads (8.4 MB), x = qkv's first 256
//   o      2048 x 4096   x = keys' first 4096
//   router  128 x 2048   x = rmsnorm(o)
//   gate|up 8 x 1536 x 2048 of 128 experts, the router's top 8, x = rmsnorm(o)
//   down   2048 x 8 x 768, x = w_j * silu(gate_j) * up_j; the next layer's hidden
// `phase_chain [layers]` prints one JSON line: per-layer microseconds of each way, of the streamed
// and dataflow ways without the products, without the inputs x, without the barriers (where each cost goes),
// each phase alone, the bytes, the copy bandwidth, and the largest relative difference of the
// last hidden between the ways (0, or the program exits 1). `phase_chain ring`: the ring's own
// rate over one 1 GiB phase, with and without products.
// Standalone (CUDA runtime only; the project's mbarrier helpers from their header), so the GPU
// machine builds it in seconds:
//   nvcc -std=c++20 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc bench/phase_chain.cu -o phase_chain
// or the CMake target ms_phase_chain.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/mbarrier.cuh"  // mbar_init, mbar_arrive, mbar_wait, expect_bytes (device code only)

#define CHECK(call)                                                                                  \
  do {                                                                                               \
    const cudaError_t err_ = (call);                                                                 \
    if (err_ != cudaSuccess) {                                                                       \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(2);                                                                                  \
    }                                                                                                \
  } while (0)

namespace {

using bf16 = __nv_bfloat16;
using namespace ms::cuda::wg;

constexpr int kHidden = 2048, kInter = 768, kExperts = 128, kTopK = 8;
constexpr int kPhasesPerLayer = 6;
// Eight consumer warps, the weight producer warp, and (dataflow only) the warp that brings x in.
constexpr int kConsumerWarps = 8, kProducerWarp = kConsumerWarps, kXWarp = kConsumerWarps + 1;
constexpr int kThreads = (kConsumerWarps + 2) * 32;
// The ring (PC_STAGE_BYTES x PC_STAGES at compile time: 192 KB either way for 32 KB x 6, 16 KB x 12).
#ifndef PC_STAGE_BYTES
#define PC_STAGE_BYTES 32768
#define PC_STAGES 6
#endif
constexpr int kStageBytes = PC_STAGE_BYTES, kStages = PC_STAGES, kMaxK = kTopK * kInter;  // down's row: 6144
constexpr int kMaxStageRows = kStageBytes / 512;  // a stage's rows: at least 256 values each

enum Kind { Dense, GateUp, Down };
enum XMode { Plain, Norm, Swiglu };

struct Phase {
  int kind, x_mode;
  int n, k;            // rows; a row's elements (Down: the 8 experts' segments end to end)
  const bf16* w;       // Dense [n][k]; GateUp [E][2 * inter][hidden]; Down [E][hidden][inter]
  const float* x_src;  // the output x is computed from
  float* y;            // [n]
  int dep;             // phase whose completion x needs (-1: none)
  int router;          // GateUp / Down: the router phase picking the experts
  int x_phase;         // the phase whose y is x_src (-1: the first hidden)
  unsigned* rows_done; // dataflow: a counter a chunk of rows, the rows of it written
  int rot;             // dataflow: the block taking chunk 0 (rotated by the chunks before, so that
                       // no block takes the extra chunk of every phase)
};

// The dataflow way's waits, cycles summed a block: the x warp's polls of the rows published (and
// how many), its batches of x loads (and how many), its waits for a free buffer and for the
// router; the consumers' waits for x; the producer's for the router.
enum Stat { kPolls, kPollCycles, kLoads, kLoadCycles, kBufferWait, kXRouterWait, kConsumerWait, kRouterWait, kStats };

struct Args {
  const Phase* phases;
  int begin, end;      // phases this launch runs
  unsigned* done;      // a counter a phase: blocks finished with it
  int stream_ahead;    // the producer fetches across barriers (but not ahead of the router)
  int compute;         // 1; 0: the consumers only take the chunks and hand them back (the stream
                       // alone); -1: nor do they load x
  int ordered;         // 0: no phase waits for another (the ring's own streaming rate)
  unsigned long long* stats;  // dataflow: kStats cycle counts a block (where the warps wait)
  int dataflow;        // no grid barriers: a block's chunks are every gridDim-th, each published as
                       // it is written; the x warp brings x in as its rows are published
};

// Smem: the ring, x (bf16, as the engine's activations: a lane's 8 values one 16-byte load; two
// buffers, phases alternating, in the dataflow way), the barriers, the experts picked by the
// producer and by the x warp (ids, weights), x's norm scale and
// readiness, the consumers' phase count, a stage's row sums (a warp's share each, two stages).
constexpr int kXOffset = kStages * kStageBytes;
constexpr int kBarOffset = kXOffset + 2 * kMaxK * 2;
constexpr int kSelOffset = kBarOffset + 2 * kStages * 8;
constexpr int kXSelOffset = kSelOffset + 2 * kTopK * 4;
constexpr int kScaleOffset = kXSelOffset + 2 * kTopK * 4;  // float [2]
constexpr int kXReadyOffset = kScaleOffset + 8;                 // int [2]: the phase + 1 whose x is in
constexpr int kConsumedOffset = kXReadyOffset + 8;              // int: phases the consumers are done with
constexpr int kRowsOffset = kConsumedOffset + 8;
constexpr int kSmemBytes = kRowsOffset + 2 * kConsumerWarps * kMaxStageRows * 4;

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// A stage's bytes from global memory: by the copy engine (one bulk copy a segment, issued by lane
// 0), or with PC_LANE_COPIES by the producer warp's lanes, 16-byte cp.async each (L2 only), each
// lane arriving on the stage's barrier once its copies have landed.
#ifdef PC_LANE_COPIES
constexpr bool kLaneCopies = true;
#else
constexpr bool kLaneCopies = false;
#endif
__device__ __forceinline__ void copy_segment(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar, int lane) {
  if (!kLaneCopies) {
    if (lane == 0) bulk_copy(dst, src, bytes, bar);
    return;
  }
  const char* from = static_cast<const char*>(src);
  for (uint32_t off = lane * 16; off < bytes; off += 32 * 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + off), "l"(from + off) : "memory");
}
__device__ __forceinline__ void wait_done(const unsigned* done, int phase, int ordered) {
  if (phase < 0 || !ordered) return;
  unsigned seen;
  do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(done + phase) : "memory");
  while (seen < gridDim.x);
}
__device__ __forceinline__ void consumers_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32)); }
__device__ __forceinline__ int volatile_load(const int* p) { return *reinterpret_cast<const volatile int*>(p); }

// A phase's rows go in chunks of a stage each (rows of full length; at most ceil(n / blocks), so
// the router's 128 rows spread over 128 blocks). The same chunks in every way, so each row's sum
// is the same bits: a block owns a contiguous run of them, or in the dataflow way every
// gridDim-th (chunks finish in row order across the grid: a round of chunks at a time).
__device__ __forceinline__ int chunk_rows(const Phase& p) {
  return min(max(1, kStageBytes / (2 * p.k)), (p.n + int(gridDim.x) - 1) / int(gridDim.x));
}
struct Chunks {
  int begin, end, step;
};
__device__ __forceinline__ Chunks my_chunks(const Phase& p, int dataflow) {
  const int n = (p.n + chunk_rows(p) - 1) / chunk_rows(p), b = blockIdx.x, g = gridDim.x;
  if (dataflow) return {(b - p.rot % g + g) % g, n, g};
  return {int(int64_t(n) * b / g), int(int64_t(n) * (b + 1) / g), 1};
}

// Dataflow: where the published rows of phase s's output end, from row lo (a chunk's rows count
// once every one of them is written), polled once by the calling warp: hi if all of [lo, hi) are.
// Relaxed loads (all in flight at once), then an acquire fence for the rows' values.
__device__ int published_upto(const Phase& s, int lo, int hi) {
  const int r = chunk_rows(s), lane = threadIdx.x & 31, c0 = lo / r, c1 = min((hi + r - 1) / r, c0 + 8 * 32);
  unsigned seen[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = c0 + lane + 32 * i;
    seen[i] = ~0u;
    if (c < c1) asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(seen[i]) : "l"(s.rows_done + c) : "memory");
  }
  int first = c1;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int c = c0 + lane + 32 * i;
    if (c < c1 && seen[i] < unsigned(min(r, s.n - c * r))) first = min(first, c);
  }
  for (int o = 16; o; o >>= 1) first = min(first, __shfl_xor_sync(~0u, first, o));
  asm volatile("fence.acq_rel.gpu;" ::: "memory");
  return min(hi, first * r);
}
__device__ void wait_published(const Args& a, int q, int hi) {
  if (q < 0 || !a.ordered) return;
  while (published_upto(a.phases[q], 0, hi) < hi) {
  }
}

// Eight bf16 as f32 by a shift or a mask each: the form the figures in BENCHMARKS were measured
// with (cuda_common.h's unpack8 gives the same values through bf16 pair conversions, whose code
// was not timed here).
__device__ __forceinline__ void unpack8(uint4 u, float f[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
  for (int i = 0; i < 4; ++i)
    f[2 * i] = __uint_as_float(w[i] << 16), f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
}

// The router's top 8 by one warp (softmax over the 128 logits, the 8 renormalised): ids and weights.
__device__ void pick_experts(const float* logits, int* ids, float* wts) {
  const int lane = threadIdx.x & 31;
  float v[kExperts / 32];
  float mx = -INFINITY;
  for (int i = 0; i < kExperts / 32; ++i) v[i] = __ldcg(logits + lane + 32 * i), mx = fmaxf(mx, v[i]);
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, o));
  float sum = 0;
  for (int j = 0; j < kTopK; ++j) {
    float best = -INFINITY;
    int at = 0;
    for (int i = 0; i < kExperts / 32; ++i)
      if (v[i] > best) best = v[i], at = lane + 32 * i;
    for (int o = 16; o; o >>= 1) {
      const float b2 = __shfl_xor_sync(~0u, best, o);
      const int a2 = __shfl_xor_sync(~0u, at, o);
      if (b2 > best || (b2 == best && a2 < at)) best = b2, at = a2;
    }
    if ((at & 31) == lane) v[at >> 5] = -INFINITY;
    const float e = __expf(best - mx);
    sum += e;
    if (lane == 0) ids[j] = at, wts[j] = e;
  }
  __syncwarp();
  if (lane < kTopK) wts[lane] /= sum;
  __syncwarp();
}

// The producer warp: the block's rows of every phase, chunk by chunk, into the ring.
__device__ void produce(const Args& a, char* smem) {
  const int lane = threadIdx.x & 31;
  int* ids = reinterpret_cast<int*>(smem + kSelOffset);
  float* wts = reinterpret_cast<float*>(smem + kSelOffset + kTopK * 4);
  const uint32_t ring = smem_addr(smem), full = smem_addr(smem + kBarOffset), empty = full + kStages * 8;
  int item = 0, picked_by = -1;
  for (int ph = a.begin; ph < a.end; ++ph) {
    const Phase p = a.phases[ph];
    if (!a.stream_ahead && lane == 0) wait_done(a.done, p.dep, a.ordered);
    __syncwarp();
    if (p.kind != Dense && picked_by != p.router) {
      if (a.dataflow) {
        const long long t0 = clock64();
        wait_published(a, p.router, kExperts);
        if (lane == 0 && a.stats) a.stats[blockIdx.x * kStats + kRouterWait] += clock64() - t0;
      } else {
        if (lane == 0) wait_done(a.done, p.router, a.ordered);
        __syncwarp();
      }
      pick_experts(a.phases[p.router].y, ids, wts);
      picked_by = p.router;
    }
    const int per = chunk_rows(p);
    const Chunks ch = my_chunks(p, a.dataflow);
    for (int j = ch.begin; j < ch.end; j += ch.step, ++item) {
      const int c = j * per, rows = min(per, p.n - c), slot = item % kStages;
      if (item >= kStages) mbar_wait(empty + 8 * slot, ((item / kStages) - 1) & 1);
      const uint32_t bar = full + 8 * slot, dst = ring + slot * kStageBytes;
      if (!kLaneCopies && lane == 0) expect_bytes(bar, uint32_t(rows) * p.k * 2);
      if (p.kind == Dense) {
        copy_segment(dst, p.w + int64_t(c) * p.k, uint32_t(rows) * p.k * 2, bar, lane);
      } else if (p.kind == GateUp) {  // rows of one expert are contiguous: split where the expert changes
        for (int r = c; r < c + rows;) {
          const int j = r / (2 * kInter), local = r % (2 * kInter), run = min(c + rows - r, 2 * kInter - local);
          copy_segment(dst + uint32_t(r - c) * p.k * 2, p.w + (int64_t(ids[j]) * 2 * kInter + local) * kHidden,
                       uint32_t(run) * p.k * 2, bar, lane);
          r += run;
        }
      } else {  // Down: a row is 8 segments, one from each expert picked
        for (int r = 0; r < rows; ++r)
          for (int j = 0; j < kTopK; ++j)
            copy_segment(dst + uint32_t(r * p.k + j * kInter) * 2, p.w + (int64_t(ids[j]) * kHidden + c + r) * kInter,
                         kInter * 2, bar, lane);
      }
      if (kLaneCopies) asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
      __syncwarp();
    }
  }
}

// x's values i .. i + 7 from their source (rmsnorm's scale is applied to the row sums, not here).
__device__ __forceinline__ void x_values(const Phase& p, int i, const float* wts, float v[8]) {
  const float4* src = reinterpret_cast<const float4*>(p.x_src);
  if (p.x_mode != Swiglu) {
    const float4 lo = __ldcg(src + i / 4), hi = __ldcg(src + i / 4 + 1);
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    return;
  }
  const int j = i / kInter, f = i % kInter;  // expert j's gate rows, then its up rows, in gate|up's output
  const float4* g4 = src + (j * 2 * kInter + f) / 4;
  const float4* u4 = src + (j * 2 * kInter + kInter + f) / 4;
  const float4 g[2] = {__ldcg(g4), __ldcg(g4 + 1)}, u[2] = {__ldcg(u4), __ldcg(u4 + 1)};
  for (int h = 0; h < 2; ++h) {
    const float gs[4] = {g[h].x, g[h].y, g[h].z, g[h].w}, us[4] = {u[h].x, u[h].y, u[h].z, u[h].w};
    for (int e = 0; e < 4; ++e) v[4 * h + e] = wts[j] * gs[e] / (1.0f + __expf(-gs[e])) * us[e];
  }
}
__device__ __forceinline__ void store8(bf16* x, int i, const float v[8]) {
  uint4 packed;
  uint32_t* w = reinterpret_cast<uint32_t*>(&packed);
  for (int e = 0; e < 4; ++e) {
    __nv_bfloat162 two = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
    w[e] = *reinterpret_cast<uint32_t*>(&two);
  }
  *reinterpret_cast<uint4*>(x + i) = packed;
}
// rmsnorm's scale from the sum of squares of x as bf16, lane l having summed values 256 u + 8 l .. + 7
// in order of u (squares8), then the warp's sum: the same bits whichever warp computes it.
__device__ __forceinline__ float norm_scale(float lane_ss, int k) {
  for (int o = 16; o; o >>= 1) lane_ss += __shfl_xor_sync(~0u, lane_ss, o);
  return rsqrtf(lane_ss / k + 1e-6f);
}
__device__ __forceinline__ float squares8(const bf16* x) {
  float f[8], ss = 0;
  unpack8(*reinterpret_cast<const uint4*>(x), f);
  for (int e = 0; e < 8; ++e) ss += f[e] * f[e];
  return ss;
}

// The barrier ways' x for phase p, by the consumer warps: every load of a thread issued before the
// first store (the stores to shared memory would otherwise hold each L2 round trip behind the
// last); then warp 0 the norm's scale.
__device__ void load_x(const Phase& p, bf16* x, float* scale, const float* wts) {
  constexpr int kN = kConsumerWarps * 32, kPer = kMaxK / (8 * kN);
  const int t = threadIdx.x;
  float v[kPer][8];
#pragma unroll
  for (int q = 0; q < kPer; ++q)
    if (8 * (t + q * kN) < p.k)
      x_values(p, 8 * (t + q * kN), wts, v[q]);
#pragma unroll
  for (int q = 0; q < kPer; ++q)
    if (8 * (t + q * kN) < p.k) store8(x, 8 * (t + q * kN), v[q]);
  consumers_sync();
  if (t < 32) {
    float ss = 0;
    for (int u = 0; u < p.k / 256; ++u) ss += squares8(x + 256 * u + 8 * t);
    const float s = norm_scale(ss, p.k);
    if (t == 0) *scale = p.x_mode == Norm ? s : 1.0f;
  }
}

// The dataflow way's x warp: each phase's x into its buffer as the rows it comes from are
// published (units of 256 values, up to kXBatch a round trip), the buffer's readiness marked once
// all of x is in. A buffer is refilled only when the consumers are done with the phase before.
#ifndef PC_X_BATCH
#define PC_X_BATCH 8
#endif
constexpr int kXBatch = PC_X_BATCH;
__device__ void stream_x(const Args& a, char* smem) {
  if (a.compute < 0) return;  // the consumers neither load x nor wait for it
  const int lane = threadIdx.x & 31;
  unsigned long long st[kStats] = {};
  int* xready = reinterpret_cast<int*>(smem + kXReadyOffset);
  const int* consumed = reinterpret_cast<const int*>(smem + kConsumedOffset);
  float* scale = reinterpret_cast<float*>(smem + kScaleOffset);
  int* ids = reinterpret_cast<int*>(smem + kXSelOffset);
  float* wts = reinterpret_cast<float*>(smem + kXSelOffset + kTopK * 4);
  for (int ph = a.begin; ph < a.end; ++ph) {
    const Phase p = a.phases[ph];
    const Chunks ch = my_chunks(p, 1);
    if (ch.begin >= ch.end) continue;  // no rows here: the consumers skip the phase
    const int b = ph & 1, units = p.k / 256;
    bf16* x = reinterpret_cast<bf16*>(smem + kXOffset) + b * kMaxK;
    long long t0 = clock64();
    while (volatile_load(consumed) < ph - 1) {
    }
    st[kBufferWait] += clock64() - t0;
    if (p.x_mode == Swiglu) {
      t0 = clock64();
      wait_published(a, p.router, kExperts);
      st[kXRouterWait] += clock64() - t0;
      pick_experts(a.phases[p.router].y, ids, wts);
    }
    // The source rows unit u needs, up to: its 256 values, or (Swiglu) its experts' up rows.
    auto rows_needed = [&](int u) {
      if (p.x_mode != Swiglu) return 256 * (u + 1);
      const int j = u / (kInter / 256), f = (u % (kInter / 256)) * 256;
      return j * 2 * kInter + kInter + f + 256;
    };
    float ss = 0;
    for (int loaded = 0; loaded < units;) {
      int ready = units;
      if (p.x_phase >= 0 && a.ordered) {
        // From the rows the units in already needed (published: they were polled before).
        const int from = loaded ? rows_needed(loaded - 1) : 0;
        t0 = clock64();
        const int upto = published_upto(a.phases[p.x_phase], from, rows_needed(units - 1));
        st[kPolls] += 1, st[kPollCycles] += clock64() - t0;
        ready = loaded;
        while (ready < units && rows_needed(ready) <= upto) ++ready;
      }
      ready = min(ready, loaded + kXBatch);
      if (ready == loaded) continue;
      t0 = clock64();
      float v[kXBatch][8];
#pragma unroll
      for (int q = 0; q < kXBatch; ++q)
        if (loaded + q < ready)
          x_values(p, 256 * (loaded + q) + 8 * lane, wts, v[q]);
#pragma unroll
      for (int q = 0; q < kXBatch; ++q)
        if (loaded + q < ready) store8(x, 256 * (loaded + q) + 8 * lane, v[q]);
      __syncwarp();
      st[kLoads] += 1, st[kLoadCycles] += clock64() - t0;
      for (; loaded < ready; ++loaded) ss += squares8(x + 256 * loaded + 8 * lane);
    }
    const float s = norm_scale(ss, p.k);
    if (lane == 0) {
      scale[b] = p.x_mode == Norm ? s : 1.0f;
      __threadfence_block();
      *reinterpret_cast<volatile int*>(xready + b) = ph + 1;
    }
    __syncwarp();
  }
  if (lane == 0 && a.stats)
    for (int i = 0; i < kStats; ++i) a.stats[blockIdx.x * kStats + i] += st[i];
}

// The consumer warps: each chunk's rows against x, a warp a contiguous run of 256-element units;
// a chunk's rows summed (warps in order) and written as soon as it is done.
__device__ void consume(const Args& a, char* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float* red_scale = reinterpret_cast<float*>(smem + kScaleOffset);
  const int* xready = reinterpret_cast<const int*>(smem + kXReadyOffset);
  int* consumed = reinterpret_cast<int*>(smem + kConsumedOffset);
  const float* wts = reinterpret_cast<const float*>(smem + kSelOffset + kTopK * 4);
  const uint32_t full = smem_addr(smem + kBarOffset), empty = full + kStages * 8;
  int item = 0;
  for (int ph = a.begin; ph < a.end; ++ph) {
    const Phase p = a.phases[ph];
    const int per = chunk_rows(p), units_a_row = p.k / 256, b = a.dataflow ? ph & 1 : 0;
    const bf16* x = reinterpret_cast<const bf16*>(smem + kXOffset) + b * kMaxK;
    const Chunks ch = my_chunks(p, a.dataflow);
    if (a.dataflow) {
      if (ch.begin < ch.end && a.compute >= 0) {
        const long long t0 = clock64();
        while (volatile_load(xready + b) != ph + 1) {
        }
        __threadfence_block();
        if (threadIdx.x == 0 && a.stats) a.stats[blockIdx.x * kStats + kConsumerWait] += clock64() - t0;
      }
    } else {
      if (threadIdx.x == 0) wait_done(a.done, p.dep, a.ordered);
      consumers_sync();
      if (ch.begin < ch.end) {
        mbar_wait(full + 8 * (item % kStages), (item / kStages) & 1);  // the producer has picked the experts
        if (a.compute >= 0) load_x(p, reinterpret_cast<bf16*>(smem + kXOffset), red_scale, wts);
        consumers_sync();
      }
    }
    for (int j = ch.begin; j < ch.end; j += ch.step, ++item) {
      const int c = j * per, rows = min(per, p.n - c), slot = item % kStages, units = rows * units_a_row;
      float* rowsum = reinterpret_cast<float*>(smem + kRowsOffset) + (item & 1) * kConsumerWarps * kMaxStageRows;
      mbar_wait(full + 8 * slot, (item / kStages) & 1);
      const bf16* stage = reinterpret_cast<const bf16*>(smem + slot * kStageBytes);
      const int u0 = units * warp / kConsumerWarps, u1 = units * (warp + 1) / kConsumerWarps;
      // A row's units two at a time into separate sums (independent chains), then the warp's sum.
      for (int u = u0; u < (a.compute > 0 ? u1 : u0);) {
        const int row = u / units_a_row, end = min(u1, (row + 1) * units_a_row);
        const bf16* wrow = stage + int64_t(row) * p.k + lane * 8 - row * units_a_row * 256;
        float acc[4] = {0, 0, 0, 0};
        for (; u < end; u += 2) {
          const bool two = u + 1 < end;
          float w0[8], x0[8], w1[8], x1[8];
          unpack8(*reinterpret_cast<const uint4*>(wrow + u * 256), w0);
          unpack8(*reinterpret_cast<const uint4*>(x + (u % units_a_row) * 256 + lane * 8), x0);
          if (two) {
            unpack8(*reinterpret_cast<const uint4*>(wrow + (u + 1) * 256), w1);
            unpack8(*reinterpret_cast<const uint4*>(x + ((u + 1) % units_a_row) * 256 + lane * 8), x1);
          }
          for (int e = 0; e < 8; e += 2) {
            acc[0] += w0[e] * x0[e], acc[1] += w0[e + 1] * x0[e + 1];
            if (two) acc[2] += w1[e] * x1[e], acc[3] += w1[e + 1] * x1[e + 1];
          }
        }
        u = end;  // past an odd unit count, u + 2 would skip the next row's first unit
        float sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(~0u, sum, o);
        if (lane == 0) rowsum[warp * kMaxStageRows + row] = sum;
      }
      __syncwarp();
      if (lane == 0) mbar_arrive(empty + 8 * slot);
      consumers_sync();  // the stage's sums (its row sums are two stages apart: one barrier a stage)
      const int t = threadIdx.x;
      if (t < rows) {
        float total = 0;
        for (int w = 0; w < kConsumerWarps; ++w) {  // the warps whose run has units of row t
          const int w0 = units * w / kConsumerWarps, w1 = units * (w + 1) / kConsumerWarps;
          if (w0 < (t + 1) * units_a_row && w1 > t * units_a_row) total += rowsum[w * kMaxStageRows + t];
        }
        p.y[c + t] = total * red_scale[b];
        if (a.dataflow) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p.rows_done + j) : "memory");
      }
    }
    consumers_sync();  // x's buffer free; the barrier ways: every row written
    if (threadIdx.x == 0) {
      if (a.dataflow) {
        *reinterpret_cast<volatile int*>(consumed) = ph + 1;
      } else {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(a.done + ph) : "memory");
      }
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1) phase_chain_kernel(Args a) {
  extern __shared__ __align__(128) char smem[];
  if (threadIdx.x == 0) {
    const uint32_t full = smem_addr(smem + kBarOffset), empty = full + kStages * 8;
    for (int s = 0; s < kStages; ++s)
      mbar_init(full + 8 * s, kLaneCopies ? 32 : 1), mbar_init(empty + 8 * s, kConsumerWarps);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    int* flags = reinterpret_cast<int*>(smem + kXReadyOffset);
    flags[0] = flags[1] = 0, flags[2] = a.begin;  // x ready for no phase; the phases before begin done
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5;
  if (warp == kProducerWarp) produce(a, smem);
  else if (warp == kXWarp) { if (a.dataflow) stream_x(a, smem); }
  else consume(a, smem);
}

__global__ void fill_random(bf16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t v = uint32_t(i) * 2654435761u ^ seed;
    v ^= v >> 13, v *= 0x5bd1e995u, v ^= v >> 15;
    p[i] = __float2bfloat16_rn((float(v & 0xffff) / 32768.0f - 1.0f) * scale);
  }
}

bf16* random_bf16(int64_t n, uint32_t seed, float scale) {
  bf16* p = nullptr;
  CHECK(cudaMalloc(&p, size_t(n) * 2));
  fill_random<<<1024, 256>>>(p, n, seed, scale);
  return p;
}

// Median (ms) of `runs` timings of body on stream st, each after setup (untimed: resets, inputs),
// the first `warm` of them discarded.
template <class Setup, class Body>
float median_ms(cudaStream_t st, Setup setup, Body body, int runs, int warm) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> t;
  for (int r = 0; r < runs; ++r) {
    setup();
    CHECK(cudaEventRecord(e0, st));
    body();
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= warm) t.push_back(ms);
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int run(int layers) {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(phase_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  // Outputs: every phase's y back to back, then the first hidden.
  const int y_len[kPhasesPerLayer] = {5120, 16384, kHidden, kExperts, kTopK * 2 * kInter, kHidden};
  int per_layer = 0;
  for (int n : y_len) per_layer += n;
  float* ys = nullptr;
  const size_t y_bytes = size_t(per_layer) * layers * 4;
  CHECK(cudaMalloc(&ys, y_bytes + kHidden * 4));
  float* hidden0 = ys + size_t(per_layer) * layers;
  {
    std::vector<float> h(kHidden);
    for (int i = 0; i < kHidden; ++i) h[i] = std::sin(0.37f * i);
    CHECK(cudaMemcpy(hidden0, h.data(), kHidden * 4, cudaMemcpyHostToDevice));
  }
  std::vector<Phase> phases;
  double bytes = 0;
  for (int l = 0; l < layers; ++l) {
    const int base = l * kPhasesPerLayer;
    float* y = ys + size_t(per_layer) * l;
    float* out[kPhasesPerLayer];
    for (int i = 0; i < kPhasesPerLayer; ++i) out[i] = y, y += y_len[i];
    const float* hidden = l ? phases[base - 1].y : hidden0;
    const uint32_t s = 17u * l;
    const int prev = l ? base - 1 : -1;
    phases.push_back({Dense, Norm, 5120, kHidden, random_bf16(5120LL * kHidden, s + 1, 0.05f), hidden, out[0], prev,
                      -1, prev});
    phases.push_back(
        {Dense, Plain, 16384, 256, random_bf16(16384LL * 256, s + 2, 0.05f), out[0], out[1], base, -1, base});
    phases.push_back({Dense, Plain, kHidden, 4096, random_bf16(4096LL * kHidden, s + 3, 0.05f), out[1], out[2],
                      base + 1, -1, base + 1});
    phases.push_back({Dense, Norm, kExperts, kHidden, random_bf16(int64_t(kExperts) * kHidden, s + 4, 0.05f), out[2],
                      out[3], base + 2, -1, base + 2});
    phases.push_back({GateUp, Norm, kTopK * 2 * kInter, kHidden,
                      random_bf16(int64_t(kExperts) * 2 * kInter * kHidden, s + 5, 0.05f), out[2], out[4], base + 3,
                      base + 3, base + 2});
    phases.push_back({Down, Swiglu, kHidden, kTopK * kInter,
                      random_bf16(int64_t(kExperts) * kHidden * kInter, s + 6, 0.05f), out[4], out[5], base + 4,
                      base + 3, base + 4});
  }
  // The dataflow way's counters, a chunk of rows each (chunk_rows's rule), and its rotations.
  std::vector<size_t> first_chunk;
  size_t n_chunks = 0;
  int rot = 0;
  for (Phase& p : phases) {
    bytes += double(p.n) * p.k * 2;
    const int rows = std::min(std::max(1, kStageBytes / (2 * p.k)), (p.n + sms - 1) / sms), chunks = (p.n + rows - 1) / rows;
    first_chunk.push_back(n_chunks);
    n_chunks += chunks;
    p.rot = rot, rot = (rot + chunks) % sms;
  }
  unsigned long long* stats = nullptr;
  CHECK(cudaMalloc(&stats, sizeof(unsigned long long) * sms * kStats));
  unsigned* rows_done = nullptr;
  CHECK(cudaMalloc(&rows_done, sizeof(unsigned) * n_chunks));
  for (size_t i = 0; i < phases.size(); ++i) phases[i].rows_done = rows_done + first_chunk[i];
  Phase* phases_dev = nullptr;
  unsigned* done = nullptr;
  const int n_phases = int(phases.size());
  CHECK(cudaMalloc(&phases_dev, sizeof(Phase) * n_phases));
  CHECK(cudaMemcpy(phases_dev, phases.data(), sizeof(Phase) * n_phases, cudaMemcpyHostToDevice));
  CHECK(cudaMalloc(&done, sizeof(unsigned) * n_phases));
  CHECK(cudaDeviceSynchronize());

  cudaStream_t st;
  CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  auto reset = [&] {
    CHECK(cudaMemsetAsync(ys, 0, y_bytes, st));
    CHECK(cudaMemsetAsync(done, 0, sizeof(unsigned) * n_phases, st));
    CHECK(cudaMemsetAsync(rows_done, 0, sizeof(unsigned) * n_chunks, st));
    CHECK(cudaMemsetAsync(stats, 0, sizeof(unsigned long long) * sms * kStats, st));
  };
  int compute = 1, ordered = 1;
  auto launch = [&](int begin, int end, int ahead, bool cooperative, int dataflow = 0) {
    Args a{phases_dev, begin, end, done, ahead, compute, ordered, stats, dataflow};
    if (cooperative) {
      void* params[] = {&a};
      CHECK(cudaLaunchCooperativeKernel((void*)phase_chain_kernel, dim3(sms), dim3(kThreads), params, kSmemBytes, st));
    } else {
      phase_chain_kernel<<<sms, kThreads, kSmemBytes, st>>>(a);
    }
  };
  // One launch a phase, captured (the reset stays outside the graph so the timing excludes it).
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  for (int ph = 0; ph < n_phases; ++ph) launch(ph, ph + 1, 0, false);
  CHECK(cudaStreamEndCapture(st, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));

  constexpr int kWays = 4;
  std::vector<float> all_y[kWays];  // every phase's output, a way's last run
  auto result = [&](int way) {
    CHECK(cudaStreamSynchronize(st));
    all_y[way].resize(y_bytes / 4);
    CHECK(cudaMemcpy(all_y[way].data(), ys, y_bytes, cudaMemcpyDeviceToHost));
  };
  auto timed = [&](auto body) { return median_ms(st, reset, body, 12, 2); };
  const float ms_launches = timed([&] { CHECK(cudaGraphLaunch(exec, st)); });
  result(0);
  const float ms_persistent = timed([&] { launch(0, n_phases, 0, true); });
  result(1);
  const float ms_streamed = timed([&] { launch(0, n_phases, 1, true); });
  result(2);
  const float ms_dataflow = timed([&] { launch(0, n_phases, 1, true, 1); });
  result(3);
  // Where the dataflow way's warps waited (its last timed run): µs a layer, a block's mean, at the
  // SM clock's attribute (the clock may run lower under load); the polls and loads as counts.
  double wait_us[kStats] = {};
  {
    std::vector<unsigned long long> h(size_t(sms) * kStats);
    CHECK(cudaMemcpy(h.data(), stats, h.size() * 8, cudaMemcpyDeviceToHost));
    int khz = 0;
    CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
    for (int b = 0; b < sms; ++b)
      for (int i = 0; i < kStats; ++i) wait_us[i] += double(h[size_t(b) * kStats + i]) / sms / layers;
    for (int i = 0; i < kStats; ++i)
      if (i != kPolls && i != kLoads) wait_us[i] /= khz * 1e-3;
  }
  // Again in the other order, so that clocks warming up favour neither way.
  const float ms_dataflow2 = timed([&] { launch(0, n_phases, 1, true, 1); });
  const float ms_streamed2 = timed([&] { launch(0, n_phases, 1, true); });
  const float ms_persistent2 = timed([&] { launch(0, n_phases, 0, true); });
  const float ms_launches2 = timed([&] { CHECK(cudaGraphLaunch(exec, st)); });
  // Where a launch's time goes: the stream alone (no products), and each phase of layer 1 by itself.
  compute = 0;
  const float ms_stream_only = timed([&] { launch(0, n_phases, 1, true); });
  const float ms_dataflow_stream_only = timed([&] { launch(0, n_phases, 1, true, 1); });
  ordered = 0;
  const float ms_dataflow_unordered_stream = timed([&] { launch(0, n_phases, 1, true, 1); });
  const float ms_unordered_stream = timed([&] { launch(0, n_phases, 1, true); });
  compute = -1;
  const float ms_unordered_bare = timed([&] { launch(0, n_phases, 1, true); });
  const float ms_dataflow_unordered_bare = timed([&] { launch(0, n_phases, 1, true, 1); });
  ordered = 1;
  const float ms_ordered_bare = timed([&] { launch(0, n_phases, 1, true); });
  ordered = 0;
  compute = 1;
  const float ms_unordered = timed([&] { launch(0, n_phases, 1, true); });
  ordered = 1;
  float phase_us[kPhasesPerLayer];
  for (int i = 0; i < kPhasesPerLayer; ++i) {
    const int ph = (layers > 1 ? kPhasesPerLayer : 0) + i;
    auto before = [&] {  // the phases before, untimed: real inputs and counters
      reset();
      if (ph > 0) launch(0, ph, 0, true);
    };
    phase_us[i] = median_ms(st, before, [&] { launch(ph, ph + 1, 0, false); }, 7, 0) * 1e3f;
  }

  // Against the launches: the last hidden's largest relative difference, and the first phase
  // whose output differs at all (-1: none), a way each.
  const size_t last_at = size_t(phases.back().y - ys);
  double max_rel = 0, scale = 0, rel[kWays] = {};
  int first_diff[kWays];
  for (int i = 0; i < kHidden; ++i) scale = std::max(scale, double(std::fabs(all_y[0][last_at + i])));
  bool finite = true;
  for (int w = 0; w < kWays; ++w) {
    for (int i = 0; i < kHidden; ++i) {
      const float v = all_y[w][last_at + i];
      finite = finite && std::isfinite(v);
      rel[w] = std::max(rel[w], std::fabs(double(v) - all_y[0][last_at + i]) / std::max(scale, 1e-30));
    }
    max_rel = std::max(max_rel, rel[w]);
    first_diff[w] = -1;
    for (int ph = 0; ph < n_phases && first_diff[w] < 0; ++ph) {
      int rows = 0, first_row = -1;
      for (int i = 0, at = int(phases[ph].y - ys); i < phases[ph].n; ++i)
        if (all_y[w][at + i] != all_y[0][at + i]) {
          ++rows;
          if (first_row < 0) first_row = i;
        }
      if (rows) {
        first_diff[w] = ph;
        const int at = int(phases[ph].y - ys);
        std::fprintf(stderr, "way %d: phase %d differs in %d rows, the first %d (%g against %g)\n", w, ph, rows,
                     first_row, all_y[w][at + first_row], all_y[0][at + first_row]);
      }
    }
  }

  // The copy bandwidth as ms_cuda_ceilings counts it: bytes read + written per second.
  const size_t copy_bytes = size_t(1) << 31;
  void *src = nullptr, *dst = nullptr;
  CHECK(cudaMalloc(&src, copy_bytes));
  CHECK(cudaMalloc(&dst, copy_bytes));
  const float copy_ms = timed([&] { CHECK(cudaMemcpyAsync(dst, src, copy_bytes, cudaMemcpyDeviceToDevice, st)); });
  const double copy_gbs = 2.0 * copy_bytes / (copy_ms * 1e-3) / 1e9;
  const double floor_us = bytes / layers / (copy_gbs * 1e9) * 1e6;
  auto per_layer_us = [&](float a, float b) { return std::min(a, b) * 1e3 / layers; };
  std::printf(
      "{\"layers\": %d, \"blocks\": %d, \"bytes_a_layer\": %.0f, \"copy_GBps\": %.1f, \"floor_us_a_layer\": %.2f, "
      "\"launches_us_a_layer\": [%.2f, %.2f], \"persistent_us_a_layer\": [%.2f, %.2f], "
      "\"streamed_us_a_layer\": [%.2f, %.2f], \"dataflow_us_a_layer\": [%.2f, %.2f], "
      "\"best\": {\"launches\": %.2f, \"persistent\": %.2f, \"streamed\": %.2f, \"dataflow\": %.2f}, "
      "\"dataflow_without_products_us_a_layer\": %.2f, \"dataflow_unordered_without_products_us_a_layer\": %.2f, "
      "\"dataflow_unordered_without_x_us_a_layer\": %.2f, "
      "\"dataflow_waits_a_layer\": {\"x_polls\": %.1f, \"x_poll_us\": %.2f, \"x_loads\": %.1f, \"x_load_us\": %.2f, "
      "\"x_buffer_wait_us\": %.2f, \"x_router_wait_us\": %.2f, \"consumer_x_wait_us\": %.2f, "
      "\"producer_router_wait_us\": %.2f}, "
      "\"last_hidden_max_rel_diff\": %.3g, \"by_way\": [%.3g, %.3g, %.3g], \"first_phase_differing\": [%d, %d, %d], "
      "\"finite\": %s, \"last_hidden_scale\": %.3g, "
      "\"streamed_without_products_us_a_layer\": %.2f, \"unordered_us_a_layer\": %.2f, "
      "\"unordered_without_products_us_a_layer\": %.2f, \"unordered_without_x_us_a_layer\": %.2f, "
      "\"streamed_without_x_us_a_layer\": %.2f, \"one_phase_alone_us\": [%.2f, %.2f, %.2f, %.2f, %.2f, %.2f]}\n",
      layers, sms, bytes / layers, copy_gbs, floor_us, ms_launches * 1e3 / layers, ms_launches2 * 1e3 / layers,
      ms_persistent * 1e3 / layers, ms_persistent2 * 1e3 / layers, ms_streamed * 1e3 / layers,
      ms_streamed2 * 1e3 / layers, ms_dataflow * 1e3 / layers, ms_dataflow2 * 1e3 / layers,
      per_layer_us(ms_launches, ms_launches2), per_layer_us(ms_persistent, ms_persistent2),
      per_layer_us(ms_streamed, ms_streamed2), per_layer_us(ms_dataflow, ms_dataflow2),
      ms_dataflow_stream_only * 1e3 / layers, ms_dataflow_unordered_stream * 1e3 / layers,
      ms_dataflow_unordered_bare * 1e3 / layers, wait_us[kPolls], wait_us[kPollCycles], wait_us[kLoads],
      wait_us[kLoadCycles], wait_us[kBufferWait], wait_us[kXRouterWait], wait_us[kConsumerWait],
      wait_us[kRouterWait], max_rel, rel[1], rel[2], rel[3],
      first_diff[1], first_diff[2], first_diff[3],
      finite ? "true" : "false", scale, ms_stream_only * 1e3 / layers, ms_unordered * 1e3 / layers,
      ms_unordered_stream * 1e3 / layers, ms_unordered_bare * 1e3 / layers, ms_ordered_bare * 1e3 / layers,
      phase_us[0], phase_us[1], phase_us[2],
      phase_us[3], phase_us[4], phase_us[5]);
  return finite && max_rel == 0 ? 0 : 1;  // the same sums in the same order, whichever way
}

// The ring alone: one phase of 1 GiB (rows of 2048 values), no waits, with and without the
// products: the rate at which the ring brings weights in, whatever the phases around it.
int ring_only() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK(cudaFuncSetAttribute(phase_chain_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  const int n = 1 << 18;
  float *x = nullptr, *y = nullptr;
  unsigned* done = nullptr;
  CHECK(cudaMalloc(&x, kHidden * 4));
  CHECK(cudaMalloc(&y, size_t(n) * 4));
  CHECK(cudaMalloc(&done, 4));
  CHECK(cudaMemset(x, 0, kHidden * 4));
  const Phase ph{Dense, Plain, n, kHidden, random_bf16(int64_t(n) * kHidden, 7, 0.05f), x, y, -1, -1, -1, nullptr};
  Phase* dev = nullptr;
  CHECK(cudaMalloc(&dev, sizeof(Phase)));
  CHECK(cudaMemcpy(dev, &ph, sizeof(Phase), cudaMemcpyHostToDevice));
  CHECK(cudaDeviceSynchronize());
  const double bytes = double(n) * kHidden * 2;
  std::printf("{\"ring_GBps\": {");
  for (int compute = 0; compute < 2; ++compute) {
    const Args a{dev, 0, 1, done, 1, compute, 0, nullptr, 0};
    const float ms = median_ms(0, [] {}, [&] { phase_chain_kernel<<<sms, kThreads, kSmemBytes>>>(a); }, 7, 0);
    std::printf("%s\"%s\": %.1f", compute ? ", " : "", compute ? "with_products" : "stream", bytes / (ms * 1e-3) / 1e9);
  }
  std::printf("}, \"stage_bytes\": %d, \"stages\": %d, \"lane_copies\": %d}\n", kStageBytes, kStages, int(kLaneCopies));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "ring") return ring_only();
  const int layers = argc > 1 ? std::atoi(argv[1]) : 12;
  return run(layers);
}
