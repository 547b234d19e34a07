// The grouped GEMM of grouped_gemm.h: an Ampere-style tensor-core GEMM (block tiles of 128 rows,
// 8 warps of 64 rows each, K tiles through a multi-stage cp.async pipeline, ldmatrix from padded
// shared rows) whose grid covers every expert's row tiles at once. The tile shape is a template
// parameter; kTiles lists the shapes built, picked at run time by name (grouped_gemm.h), the
// Hopper wgmma shapes of grouped_gemm_wgmma.cu among them.
//
// Shared-memory traffic per m16n8k16 MMA is what the shapes trade. A Hopper SM reads 128 bytes of
// shared memory a clock, and its tensor cores finish at most one such MMA a clock (the wgmma
// peak; mma.sync gets less). A warp of WM x WN outputs loads WM / 16 + WN / 16 ldmatrix.x4 (512
// bytes each) per 16 of K for (WM / 16) * (WN / 8) MMAs: 192 bytes an MMA at 64x32, 128 at
// 64x64; the cp.async fills write (BM + BN) * BK * 2 bytes per BM * BN * BK / 2048 MMAs: 64
// bytes an MMA at 128x128, 48 at 128x256. So 128x128 spends 2 clocks of shared memory an MMA
// (a ceiling near half the peak) and 128x256 (warps of 64x64) 1.4, at the cost of 128 f32 sums a
// thread and one block an SM (8 warps to hide latency instead of 16). BK 64 halves the barriers
// and pipeline waits per MMA at the same traffic. Padded rows (BK + 8 elements) already keep
// ldmatrix's 8 row addresses on distinct banks, so a swizzle would gain nothing there.
//
// Scheduling (grouped_tiles.cuh, shared with the FP8 sibling grouped_gemm_fp8.cu): a one-warp
// kernel turns the device offsets into each expert's first row tile (prefix sums of
// ceil(rows / 128)); block (x, y) of the GEMM takes N tile x of global row tile y, finding its
// expert by binary search over those sums. The grid's y extent is a bound
// (max_rows / 128 + experts): blocks past the last tile exit at once. Blocks of one row tile are
// adjacent in launch order, and an expert's row tiles adjacent too, so the blocks running at once
// share a few experts' weights through L2 and each weight byte comes from HBM about once.
//
// Ragged edges: rows past the expert's end, weight rows past N and K past the end are zero-filled
// by the copies (cp.async with source size 0), never read; a warp skips the 16-row MMA slices
// whose rows all lie past the expert's end (an expert's last tile is partial about half the time
// at a few hundred rows an expert), choosing once per K tile among straight-line bodies of 1..4
// slices, so that no branch sits between the fragment loads and the MMAs and the compiler can
// issue all of a step's ldmatrix ahead of its MMAs; stores stop at the expert's end and at N.
//
// SwiGLU: a block's BN weight rows are BN / 2 gate rows and the same BN / 2 up rows, interleaved
// in slices of WN / 2 so that each warp holds the gate and up sums of the same WN / 2 columns; the
// epilogue writes silu(gate) * up from the f32 sums (the [gate | up] intermediate never exists,
// and is not rounded to BF16 on the way, which only brings the result closer to the f32 reference).
#include "kernels/cuda/grouped_gemm.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/flash_prefill.h"  // cp_async16 / cp_async_commit / cp_async_wait
#include "kernels/cuda/grouped_gemm_impl.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/mma.h"

