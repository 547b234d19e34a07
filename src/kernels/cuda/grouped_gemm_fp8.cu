// The grouped GEMM of grouped_gemm.h with FP8-block weights ("w8a16"): the weights stay e4m3 in
// HBM and in shared memory (cp.async of bytes, half the traffic and staging of BF16), and each
// B fragment is converted in registers, unscaled (e4m3x4_bf16: exact), before mma.sync m16n8k16
// with BF16 activations into f32 sums a K tile long, which the fragment's block scale then adds
// into the totals: a weight counts as float(e4m3) * scale, unrounded. Scheduling (the device
// tile table, blocks of one row tile adjacent so an expert's weights are shared through L2) is
// grouped_tiles.cuh's, the same as the BF16 kernel's.
//
// Why not the streaming GEMV: at 16 rows an expert it spends 16 FMAs on CUDA cores per weight
// (0.77 TB/s measured on V3's experts); here a weight costs a conversion (3 integer instructions
// per 2 weights, once per block) and 1/16 of an MMA per 16 rows.
//
// Fragments without ldmatrix: the k order inside an MMA is free as long as A and B agree, so a
// thread (g, t) takes bytes 8t..8t+7 of a 32-wide K step as its B values (one 8-byte shared
// load, two MMAs' worth: bytes 8t..8t+3 are logical k {2t, 2t+1, 2t+8, 2t+9} of the first
// k16, 8t+4..8t+7 of the second) and the same physical columns of A. An MMA's A registers are
// {row g, row g + 8, row g, row g + 8} and must be four consecutive registers, so A is staged
// with the rows g and g + 8 of a 16-row slice interleaved word by word (4-byte copies): one
// 16-byte load is one MMA's A. (Staged row by row, each MMA first moved its four registers into
// place: a quarter of the kernel's instructions in session 39's Nsight report; BENCHMARKS, session 40.)
// B rows are padded by 32 bytes and A's row pairs by 16, so that the 8-byte B loads of a
// half-warp (4 rows x 4 threads) and the 16-byte A loads of a quarter-warp (2 pairs x 4) hit
// distinct banks.
//
// Scales: a K tile (64 or 128) lies inside one 128-wide scale block, and a warp's 8-row fragment
// inside one 128-row block (gate and up rows each come from their own matrix at 8-row
// granularity), so a fragment needs one scale a K tile, read through L1, applied to its K tile's
// sums (an FMA a sum a tile, where scaling each weight as it was converted took a multiply a weight).
//
// Row tiles: BM 16, 32 or 64 (grouped_gemm_fp8_bm picks from the rows a group), the warps all
// side by side along N so that each weight is converted once per block. (A BM 128 tile, two warp
// rows converting each weight twice, lost to 64 at every size measured, up to 1024 rows an expert.)
// On a Hopper, where BM 64 would run, grouped_gemm_fp8_wgmma.cu's warpgroup-MMA shapes (BM 64 and
// 128, each weight converted once a block into a swizzled BF16 tile) take over (grouped_gemm_fp8_tile).
// A dense product (one group, offsets null) of few rows has too few N tiles to keep HBM busy
// (7168 -> 2112 is 17 blocks of 128 columns), so K is split over grid.z until the grid covers
// the SMs twice, the partial sums go to an F32 scratch and a second kernel adds them in order.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/flash_prefill.h"  // cp_async16 / cp_async_commit / cp_async_wait
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_fp8_impl.h"
#include "kernels/cuda/grouped_tiles.cuh"

