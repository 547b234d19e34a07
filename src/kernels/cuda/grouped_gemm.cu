// The grouped GEMM of grouped_gemm.h: an Ampere-style tensor-core GEMM (128x128 block tiles,
// 8 warps of 64x32, K tiles of 32 through a 4-stage cp.async pipeline, ldmatrix from padded
// shared rows) whose grid covers every expert's row tiles at once.
//
// Scheduling: a one-warp kernel turns the device offsets into each expert's first row tile
// (prefix sums of ceil(rows / 128)); block (x, y) of the GEMM takes N tile x of global row
// tile y, finding its expert by binary search over those sums. The grid's y extent is a bound
// (max_rows / 128 + experts): blocks past the last tile exit at once. Blocks of one row tile are
// adjacent in launch order, and an expert's row tiles adjacent too, so the blocks running at once
// share a few experts' weights through L2 and each weight byte comes from HBM about once.
//
// Ragged edges: rows past the expert's end, weight rows past N and K past the end are zero-filled
// by the copies (cp.async with source size 0), never read; a warp skips the 16-row MMA slices
// whose rows all lie past the expert's end (an expert's last tile is partial about half the time
// at a few hundred rows an expert); stores stop at the expert's end and at N.
//
// SwiGLU: a block's 128 weight rows are 64 gate rows and the same 64 up rows, interleaved in
// slices of 16 so that each warp holds the gate and up sums of the same 16 columns; the epilogue
// writes silu(gate) * up from the f32 sums (the [gate | up] intermediate never exists, and is
// not rounded to BF16 on the way, which only brings the result closer to the f32 reference).
#include "kernels/cuda/grouped_gemm.h"

#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/flash_prefill.h"  // cp_async16 / cp_async_commit / cp_async_wait
#include "kernels/cuda/mma.h"

namespace ms::cuda {
namespace {

// kBK 64 with kStages 3 (108 KiB, still two blocks an SM) is the other shape worth timing: half
// the barriers per MMA (the code takes either unchanged; check ptxas -v for spills at 4 copies).
constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 4;
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kWarpM = 64, kWarpN = 32;  // 2 x 4 warps
constexpr int kLds = kBK + 8;  // +8 elements: a row is 80 bytes, so ldmatrix's 8 rows hit distinct banks
constexpr int kStageElems = (kBM + kBN) * kLds;
constexpr size_t kSmemBytes = size_t(kStages) * kStageElems * sizeof(bf16);  // 80 KiB: two blocks an SM
constexpr int kChunks = kBK / 8;  // 16-byte copies a tile row
static_assert(kBM * kChunks % kThreads == 0 && kBN * kChunks % kThreads == 0, "tile copies must split evenly");
constexpr int kCopies = kBM * kChunks / kThreads;  // per thread per operand per stage (2)
static_assert(kBM == kBN, "one copy loop serves both operands");

struct Params {
  int N, K;
  const bf16* a;
  int64_t a_ld;
  const int32_t* a_rows;
  const bf16* const* w;
  const bf16* const* w2;
  int64_t w_ld;
  const int32_t* offsets;
  const int32_t* tile_start;
  int experts;
  bf16* c;
  int64_t c_ld;
  bool pair_stores;  // c_ld even and c 4-byte aligned: two columns a store
};

// tile_start[e] = sum over e' < e of ceil(rows of e' / kBM); tile_start[E] = all tiles. One warp.
__global__ void tile_table_kernel(const int32_t* __restrict__ offsets, int E, int32_t* __restrict__ tile_start) {
  const int lane = threadIdx.x;
  int base = 0;
  for (int c = 0; c < E; c += 32) {
    const int e = c + lane;
    const int cnt = e < E ? (offsets[e + 1] - offsets[e] + kBM - 1) / kBM : 0;
    int incl = cnt;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (e < E) tile_start[e] = base + incl - cnt;
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) tile_start[E] = base;
}

__device__ __forceinline__ void store_pair(bf16* p, float lo, float hi, bool pair, bool has_hi) {
  if (pair && has_hi) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(lo, hi);
  } else {
    p[0] = __float2bfloat16_rn(lo);
    if (has_hi) p[1] = __float2bfloat16_rn(hi);
  }
}

template <bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 2) grouped_gemm_kernel(const Params p) {
  pdl_wait();  // offsets, tile table and A come from the kernels before
  const int y = blockIdx.y;
  const int E = p.experts;
  if (y >= __ldg(p.tile_start + E)) return;
  // The expert of row tile y: the last e with tile_start[e] <= y (an empty expert's equal
  // successor is also <= y, so the search lands on the expert that owns the tile).
  int lo = 0, hi = E;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (__ldg(p.tile_start + mid) <= y) lo = mid;
    else hi = mid;
  }
  const int e = lo;
  const int m0 = __ldg(p.offsets + e) + (y - __ldg(p.tile_start + e)) * kBM;
  const int m_end = __ldg(p.offsets + e + 1);

  extern __shared__ __align__(16) bf16 smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / (kBN / kWarpN), wn = warp % (kBN / kWarpN);

  // This thread's copies: tile row tid / kChunks + i * (kThreads / kChunks), chunk tid % kChunks.
  const int kc = (tid % kChunks) * 8;
  const bf16* a_src[kCopies];
  const bf16* b_src[kCopies];
  bool a_ok[kCopies], b_ok[kCopies];
  const bf16* w_e = p.w[e];
  const bf16* w2_e = SWIGLU ? p.w2[e] : nullptr;