namespace ms::cuda {
namespace {

using grouped_gemm_impl::kBM;
using grouped_gemm_impl::Params;
using grouped_gemm_impl::store_pair;

// A block tile of kBM x BN outputs, K tiles of BK through STAGES buffers, 8 warps of 64 x WN.
template <int BN, int BK, int STAGES, int WN, int MIN_BLOCKS>
struct Tile {
  static constexpr int kBN = BN, kBK = BK, kStages = STAGES, kWarpM = 64, kWarpN = WN;
  static constexpr int kWarpsN = kBN / kWarpN, kWarps = (kBM / kWarpM) * kWarpsN, kThreads = kWarps * 32;
  static constexpr int kMinBlocks = MIN_BLOCKS;  // blocks an SM: sets the register cap
  static constexpr int kMF = kWarpM / 16, kNF = kWarpN / 8;  // a warp's 16x8 MMA tiles
  static constexpr int kLds = kBK + 8;  // +8 elements: ldmatrix's 8 rows (80 or 144 bytes apart) hit distinct banks
  static constexpr int kStageElems = (kBM + kBN) * kLds;
  static constexpr size_t kSmemBytes = size_t(kStages) * kStageElems * sizeof(bf16);
  static constexpr int kChunks = kBK / 8;  // 16-byte copies a tile row
  static constexpr int kRowsPass = kThreads / kChunks;  // tile rows one pass of copies covers
  static constexpr int kACopies = kBM / kRowsPass, kBCopies = kBN / kRowsPass;  // per thread per stage
  static_assert(kWarps == 8 && kBM % kRowsPass == 0 && kBN % kRowsPass == 0, "tile copies must split evenly");
  static_assert(kSmemBytes * kMinBlocks <= 227 * 1024, "shared memory of the blocks an SM");
};
using Tile128x128x32 = Tile<128, 32, 4, 32, 2>;  // 80 KiB: today's default
using Tile128x128x64 = Tile<128, 64, 3, 32, 2>;  // 108 KiB: still two blocks an SM
using Tile128x256x32 = Tile<256, 32, 4, 64, 1>;  // 120 KiB, one block an SM
using Tile128x256x64 = Tile<256, 64, 3, 64, 1>;  // 162 KiB, one block an SM

// One K tile of a warp's products over its first NM 16-row slices: as / bs point at the warp's
// first A row and B row in the stage, offset by the lane's ldmatrix address.
template <class T, int NM>
__device__ __forceinline__ void warp_tile_mma(const bf16* as, const bf16* bs, float (&acc)[T::kMF][T::kNF][4]) {
#pragma unroll
  for (int kk = 0; kk < T::kBK / 16; ++kk) {
    uint32_t bf[T::kWarpN / 16][4], af[NM][4];
#pragma unroll
    for (int np = 0; np < T::kWarpN / 16; ++np) ldmatrix_x4<false>(bs + np * 16 * T::kLds + kk * 16, bf[np]);
#pragma unroll
    for (int mf = 0; mf < NM; ++mf) ldmatrix_x4<false>(as + mf * 16 * T::kLds + kk * 16, af[mf]);
#pragma unroll
    for (int mf = 0; mf < NM; ++mf)
#pragma unroll
      for (int nf = 0; nf < T::kNF; ++nf) mma_bf16(acc[mf][nf], af[mf], bf[nf / 2][(nf % 2) * 2], bf[nf / 2][(nf % 2) * 2 + 1]);
  }
}

// warp_tile_mma over the warp's `slices` 16-row slices that hold rows (warp-uniform; 0: none).
template <class T, int NM = T::kMF>
__device__ __forceinline__ void warp_tile_mma_rows(int slices, const bf16* as, const bf16* bs,
                                                   float (&acc)[T::kMF][T::kNF][4]) {
  if constexpr (NM > 0) {
    if (slices >= NM) warp_tile_mma<T, NM>(as, bs, acc);
    else warp_tile_mma_rows<T, NM - 1>(slices, as, bs, acc);
  }
}

template <class T, bool SWIGLU>
__global__ void __launch_bounds__(T::kThreads, T::kMinBlocks) grouped_gemm_kernel(const Params p) {
  constexpr int kBN = T::kBN, kBK = T::kBK, kStages = T::kStages, kLds = T::kLds, kWarpM = T::kWarpM,
                kWarpN = T::kWarpN, kChunks = T::kChunks, kRowsPass = T::kRowsPass;
  pdl_wait();  // offsets, tile table and A come from the kernels before
  GroupTile gt;
  if (!find_group_tile(p.offsets, p.tile_start, p.experts, kBM, blockIdx.y, gt)) return;
  const int e = gt.group, m0 = gt.m0, m_end = gt.m_end;

  extern __shared__ __align__(16) bf16 smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;

  // This thread's copies: tile row tid / kChunks + i * kRowsPass, chunk tid % kChunks.
  const int kc = (tid % kChunks) * 8;
  const bf16* a_src[T::kACopies];
  const bf16* b_src[T::kBCopies];
  bool a_ok[T::kACopies], b_ok[T::kBCopies];
#pragma unroll
  for (int i = 0; i < T::kACopies; ++i) {
    const int gr = m0 + tid / kChunks + i * kRowsPass;
    a_ok[i] = gr < m_end;
    const int64_t src_row = a_ok[i] ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : 0;
    a_src[i] = p.a + src_row * p.a_ld + kc;
  }
  const bf16* w_e = p.w[e];
  const bf16* w2_e = SWIGLU ? p.w2[e] : nullptr;
#pragma unroll
  for (int i = 0; i < T::kBCopies; ++i) {
    const int row = tid / kChunks + i * kRowsPass;
    int n;
    const bf16* base = w_e;
    if constexpr (SWIGLU) {
      // Tile rows [WN j, WN j + WN / 2): gate rows WN / 2 j.., [WN j + WN / 2, WN (j + 1)): the same up rows.
      n = blockIdx.x * (kBN / 2) + (row / kWarpN) * (kWarpN / 2) + row % (kWarpN / 2);
      if ((row / (kWarpN / 2)) % 2) base = w2_e;
    } else {
      n = blockIdx.x * kBN + row;
    }
    b_ok[i] = n < p.N;
    b_src[i] = base + (b_ok[i] ? int64_t(n) * p.w_ld : 0) + kc;
  }
  auto load_stage = [&](int stage, int kt) {
    bf16* as = smem + stage * T::kStageElems;
    bf16* bs = as + kBM * kLds;
    const int k = kt * kBK;
    const bool k_ok = k + kc < p.K;
    // An invalid copy reads nothing; its address stays the row's start, inside the operand.
#pragma unroll
    for (int i = 0; i < T::kACopies; ++i) {
      const bool v = a_ok[i] && k_ok;
      cp_async16(as + (tid / kChunks + i * kRowsPass) * kLds + kc, a_src[i] + (v ? k : 0), v);
    }
#pragma unroll
    for (int i = 0; i < T::kBCopies; ++i) {
      const bool v = b_ok[i] && k_ok;
      cp_async16(bs + (tid / kChunks + i * kRowsPass) * kLds + kc, b_src[i] + (v ? k : 0), v);
    }
  };

  float acc[T::kMF][T::kNF][4];
#pragma unroll
  for (int i = 0; i < T::kMF; ++i)
#pragma unroll
    for (int j = 0; j < T::kNF; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;
  // 16-row slices of this warp that hold rows of the expert (warp-uniform, may be <= 0).
  const int slices = (m_end - (m0 + wm * kWarpM) + 15) / 16;
  // The lane's ldmatrix addresses within a stage: A rows lane % 16, K half lane / 16; B (two
  // 8-column groups of 16 K) rows lane % 8 + 8 (lane / 16), K half (lane / 8) % 2.
  const int a_lane = (wm * kWarpM + lane % 16) * kLds + (lane / 16) * 8;
  const int b_lane = kBM * kLds + (wn * kWarpN + (lane / 16) * 8 + lane % 8) * kLds + ((lane / 8) % 2) * 8;

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
    const bf16* stage = smem + (kt % kStages) * T::kStageElems;
    warp_tile_mma_rows<T>(slices, stage + a_lane, stage + b_lane, acc);
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind

  // Thread (g, t) of the quad layout holds rows g and g + 8, columns 2t and 2t + 1 of each 16x8 slice.
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int mf = 0; mf < T::kMF; ++mf)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + wm * kWarpM + mf * 16 + g + h * 8;
      if (r >= m_end) continue;
      bf16* crow = p.c + int64_t(r) * p.c_ld;
      if constexpr (SWIGLU) {
#pragma unroll
        for (int nf = 0; nf < T::kNF / 2; ++nf) {
          const int col = blockIdx.x * (kBN / 2) + wn * (kWarpN / 2) + nf * 8 + 2 * t;
          if (col >= p.N) continue;
          float v[2];
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const float gate = acc[mf][nf][2 * h + q], up = acc[mf][nf + T::kNF / 2][2 * h + q];
            v[q] = silu_mul(gate, up);
          }
          store_pair(crow + col, v[0], v[1], p.pair_stores, col + 1 < p.N);
        }
      } else {
#pragma unroll
        for (int nf = 0; nf < T::kNF; ++nf) {
          const int col = blockIdx.x * kBN + wn * kWarpN + nf * 8 + 2 * t;
          if (col >= p.N) continue;
          store_pair(crow + col, acc[mf][nf][2 * h], acc[mf][nf][2 * h + 1], p.pair_stores, col + 1 < p.N);
        }
      }
    }
}