namespace ms::cuda {
namespace grouped_fp8 {
namespace {

constexpr int kThreads = 256;

template <int BM, int BK, int STAGES, int WM, int WN, int MIN_BLOCKS>
struct F8Tile {
  static constexpr int kBM = BM, kBK = BK, kStages = STAGES, kWarpM = WM, kWarpN = WN, kMinBlocks = MIN_BLOCKS;
  static constexpr int kWarpsN = kBN / WN, kWarps = (BM / WM) * kWarpsN;
  static constexpr int kMF = WM / 16, kNF = WN / 8;
  static constexpr int kLdp = 4 * BK + 16;  // bytes of a row pair (a_pair_offset): 16 mod 128
  static constexpr int kLdb = BK + 32;      // bytes: a row is 32 or 96 mod 128 bytes
  static constexpr int kABytes = BM / 2 * kLdp, kStageBytes = kABytes + kBN * kLdb;
  static constexpr size_t kSmemBytes = size_t(STAGES) * kStageBytes;
  static constexpr int kAChunks = BM * BK / 8, kBChunks = kBN * BK / 16;  // 16-byte copies a stage
  static constexpr int kACopies = (kAChunks + kThreads - 1) / kThreads, kBCopies = kBChunks / kThreads;
  static_assert(kWarps * 32 == kThreads && kBChunks % kThreads == 0 && 128 % BK == 0 && BK % 32 == 0, "tile");
  static_assert(kSmemBytes * MIN_BLOCKS <= 227 * 1024, "shared memory of the blocks an SM");
};
using F8Tile16 = F8Tile<16, 128, 4, 16, 16, 2>;   // 100 KiB
using F8Tile32 = F8Tile<32, 128, 3, 32, 16, 2>;   // 90 KiB
using F8Tile64 = F8Tile<64, 64, 4, 64, 16, 2>;    // 96 KiB (only where wgmma is off; its K tile of 64
                                                   // pays the 4-byte A copies twice a weight: 6 % slower)

// Where word w (elements 2w, 2w + 1) of a stage's A row r lies, in bytes: rows r and r + 8 of a
// 16-row slice share a row pair, in groups of 16 bytes {row g word 2j, row g + 8 word 2j, row g
// word 2j + 1, row g + 8 word 2j + 1}, so that group 8 ks + 2t + h is the A of thread (g, t)'s
// MMA h of K step ks.
template <class T>
__device__ __forceinline__ int a_pair_offset(int r, int w) {
  return (r / 16 * 8 + r % 8) * T::kLdp + (w / 2) * 16 + (w % 2) * 8 + (r / 8 % 2) * 4;
}
// One K tile of a warp's products over its first NM 16-row slices, added to acc times each
// fragment's scale sc: as / bs point at the lane's first A group (pair g, group 2t) and B row
// (g, column 8t) in the stage.
template <class T, int NM>
__device__ __forceinline__ void warp_tile(const uint8_t* as, const uint8_t* bs, const float (&sc)[T::kNF],
                                          float (&acc)[T::kMF][T::kNF][4]) {
  float part[NM][T::kNF][4];
#pragma unroll
  for (int mf = 0; mf < NM; ++mf)
#pragma unroll
    for (int nf = 0; nf < T::kNF; ++nf)
#pragma unroll
      for (int v = 0; v < 4; ++v) part[mf][nf][v] = 0.f;
#pragma unroll
  for (int ks = 0; ks < T::kBK / 32; ++ks) {
    uint4 lo[NM], hi[NM];  // the A of the K step's first and second MMA
#pragma unroll
    for (int mf = 0; mf < NM; ++mf) {
      lo[mf] = *reinterpret_cast<const uint4*>(as + mf * 8 * T::kLdp + ks * 128);
      hi[mf] = *reinterpret_cast<const uint4*>(as + mf * 8 * T::kLdp + ks * 128 + 16);
    }
#pragma unroll
    for (int nf = 0; nf < T::kNF; ++nf) {
      const uint2 raw = *reinterpret_cast<const uint2*>(bs + nf * 8 * T::kLdb + ks * 32);
      uint32_t b00, b01, b10, b11;
      e4m3x4_bf16(raw.x, b00, b01);
      e4m3x4_bf16(raw.y, b10, b11);
#pragma unroll
      for (int mf = 0; mf < NM; ++mf) {
        const uint32_t a0[4] = {lo[mf].x, lo[mf].y, lo[mf].z, lo[mf].w};
        const uint32_t a1[4] = {hi[mf].x, hi[mf].y, hi[mf].z, hi[mf].w};
        mma_bf16(part[mf][nf], a0, b00, b01);
        mma_bf16(part[mf][nf], a1, b10, b11);
      }
    }
  }
#pragma unroll
  for (int mf = 0; mf < NM; ++mf)
#pragma unroll
    for (int nf = 0; nf < T::kNF; ++nf)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[mf][nf][v] = fmaf(part[mf][nf][v], sc[nf], acc[mf][nf][v]);
}

// warp_tile over the warp's `slices` 16-row slices that hold rows (warp-uniform; 0: none), as a
// choice among straight-line bodies so no branch sits between the loads and the MMAs.
template <class T, int NM = T::kMF>
__device__ __forceinline__ void warp_tile_rows(int slices, const uint8_t* as, const uint8_t* bs,
                                               const float (&sc)[T::kNF], float (&acc)[T::kMF][T::kNF][4]) {
  if constexpr (NM > 0) {
    if (slices >= NM) warp_tile<T, NM>(as, bs, sc, acc);
    else warp_tile_rows<T, NM - 1>(slices, as, bs, sc, acc);
  }
}

template <class T, bool SWIGLU>
__global__ void __launch_bounds__(kThreads, T::kMinBlocks) grouped_gemm_fp8_kernel(const Params p) {
  constexpr int kBM = T::kBM, kBK = T::kBK, kStages = T::kStages, kWarpN = T::kWarpN;
  pdl_wait();  // offsets, tile table and A come from the kernels before
  const bool dense = p.offsets == nullptr;  // one group of dense_rows rows, no table
  GroupTile gt;
  if (!fp8_block_tile(p, kBM, gt)) return;
  const int e = gt.group, m0 = gt.m0, m_end = gt.m_end;

  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int wm = warp / T::kWarpsN, wn = warp % T::kWarpsN;
  const int g = lane / 4, t = lane % 4;

  // Copies: A chunk i of the stage is row i / (BK / 8), 8 elements (four words to a_pair_offset's
  // places: a_dst, then + 8, 16, 24); B chunk row i / (BK / 16), 16 bytes.
  const bf16* a_src[T::kACopies];
  int a_dst[T::kACopies];
  bool a_ok[T::kACopies];
#pragma unroll
  for (int i = 0; i < T::kACopies; ++i) {
    const int idx = tid + i * kThreads;
    const int r = idx / (kBK / 8), gr = m0 + r;
    a_ok[i] = idx < T::kAChunks && gr < m_end;
    const int64_t src_row = a_ok[i] ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : 0;
    a_src[i] = p.a + src_row * p.a_ld + (idx % (kBK / 8)) * 8;
    a_dst[i] = a_pair_offset<T>(r, (idx % (kBK / 8)) * 4);
  }
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const uint8_t* w_e = dense ? p.w_one : p.w[e];
  const uint8_t* w2_e = SWIGLU ? (dense ? p.w2_one : p.w2[e]) : nullptr;
  const float* s_e = dense ? p.s_one : p.s[e];
  const float* s2_e = SWIGLU ? (dense ? p.s2_one : p.s2[e]) : nullptr;
  // Tile row r's weight row and matrix. SwiGLU: rows [WN j, WN j + WN / 2) are gate rows
  // WN / 2 j.., the next WN / 2 the same up rows, so a warp holds gate and up of the same columns.
  auto tile_row = [&](int r, bool& up) {
    if constexpr (SWIGLU) {
      up = (r / (kWarpN / 2)) % 2;
      return int(blockIdx.x) * (kBN / 2) + (r / kWarpN) * (kWarpN / 2) + r % (kWarpN / 2);
    } else {
      up = false;
      return int(blockIdx.x) * kBN + r;
    }
  };
  const uint8_t* b_src[T::kBCopies];
  bool b_ok[T::kBCopies];
#pragma unroll
  for (int i = 0; i < T::kBCopies; ++i) {
    const int idx = tid + i * kThreads;
    bool up;
    const int n = tile_row(idx / (kBK / 16), up);
    b_ok[i] = n < p.N;
    b_src[i] = (up ? w2_e : w_e) + (b_ok[i] ? int64_t(n) * p.w_ld : 0) + (idx % (kBK / 16)) * 16;
  }
  // Each fragment's scale row (clamped: a fragment wholly past N reads zero-filled weights).
  const float* s_row[T::kNF];
  const int n_blocks = (p.N + 127) / 128;
#pragma unroll
  for (int nf = 0; nf < T::kNF; ++nf) {
    bool up;
    const int n = tile_row(wn * kWarpN + nf * 8, up);
    s_row[nf] = (up ? s2_e : s_e) + int64_t(min(n / 128, n_blocks - 1)) * p.s_ld;
  }

  const int KT = (p.K + kBK - 1) / kBK;
  const int kt0 = blockIdx.z * (p.k_split / kBK), kt1 = min(KT, kt0 + p.k_split / kBK);
  // K a multiple of BK (every published block-FP8 shape): each copy's columns are in range, and a
  // copy of a row past the group or N keeps row 0's address, so no copy tests its column.
  const bool k_whole = p.K % kBK == 0;
  // A chunk i's four words from src (zeros when !v) to their places in the stage at `as`.
  auto copy_a = [&](uint32_t as, int i, const bf16* src, bool v) {
    cp_async4(as + a_dst[i], src, v);
    cp_async4(as + a_dst[i] + 8, src + 2, v);
    cp_async4(as + a_dst[i] + 16, src + 4, v);
    cp_async4(as + a_dst[i] + 24, src + 6, v);
  };
  auto load_stage = [&](int stage, int kt) {
    const uint32_t as = smem_addr + stage * T::kStageBytes;
    uint8_t* bs = smem + stage * T::kStageBytes + T::kABytes;
    const int k = kt * kBK;
    if (k_whole) {
#pragma unroll
      for (int i = 0; i < T::kACopies; ++i) {
        if (T::kAChunks % kThreads != 0 && tid + i * kThreads >= T::kAChunks) break;
        copy_a(as, i, a_src[i] + k, a_ok[i]);
      }
#pragma unroll
      for (int i = 0; i < T::kBCopies; ++i) {
        const int idx = tid + i * kThreads;
        cp_async16(bs + (idx / (kBK / 16)) * T::kLdb + (idx % (kBK / 16)) * 16, b_src[i] + k, b_ok[i]);
      }
      return;
    }
    // An invalid copy reads nothing; its address stays the row's start, inside the operand.
#pragma unroll
    for (int i = 0; i < T::kACopies; ++i) {
      const int idx = tid + i * kThreads;
      if (T::kAChunks % kThreads != 0 && idx >= T::kAChunks) break;
      const int kc = (idx % (kBK / 8)) * 8;
      const bool v = a_ok[i] && k + kc < p.K;
      copy_a(as, i, a_src[i] + (v ? k : 0), v);
    }
#pragma unroll
    for (int i = 0; i < T::kBCopies; ++i) {
      const int idx = tid + i * kThreads;
      const int kc = (idx % (kBK / 16)) * 16;
      const bool v = b_ok[i] && k + kc < p.K;
      cp_async16(bs + (idx / (kBK / 16)) * T::kLdb + kc, b_src[i] + (v ? k : 0), v);
    }
  };

  float acc[T::kMF][T::kNF][4];
#pragma unroll
  for (int i = 0; i < T::kMF; ++i)
#pragma unroll
    for (int j = 0; j < T::kNF; ++j)
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.f;
  const int slices = (m_end - (m0 + wm * T::kWarpM) + 15) / 16;
  const int a_lane = (wm * T::kWarpM / 2 + g) * T::kLdp + 32 * t;  // bytes
  const int b_lane = T::kABytes + (wn * kWarpN + g) * T::kLdb + 8 * t;  // bytes

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (kt0 + s < kt1) load_stage(s, kt0 + s);
    cp_async_commit();
  }
  int read_stage = 0, write_stage = kStages - 1;  // (kt - kt0) % kStages, (next - kt0) % kStages
  for (int kt = kt0; kt < kt1; ++kt) {
    float sc[T::kNF];
    const int kb = kt * kBK / 128;
#pragma unroll
    for (int nf = 0; nf < T::kNF; ++nf) sc[nf] = __ldg(s_row[nf] + kb) * kE4m3Unscale;
    cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's, and every warp is done with tile kt - 1's stage
    const int next = kt + kStages - 1;
    if (next < kt1) load_stage(write_stage, next);
    cp_async_commit();
    const uint8_t* stage = smem + read_stage * T::kStageBytes;
    read_stage = read_stage == kStages - 1 ? 0 : read_stage + 1;
    write_stage = write_stage == kStages - 1 ? 0 : write_stage + 1;
    warp_tile_rows<T>(slices, stage + a_lane, stage + b_lane, sc, acc);
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind

  const int64_t c_base = int64_t(blockIdx.z) * p.c_split;
#pragma unroll
  for (int mf = 0; mf < T::kMF; ++mf)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = m0 + wm * T::kWarpM + mf * 16 + g + h * 8;
      if (r >= m_end) continue;
      const int64_t row = c_base + int64_t(r) * p.c_ld;
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
          store_pair(p, row + col, v[0], v[1], col + 1 < p.N);
        }
      } else {
#pragma unroll
        for (int nf = 0; nf < T::kNF; ++nf) {
          const int col = blockIdx.x * kBN + wn * kWarpN + nf * 8 + 2 * t;
          if (col >= p.N) continue;
          store_pair(p, row + col, acc[mf][nf][2 * h], acc[mf][nf][2 * h + 1], col + 1 < p.N);
        }
      }
    }
}