#pragma unroll
  for (int i = 0; i < kCopies; ++i) {
    const int row = tid / kChunks + i * (kThreads / kChunks);
    const int gr = m0 + row;
    a_ok[i] = gr < m_end;
    const int64_t src_row = a_ok[i] ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : 0;
    a_src[i] = p.a + src_row * p.a_ld + kc;
    int n;
    const bf16* base = w_e;
    if constexpr (SWIGLU) {
      // Tile rows [32 j, 32 j + 16): gate rows 16 j.., [32 j + 16, 32 j + 32): the same up rows.
      n = blockIdx.x * (kBN / 2) + (row / 32) * 16 + row % 16;
      if ((row / 16) % 2) base = w2_e;
    } else {
      n = blockIdx.x * kBN + row;
    }
    b_ok[i] = n < p.N;
    b_src[i] = base + (b_ok[i] ? int64_t(n) * p.w_ld : 0) + kc;
  }
  auto load_stage = [&](int stage, int kt) {
    bf16* as = smem + stage * kStageElems;
    bf16* bs = as + kBM * kLds;
    const int k = kt * kBK;
    const bool k_ok = k + kc < p.K;
#pragma unroll
    for (int i = 0; i < kCopies; ++i) {
      const int row = tid / kChunks + i * (kThreads / kChunks);
      const bool av = a_ok[i] && k_ok, bv = b_ok[i] && k_ok;
      // An invalid copy reads nothing; its address stays the row's start, inside the operand.
      cp_async16(as + row * kLds + kc, a_src[i] + (av ? k : 0), av);
      cp_async16(bs + row * kLds + kc, b_src[i] + (bv ? k : 0), bv);
    }
  };

  float acc[kWarpM / 16][kWarpN / 8][4];
#pragma unroll
  for (int i = 0; i < kWarpM / 16; ++i)
#pragma unroll
    for (int j = 0; j < kWarpN / 8; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;
  // 16-row slices of this warp that hold rows of the expert (warp-uniform).
  const int warp_rows = m_end - (m0 + wm * kWarpM);

  const int KT = (p.K + kBK - 1) / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's, and every warp is done with tile kt - 1's stage
    const int next = kt + kStages - 1;
    if (next < KT) load_stage(next % kStages, next);
    cp_async_commit();
    const bf16* as = smem + (kt % kStages) * kStageElems;
    const bf16* bs = as + kBM * kLds;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t bf[kWarpN / 16][4];
#pragma unroll
      for (int np = 0; np < kWarpN / 16; ++np)
        ldmatrix_x4<false>(bs + (wn * kWarpN + np * 16 + (lane / 16) * 8 + lane % 8) * kLds + kk * 16 +
                               ((lane / 8) % 2) * 8,
                           bf[np]);
#pragma unroll
      for (int mf = 0; mf < kWarpM / 16; ++mf) {
        if (mf * 16 >= warp_rows) continue;
        uint32_t af[4];
        ldmatrix_x4<false>(as + (wm * kWarpM + mf * 16 + lane % 16) * kLds + kk * 16 + (lane / 16) * 8, af);
#pragma unroll
        for (int nf = 0; nf < kWarpN / 8; ++nf) mma_bf16(acc[mf][nf], af, bf[nf / 2][(nf % 2) * 2], bf[nf / 2][(nf % 2) * 2 + 1]);
      }
    }
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind

  // Thread (g, t) of the quad layout holds rows g and g + 8, columns 2t and 2t + 1 of each 16x8 slice.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mf = 0; mf < kWarpM / 16; ++mf)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + wm * kWarpM + mf * 16 + g + h * 8;
      if (r >= m_end) continue;
      bf16* crow = p.c + int64_t(r) * p.c_ld;
      if constexpr (SWIGLU) {
#pragma unroll
        for (int nf = 0; nf < kWarpN / 16; ++nf) {
          const int col = blockIdx.x * (kBN / 2) + wn * 16 + nf * 8 + 2 * t;
          if (col >= p.N) continue;
          float v[2];
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const float gate = acc[mf][nf][2 * h + q], up = acc[mf][nf + 2][2 * h + q];
            v[q] = gate / (1.0f + expf(-gate)) * up;
          }
          store_pair(crow + col, v[0], v[1], p.pair_stores, col + 1 < p.N);
        }
      } else {
#pragma unroll
        for (int nf = 0; nf < kWarpN / 8; ++nf) {
          const int col = blockIdx.x * kBN + wn * kWarpN + nf * 8 + 2 * t;
          if (col >= p.N) continue;
          store_pair(crow + col, acc[mf][nf][2 * h], acc[mf][nf][2 * h + 1], p.pair_stores, col + 1 < p.N);
        }
      }
    }
}

}  // namespace