template <class T>
void launch(const Params& p, int64_t row_tiles, bool swiglu) {
  const int64_t bn = swiglu ? T::kBN / 2 : T::kBN;
  const dim3 grid(unsigned((p.N + bn - 1) / bn), unsigned(row_tiles));
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_kernel<T, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  if (swiglu) launch_pdl(grouped_gemm_kernel<T, true>, grid, dim3(T::kThreads), T::kSmemBytes, p);
  else launch_pdl(grouped_gemm_kernel<T, false>, grid, dim3(T::kThreads), T::kSmemBytes, p);
}

// The shapes built, by name (BM x BN x BK). The default is a wgmma shape on a Hopper, else
// 128x128x64: on the H200 (BENCHMARKS, session 7) wgmma128x128x64 ran Qwen3's and V2-Lite's
// prefill experts at 450-530 TFLOP/s, the mma.sync shapes at 240-300. Of the two wgmma shapes,
// 128x256 reads (128 + 256) K-rows of operands for 128 x 256 outputs where 128x128 reads 256
// for half as many, so it asks less of L2 for the same products; where experts get at least
// 256 rows on average it won (session 8's bench: ties at a mean of 256, 3-6 %
// ahead from 384; session 9: Qwen3's 8k prefill 39.8 -> 37.8 ms end to end). Below, its single
// block an SM (193 KiB of stages) has fewer, emptier tiles to overlap. Since session 35 the
// default from kTmaTileMeanRows on is tma128x256x64 (grouped_gemm_tma.cu: the same tile,
// persistent, weights by tensor copies): both products 6-13 % faster than either wgmma shape at
// means of 128 to 768 rows an expert, where those two had tied (session 9), in all but one run
// of V2-Lite's 8k (BENCHMARKS, session 35).
struct TileEntry {
  const char* name;
  void (*launch)(const Params&, int64_t, bool);
  bool hopper;  // warpgroup MMAs (sm_90a)
};
constexpr TileEntry kTiles[] = {
    {"128x128x32", launch<Tile128x128x32>, false},
    {"128x128x64", launch<Tile128x128x64>, false},
    {"128x256x32", launch<Tile128x256x32>, false},
    {"128x256x64", launch<Tile128x256x64>, false},
    {"wgmma128x128x64", grouped_gemm_impl::launch_wgmma_128x128x64, true},  // [4]: the default ...
    {"wgmma128x256x64", grouped_gemm_impl::launch_wgmma_128x256x64, true},  // [5]
    {"tma128x256x64", grouped_gemm_impl::launch_tma_128x256x64, true},      // [6]: ... and with many rows an expert
};