// c[r, n] = sum over z of part[z, r, n], in z order, rounded once.
template <class TO>
__global__ void sum_splits(const float* __restrict__ part, int splits, int64_t rows, int N, TO* __restrict__ c,
                           int64_t c_ld) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * N) return;
  float s = 0.f;
  for (int z = 0; z < splits; ++z) s += part[int64_t(z) * rows * N + idx];
  store_f(c + (idx / N) * c_ld + idx % N, s);
}

template <class T>
void launch_mma(const Params& p, int64_t row_tiles, bool swiglu, int64_t max_rows) {
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_fp8_kernel<T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_fp8_kernel<T, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(T::kSmemBytes)));
  });
  launch(p, row_tiles, swiglu, max_rows,
         Kernels{grouped_gemm_fp8_kernel<T, false>, grouped_gemm_fp8_kernel<T, true>, T::kBK, kThreads, T::kSmemBytes});
}

}  // namespace

void launch(Params p, int64_t row_tiles, bool swiglu, int64_t max_rows, const Kernels& k) {
  const int64_t n_tiles = (p.N + (swiglu ? kBN / 2 : kBN) - 1) / (swiglu ? kBN / 2 : kBN);
  const int KT = (p.K + k.bk - 1) / k.bk;
  // Split K (dense plain products only: SwiGLU needs whole sums) until the grid covers the SMs
  // twice; at least 4 K tiles a slice (64 KB of weights at BK 128, 32 at 64), so each slice fills
  // its pipeline. The partial sums are small next to the weights: 14 slices of 16 rows x 2112
  // are 1.9 MB against 15 MB.
  int splits = 1;
  if (!p.offsets && !swiglu) {
    const int64_t blocks = n_tiles * row_tiles, want = 2 * int64_t(sm_count());
    if (blocks < want) splits = int(std::min<int64_t>((want + blocks - 1) / blocks, std::max(1, KT / 4)));
  }
  const int kt_split = (KT + splits - 1) / splits;
  splits = (KT + kt_split - 1) / kt_split;
  p.k_split = kt_split * k.bk;
  void* const c = p.c;
  const int64_t c_ld = p.c_ld;
  const bool c_f32 = p.c_f32;
  Tensor part;
  if (splits > 1) {
    part = scratch(DType::F32, {splits, max_rows, p.N});
    p.c = part.raw(), p.c_ld = p.N, p.c_f32 = true, p.pair_stores = p.N % 2 == 0, p.c_split = max_rows * p.N;
  }
  const dim3 grid{unsigned(n_tiles), unsigned(row_tiles), unsigned(splits)};
  launch_pdl(swiglu ? k.swiglu : k.plain, grid, dim3(k.threads), k.smem, p);
  if (splits == 1) return;
  const int threads = 256;
  if (c_f32)
    sum_splits<float><<<blocks_for(max_rows * p.N, threads), threads, 0, stream()>>>(
        part.data<float>(), splits, max_rows, p.N, static_cast<float*>(c), c_ld);
  else
    sum_splits<bf16><<<blocks_for(max_rows * p.N, threads), threads, 0, stream()>>>(
        part.data<float>(), splits, max_rows, p.N, static_cast<bf16*>(c), c_ld);
  MS_CUDA_LAUNCHED("sum_splits");
}

}  // namespace grouped_fp8