bool grouped_gemm_supported(int64_t K, int64_t w_ld, const void* a, int64_t a_ld) {
  return K % 8 == 0 && w_ld % 8 == 0 && w_ld >= K && a_ld % 8 == 0 && a_ld >= K &&
         (a == nullptr || reinterpret_cast<uintptr_t>(a) % 16 == 0) && K < (int64_t(1) << 30);
}

bool grouped_gemm_fits(int64_t max_rows, int experts) {
  return max_rows >= 0 && experts > 0 && (max_rows + kBM - 1) / kBM + experts <= 65535;
}

bool grouped_gemm_enabled() {
  const char* v = std::getenv("MOESERVE_GROUPED_GEMM");
  return !(v && std::strcmp(v, "0") == 0);
}

void grouped_gemm(const GroupedGemmArgs& args, bool swiglu) {
  MS_CHECK(grouped_gemm_supported(args.K, args.w_ld, args.a, args.a_ld) && args.experts > 0 && args.N > 0 &&
               args.N < (int64_t(1) << 30) && grouped_gemm_fits(args.max_rows, args.experts) && args.w &&
               (!swiglu || args.w2) && args.offsets && args.c && args.c_ld >= args.N,
           "grouped_gemm: N ", args.N, " K ", args.K, " w_ld ", args.w_ld, " a_ld ", args.a_ld, " c_ld ", args.c_ld,
           " experts ", args.experts);
  if (args.max_rows == 0) return;
  const int E = args.experts;
  Tensor tiles = scratch(DType::I32, {E + 1});
  tile_table_kernel<<<1, 32, 0, stream()>>>(args.offsets, E, tiles.data<int32_t>());
  MS_CUDA_LAUNCHED("tile_table_kernel");

  const int64_t bn = swiglu ? kBN / 2 : kBN;
  const int64_t grid_y = (args.max_rows + kBM - 1) / kBM + E;  // sum of ceil(rows_e / kBM) <= this
  const dim3 grid(unsigned((args.N + bn - 1) / bn), unsigned(grid_y));
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
  });
  Params p;
  p.N = int(args.N), p.K = int(args.K);
  p.a = static_cast<const bf16*>(args.a), p.a_ld = args.a_ld, p.a_rows = args.a_rows;
  p.w = reinterpret_cast<const bf16* const*>(args.w), p.w2 = reinterpret_cast<const bf16* const*>(args.w2);
  p.w_ld = args.w_ld, p.offsets = args.offsets, p.tile_start = tiles.data<int32_t>(), p.experts = E;
  p.c = static_cast<bf16*>(args.c), p.c_ld = args.c_ld;
  p.pair_stores = args.c_ld % 2 == 0 && reinterpret_cast<uintptr_t>(args.c) % 4 == 0;
  if (swiglu) launch_pdl(grouped_gemm_kernel<true>, grid, dim3(kThreads), kSmemBytes, p);
  else launch_pdl(grouped_gemm_kernel<false>, grid, dim3(kThreads), kSmemBytes, p);
}

}  // namespace ms::cuda