std::mutex g_tile_mutex;
std::string g_tile_override;  // set_grouped_gemm_tile's name; empty: the environment's

constexpr int64_t kTmaTileMeanRows = 128;

// mean_rows: the call's rows an expert on average (the default shape depends on it).
const TileEntry& selected_tile(int64_t mean_rows = 0) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(g_tile_mutex);
    name = g_tile_override;
  }
  if (name.empty()) {
    const char* env = std::getenv("MOESERVE_GROUPED_GEMM_TILE");
    if (!env || !*env) return !hopper() ? kTiles[1] : mean_rows >= kTmaTileMeanRows ? kTiles[6] : kTiles[4];
    name = env;
  }
  for (const TileEntry& t : kTiles)
    if (name == t.name) return t;
  std::string names;
  for (const TileEntry& t : kTiles) names += std::string(" ") + t.name;
  fail("grouped_gemm: unknown tile shape '", name, "' (built:", names, ")");
}

// One warp: a scan of ceil(rows / bm) over the groups, 32 at a time.
__global__ void tile_table_kernel(const int32_t* __restrict__ offsets, int E, int bm, int32_t* __restrict__ tile_start) {
  const int lane = threadIdx.x;
  int base = 0;
  for (int c = 0; c < E; c += 32) {
    const int e = c + lane;
    const int cnt = e < E ? (offsets[e + 1] - offsets[e] + bm - 1) / bm : 0;
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

}  // namespace

Tensor grouped_tile_table(const int32_t* offsets, int E, int bm) {
  Tensor tiles = scratch(DType::I32, {E + 1});
  tile_table_kernel<<<1, 32, 0, stream()>>>(offsets, E, bm, tiles.data<int32_t>());
  MS_CUDA_LAUNCHED("tile_table_kernel");
  return tiles;
}

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

bool grouped_gemm_on_wgmma() { return selected_tile().hopper; }

std::vector<std::string> grouped_gemm_tiles() {
  std::vector<std::string> names;
  for (const TileEntry& t : kTiles) names.emplace_back(t.name);
  return names;
}

void set_grouped_gemm_tile(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_tile_mutex);
  g_tile_override = name;
}