bool grouped_gemm_fp8_supported(int64_t K, int64_t w_ld, const void* a, int64_t a_ld) {
  return K % 16 == 0 && w_ld % 16 == 0 && w_ld >= K && a_ld % 8 == 0 && a_ld >= K &&
         (a == nullptr || reinterpret_cast<uintptr_t>(a) % 16 == 0) && K < (int64_t(1) << 30);
}

bool grouped_gemm_fp8_fits(int64_t max_rows, int experts, int bm) {
  return max_rows >= 0 && experts > 0 && bm > 0 && (max_rows + bm - 1) / bm + experts <= 65535;
}

// A dense group takes the smallest tile that holds its rows. Experts' counts scatter around the
// mean (random routing: 16 +- 4 at a mean of 16), and a group one row past a tile pays a second
// block that converts the whole weight again (from L2), while a tile twice too tall only adds MMAs
// (about 2 instructions a fragment of 8 x 32 weights against ~27 to convert them) and skips the
// 16-row slices with no rows. So a mean of m takes the tile that holds ~1.5 m: 16 up to 10 rows,
// 32 up to 21, 64 above. Measured on the H200 (BENCHMARKS, session 7, V3's EP8 experts): a mean
// of 16 rows 0.58 ms at BM 32 against 0.70 at 16 and 0.69 at 64; of 64 rows 1.29 ms at 64.
int grouped_gemm_fp8_bm(int64_t rows, bool mean) {
  if (mean) return rows <= 10 ? 16 : rows <= 21 ? 32 : 64;
  return rows <= 16 ? 16 : rows <= 32 ? 32 : 64;
}