void grouped_gemm(const GroupedGemmArgs& args, bool swiglu) {
  MS_CHECK(grouped_gemm_supported(args.K, args.w_ld, args.a, args.a_ld) && args.experts > 0 && args.N > 0 &&
               args.N < (int64_t(1) << 30) && grouped_gemm_fits(args.max_rows, args.experts) && args.w &&
               (!swiglu || args.w2) && args.offsets && args.c && args.c_ld >= args.N,
           "grouped_gemm: N ", args.N, " K ", args.K, " w_ld ", args.w_ld, " a_ld ", args.a_ld, " c_ld ", args.c_ld,
           " experts ", args.experts);
  const TileEntry& tile = selected_tile(args.max_rows / std::max(args.experts, 1));  // checked even with nothing to do
  if (args.max_rows == 0) return;
  const int E = args.experts;
  Tensor tiles = grouped_tile_table(args.offsets, E, kBM);

  Params p;
  p.N = int(args.N), p.K = int(args.K);
  p.a = static_cast<const bf16*>(args.a), p.a_ld = args.a_ld, p.a_rows = args.a_rows;
  p.w = reinterpret_cast<const bf16* const*>(args.w), p.w2 = reinterpret_cast<const bf16* const*>(args.w2);
  p.w_ld = args.w_ld, p.offsets = args.offsets, p.tile_start = tiles.data<int32_t>(), p.experts = E;
  p.c = static_cast<bf16*>(args.c), p.c_ld = args.c_ld;
  p.pair_stores = args.c_ld % 2 == 0 && reinterpret_cast<uintptr_t>(args.c) % 4 == 0;
  // sum over experts of ceil(rows_e / kBM) <= this: the grid's y extent.
  tile.launch(p, (args.max_rows + kBM - 1) / kBM + E, swiglu);
}

}  // namespace ms::cuda