bool grouped_gemm_fp8_wgmma_enabled() {
  const char* v = std::getenv("MOESERVE_FP8_WGMMA");
  return hopper() && !(v && std::strcmp(v, "0") == 0);
}

// The wgmma shapes where mma.sync's BM 64 would run: that one is compute-bound from ~32 rows
// (150-190 TFLOP/s), and wgmma's rate, its operands read from shared memory, leaves the
// conversion (once a weight a block, overlapped with the previous tile's wgmmas) and HBM as the
// limits. BM 128 converts each weight half as often as 64 but runs one block an SM. Measured on
// the H200 (BENCHMARKS, session 8, V3's EP8 experts and dense FP8 linears): BM 64 wins up to a
// mean of 64 rows an expert (1.02 ms against 1.18) and at 64 dense rows (20-200 us, 1.3-1.5x);
// BM 128 from a mean of 256 (2.96 against 3.02 ms) and at 256 dense rows.
namespace {
Fp8RowTile bf16_activation_tile(int64_t rows, bool mean) {
  const int bm = grouped_gemm_fp8_bm(rows, mean);
  if (bm < 64 || !grouped_gemm_fp8_wgmma_enabled()) return {bm, false};
  return {rows <= (mean ? 128 : 64) ? 64 : 128, true};
}
}  // namespace

// With FP8 activations, BM 64 at every size: its weights cost a copy each, so even 16 rows an
// expert stream faster than mma.sync's BM 32 (BENCHMARKS, session 43: V3's EP8 experts at 16 rows
// 0.385 ms against 0.510, at 64 rows 0.526 against 0.961, at 256 rows 1.50 against 2.54 at BM 128).
Fp8RowTile grouped_gemm_fp8_tile(int64_t rows, bool mean) {
  if (grouped_gemm_fp8_wgmma_enabled() && grouped_gemm_fp8_act8_enabled()) return {64, true, true};
  return bf16_activation_tile(rows, mean);
}

bool grouped_gemm_fp8_act8_enabled() {
  const char* v = std::getenv("MOESERVE_FP8_ACT8");
  return hopper() && v && std::strcmp(v, "1") == 0;
}

bool grouped_gemm_fp8_enabled() {
  const char* v = std::getenv("MOESERVE_FP8_GROUPED");
  return !(v && std::strcmp(v, "0") == 0);
}

void grouped_gemm_fp8(const GroupedGemmArgs& args, bool swiglu) {
  const bool dense = args.offsets == nullptr;
  const int E = dense ? 1 : args.experts;
  const int64_t tile_rows = dense ? args.max_rows : (args.max_rows + E - 1) / E;
  Fp8RowTile tile = args.bm ? Fp8RowTile{args.bm, args.wgmma, args.act8} : grouped_gemm_fp8_tile(tile_rows, !dense);
  // FP8 activations need K in whole 128-wide blocks (every published DeepSeek shape has it).
  if (tile.act8 && !(tile.wgmma && tile.bm == 64 && args.K % 128 == 0)) tile = bf16_activation_tile(tile_rows, !dense);
  const int bm = tile.bm;
  MS_CHECK(grouped_gemm_fp8_supported(args.K, args.w_ld, args.a, args.a_ld) && args.K > 0 && E > 0 && args.N > 0 &&
               args.N < (int64_t(1) << 30) && grouped_gemm_fp8_fits(args.max_rows, E, bm) && args.c &&
               args.c_ld >= args.N && args.s_ld >= (args.K + 127) / 128 &&
               (dense ? args.w_one && args.s_one && (!swiglu || (args.w2_one && args.s2_one))
                      : args.w && args.s && (!swiglu || (args.w2 && args.s2))) &&
               (tile.wgmma ? (bm == 64 || bm == 128) && hopper() : bm == 16 || bm == 32 || bm == 64),
           "grouped_gemm_fp8: N ", args.N, " K ", args.K, " w_ld ", args.w_ld, " a_ld ", args.a_ld, " c_ld ",
           args.c_ld, " s_ld ", args.s_ld, " experts ", args.experts, " bm ", bm, tile.wgmma ? " (wgmma)" : "");
  if (args.max_rows == 0) return;
  Tensor tiles;
  if (!dense) tiles = grouped_tile_table(args.offsets, E, bm);

  using namespace grouped_fp8;
  Params p{};
  p.N = int(args.N), p.K = int(args.K);
  p.a = static_cast<const bf16*>(args.a), p.a_ld = args.a_ld, p.a_rows = args.a_rows;
  p.w = reinterpret_cast<const uint8_t* const*>(args.w), p.w2 = reinterpret_cast<const uint8_t* const*>(args.w2);
  p.s = args.s, p.s2 = args.s2;
  p.w_one = static_cast<const uint8_t*>(args.w_one), p.w2_one = static_cast<const uint8_t*>(args.w2_one);
  p.s_one = args.s_one, p.s2_one = args.s2_one;
  p.w_ld = args.w_ld, p.s_ld = args.s_ld;
  p.offsets = args.offsets, p.tile_start = dense ? nullptr : tiles.data<int32_t>(), p.experts = E;
  p.dense_rows = int(args.max_rows);
  p.c = args.c, p.c_ld = args.c_ld, p.c_f32 = args.c_f32;
  p.pair_stores = args.c_ld % 2 == 0 && reinterpret_cast<uintptr_t>(args.c) % 8 == 0;
  // Grouped: sum over groups of ceil(rows_e / bm) <= this, the grid's y extent.
  const int64_t row_tiles = (args.max_rows + bm - 1) / bm + (dense ? 0 : E);
  if (tile.act8) {
    // A's rows as e4m3 and their scales, in group-row order (the token index applied here).
    Tensor codes = scratch(DType::U8, {args.max_rows, args.K}), scales = scratch(DType::F32, {args.max_rows, args.K / 128});
    quantize_act8(p.a, p.a_ld, p.a_rows, dense ? nullptr : args.offsets + E, args.max_rows, args.K,
                  codes.data<uint8_t>(), scales.data<float>());
    p.a8 = codes.data<uint8_t>(), p.a8_ld = args.K, p.sa = scales.data<float>(), p.sa_ld = args.K / 128;
    return launch_act8(p, row_tiles, swiglu, args.max_rows);
  }
  if (tile.wgmma) return launch_wgmma(p, row_tiles, swiglu, args.max_rows, bm);
  switch (bm) {
    case 16: launch_mma<F8Tile16>(p, row_tiles, swiglu, args.max_rows); break;
    case 32: launch_mma<F8Tile32>(p, row_tiles, swiglu, args.max_rows); break;
    default: launch_mma<F8Tile64>(p, row_tiles, swiglu, args.max_rows); break;
  }
}

}  // namespace ms::cuda
