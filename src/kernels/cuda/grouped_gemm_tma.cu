// The warp-specialized, persistent Hopper shape of the grouped GEMM whose weight tiles come by
// the tensor-memory accelerator ("tma128x256x64"): the same tile table, row tiles of 128, gather
// through a_rows, ragged edges, SwiGLU epilogue and m64n256k16 wgmma products on 128-byte
// swizzled tiles as grouped_gemm_wgmma.cu.
//
// Why: grouped_gemm_wgmma.cu's block lives for one tile, and at one block an SM nothing fills
// its prologue (tile search, the first stages' latency) and epilogue (SiLU, stores): Qwen3's
// down product has 12 K tiles of 64 (K = 768) and runs ~415 TFLOP/s against ~550 for gate|up.
// Sessions 8 and 10 tried persistent warp-specialized shapes whose producer warpgroup moved both
// operands by cp.async (24 16-byte copies a thread a stage): 2-15 % slower. Here the weight tile
// (two thirds of a stage's bytes) is one tensor copy issued by one thread, which the copy engine
// swizzles itself; the producer's threads keep only the gathered A rows (8 copies a stage).
//
// Weight tensor maps: a map per expert (the weights are separate tensors), made on the device
// for the call (weight_maps_kernel: the host encodes one map of the right shape, strides, box and
// swizzle, and each thread writes a copy with its expert's address put in by tensormap.replace),
// so the callers keep handing a device array of weight pointers. The maps live in scratch; the
// producer fences each map into the tensor-map proxy before its first copy through it.
//
// Roles: warpgroup 0 produces, warpgroups 1 and 2 consume, each owning 64 of a tile's 128 rows
// and all 256 columns (B rows: for SwiGLU 128 gate rows then the same 128 up rows). full[s]
// completes when the producer's 128 threads' A copies have landed (cp.async.mbarrier.arrive.noinc)
// and thread 0's weight copy has (arrive.expect_tx + complete_tx): 129 arrivals. empty[s]
// completes when the consumers' 8 warps have each waited for their wgmmas on it (lane 0 arrives).
// The producer runs on into the next tile while the consumers store, so the next tile's first
// wgmmas find their operands waiting. Block b takes units b, b + grid, ... (unit u: row tile
// u / n_tiles, N tile u % n_tiles, the order of the non-persistent grid).
//
// Measured (BENCHMARKS, session 35): both products 6-13 % faster than the wgmma shapes at means
// of 128 to 768 rows an expert (Qwen3 8k: 1304 -> 1185 us; V2-Lite 1639 -> 1546), 8k prefills
// -2.5 to -4 %; then the down product's 16-byte stores (launch_tma_128x256x64) took another 14-20 %
// off that product (8k prefills -2.5 to -4.4 %, session 36), and the SwiGLU product's silu in two
// MUFU instructions (grouped_tiles.cuh) 6.6-9 % off that one, its 16-byte stores 3-5 % more.
// Units of up to 64 rows (an expert's last, in about half the experts) run in full, the second
// consumer multiplying zeros: splitting their columns over both consumers (m64n128, or two m64n64
// for SwiGLU) was tried and saved nothing (Qwen3 8k 1210 vs 1211 us, 2k tokens 451 -> 461,
// V2-Lite 2k 491 -> 525).
#include <cuda.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/grouped_gemm_impl.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/mbarrier.cuh"
#include "kernels/cuda/mma.h"  // pack_bf16
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda::grouped_gemm_impl {
namespace {

using namespace wg;
constexpr int kBK = 64;  // K a tile: one 128-byte swizzle row (see wgmma.cuh)
constexpr int kBN = 256, kStages = 4, kAcc = kBN / 2;
constexpr int kThreads = 384, kLaunchRegs = 168;  // 65536 / 384, rounded down to ptxas's 8
constexpr int kProducerRegs = 88, kConsumerRegs = 208;  // sessions 8 and 10's split: no spills either side
static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= kThreads * kLaunchRegs, "the block's registers");
constexpr int kABytes = kBM * kRowBytes, kBBytes = kBN * kRowBytes, kStageBytes = kABytes + kBBytes;
constexpr int kBarrierOffset = kStages * kStageBytes;  // full[kStages], empty[kStages]
constexpr size_t kSmemBytes = size_t(kBarrierOffset) + 2 * kStages * 8 + kAtomBytes;  // + alignment slack
constexpr int kRowsPass = 128 / 8, kACopies = kBM / kRowsPass;  // producer threads, 8 chunks a row
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block");

struct alignas(64) MapBytes {
  uint4 v[8];  // a CUtensorMap's 128 opaque bytes
};
static_assert(sizeof(MapBytes) == sizeof(CUtensorMap), "a tensor map is 128 bytes");

// Thread e: out[e] = the template with expert e's weight address.
__global__ void weight_maps_kernel(const MapBytes tmpl, const void* const* __restrict__ w, int E,
                                   MapBytes* __restrict__ out) {
  pdl_wait();
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= E) return;
#pragma unroll
  for (int i = 0; i < 8; ++i) out[e].v[i] = tmpl.v[i];
  MS_WGMMA_ASM("tensormap.replace.tile.global_address.global.b1024.b64 [%0], %1;\n" ::"l"(out + e), "l"(w[e])
               : "memory");
  MS_WGMMA_ASM("fence.proxy.tensormap::generic.release.gpu;\n" ::: "memory");
}

__device__ __forceinline__ void map_acquire(const void* map) {
  MS_WGMMA_ASM("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(map) : "memory");
}
// m[j] of quad lane t becomes m[t] of lane j (a 4 x 4 transpose over the lanes of a quad): blocks
// of 2 x 2 swap across lanes t ^ 2, then elements within them across t ^ 1. Every lane of the warp
// takes part (shuffles).
__device__ __forceinline__ void quad_transpose(uint32_t (&m)[4], int t) {
  const bool hi = t & 2, lo = t & 1;
  uint32_t r0 = __shfl_xor_sync(0xffffffffu, hi ? m[0] : m[2], 2);
  uint32_t r1 = __shfl_xor_sync(0xffffffffu, hi ? m[1] : m[3], 2);
  if (hi) m[0] = r0, m[1] = r1;
  else m[2] = r0, m[3] = r1;
  r0 = __shfl_xor_sync(0xffffffffu, lo ? m[0] : m[1], 1);
  r1 = __shfl_xor_sync(0xffffffffu, lo ? m[2] : m[3], 1);
  if (lo) m[0] = r0, m[2] = r1;
  else m[1] = r0, m[3] = r1;
}

template <bool SWIGLU>
__global__ void __launch_bounds__(kThreads, 1)
    grouped_gemm_tma_kernel(const Params p, const MapBytes* __restrict__ w_map, const MapBytes* __restrict__ w2_map,
                            int n_tiles, bool vec_stores) {
  constexpr int kTileN = SWIGLU ? kBN / 2 : kBN;  // output columns a unit
  extern __shared__ __align__(16) uint8_t smem_raw[];
  // The tiles' 1024-byte alignment (the swizzle's): the dynamic base is only 16-byte aligned.
  uint8_t* const smem = smem_raw + ((kAtomBytes - uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes) % kAtomBytes);
  const uint32_t smem_addr = uint32_t(__cvta_generic_to_shared(smem));
  const uint32_t full = smem_addr + kBarrierOffset, empty = full + 8 * kStages;
  const int tid = threadIdx.x, wg = tid / 128;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(full + 8 * s, 129);
      mbar_init(empty + 8 * s, 8);
    }
    MS_WGMMA_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  pdl_wait();  // offsets, tile table, maps and A come from the kernels before
  const int KT = (p.K + kBK - 1) / kBK;
  auto unit_tile = [&](int u, GroupTile& gt) {
    return find_group_tile(p.offsets, p.tile_start, p.experts, kBM, u / n_tiles, gt);
  };

  if (wg == 0) {
    set_max_regs_dec<kProducerRegs>();
    const int chunk = tid % 8, kc = chunk * 8, r0 = tid / 8;
    const uint32_t dst = swizzled_offset(r0, chunk);
    uint32_t q = 0;  // stages filled so far, over all units
    int fenced = -1;  // the expert whose maps thread 0 last fenced
    GroupTile gt;
    for (int u = blockIdx.x; unit_tile(u, gt); u += gridDim.x) {
      const bf16* a_src[kACopies];
#pragma unroll
      for (int i = 0; i < kACopies; ++i) {
        const int gr = gt.m0 + r0 + i * kRowsPass;
        const int64_t src_row = gr < gt.m_end ? (p.a_rows ? __ldg(p.a_rows + gr) : gr) : 0;
        a_src[i] = p.a + src_row * p.a_ld + kc;
      }
      const int n0 = (u % n_tiles) * kTileN;
      const MapBytes* const map = w_map + gt.group;
      const MapBytes* const map2 = SWIGLU ? w2_map + gt.group : nullptr;
      if (tid == 0 && fenced != gt.group) {
        map_acquire(map);
        if (SWIGLU) map_acquire(map2);
        fenced = gt.group;
      }
      for (int kt = 0; kt < KT; ++kt, ++q) {
        const int s = q % kStages;
        if (q >= kStages) mbar_wait(empty + 8 * s, (q / kStages + 1) & 1);  // use q - kStages released
        const uint32_t as = smem_addr + s * kStageBytes, bs = as + kABytes, bar = full + 8 * s;
        const int k = kt * kBK;
        if (tid == 0) {
          expect_bytes(bar, kBBytes);
          if constexpr (SWIGLU) {
            tma_load_2d(bs, map, k, n0, bar);
            tma_load_2d(bs + kBBytes / 2, map2, k, n0, bar);
          } else {
            tma_load_2d(bs, map, k, n0, bar);
          }
        }
        const bool k_ok = k + kc < p.K;
        uint8_t* const a_dst = smem + s * kStageBytes + dst;
        // An invalid copy reads nothing (zero fill); its address stays inside the operand.
#pragma unroll
        for (int i = 0; i < kACopies; ++i) {
          const bool v = gt.m0 + r0 + i * kRowsPass < gt.m_end && k_ok;
          cp_async16(a_dst + i * kRowsPass * kRowBytes, a_src[i] + (v ? k : 0), v);
        }
        mbar_arrive_copies(bar);
      }
    }
    cp_async_commit();
    cp_async_wait<0>();  // leave no copy in flight behind the producer
    return;
  }

  set_max_regs_inc<kConsumerRegs>();
  const int cw = wg - 1, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int warp_row = ((tid % 128) / 32) * 16 + g;  // the thread's rows of its slice: this and + 8
  // Descriptors of stage 0's tiles (this consumer's 64 A rows: 8 atoms in); a stage, and a 16 of
  // K, add (bytes >> 4) to the start-address field (addresses < 256 KiB: no carry out).
  const uint64_t a_desc0 = smem_desc(smem_addr + cw * 64 * kRowBytes);
  const uint64_t b_desc0 = smem_desc(smem_addr + kABytes);
  float acc[kAcc];
  int u = blockIdx.x;
  uint32_t q = 0;  // stage uses so far, as the producer counts them
  GroupTile gt;
  bool have = unit_tile(u, gt);
  while (have) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
    for (int kt = 0; kt < KT; ++kt, ++q) {
      const int s = q % kStages;
      mbar_wait(full + 8 * s, (q / kStages) & 1);
      fence_proxy_async();  // the A copies are generic-proxy writes; wgmma reads through the async proxy
      const uint64_t stage_off = uint64_t(s * kStageBytes) >> 4;
      fence_operands(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk)  // 32 bytes of K = 2 << 4
        wgmma_bf16<kBN>(acc, a_desc0 + stage_off + kk * 2, b_desc0 + stage_off + kk * 2);
      wgmma_commit();
      wgmma_wait<1>();  // the wgmmas of use q - 1 are done: its stage goes back
      fence_operands(acc);
      if (kt > 0 && lane == 0) mbar_arrive(empty + 8 * ((q - 1) % kStages));
    }
    const GroupTile cur = gt;
    const int col0 = u % n_tiles * kTileN;
    u += gridDim.x;
    have = unit_tile(u, gt);  // while the last K tile's wgmmas run
    wgmma_wait<0>();
    fence_operands(acc);
    if (KT > 0 && lane == 0) mbar_arrive(empty + 8 * ((q - 1) % kStages));

    // Thread (g, t) of its warp holds rows g and g + 8 of the warp's 16, columns 8 i + 2 t, + 1.
    constexpr int kGroups = SWIGLU ? kBN / 16 : kBN / 8;  // 8-column groups of the unit's output
    auto value = [&](int i, int h, int e) {
      if constexpr (SWIGLU) {
        const float gate = acc[4 * i + 2 * h + e], up = acc[4 * (i + kBN / 16) + 2 * h + e];
        return silu_mul(gate, up);
      } else {
        return acc[4 * i + 2 * h + e];
      }
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = cur.m0 + cw * 64 + warp_row + h * 8;
      const bool row_ok = r < cur.m_end;
      bf16* crow = p.c + int64_t(r) * p.c_ld;
      if (vec_stores) {
        // Four groups at a time, transposed over the quad: thread t then holds group 4 b + t's 8
        // columns, one 16-byte store (a warp's store covers 64 bytes of each of its 8 rows, where
        // pairs of columns cover 16: half the sectors for the same bytes, a quarter the stores).
#pragma unroll
        for (int b = 0; b < kGroups / 4; ++b) {
          uint32_t m[4];
#pragma unroll
          for (int j = 0; j < 4; ++j) m[j] = pack_bf16(value(4 * b + j, h, 0), value(4 * b + j, h, 1));
          quad_transpose(m, t);
          const int col = col0 + 8 * (4 * b + t);
          if (row_ok && col < p.N) *reinterpret_cast<uint4*>(crow + col) = make_uint4(m[0], m[1], m[2], m[3]);
        }
      } else {
        if (!row_ok) continue;
#pragma unroll
        for (int i = 0; i < kGroups; ++i) {
          const int col = col0 + i * 8 + 2 * t;
          if (col >= p.N) continue;
          store_pair(crow + col, value(i, h, 0), value(i, h, 1), p.pair_stores, col + 1 < p.N);
        }
      }
    }
  }
}

// The host's template for weights [N, K] with row stride ld (elements), boxes of 64 x box_rows,
// 128-byte swizzled; any 16-byte aligned address (each copy gets its expert's). Encoded once a shape.
MapBytes map_template(int64_t N, int64_t K, int64_t ld, int box_rows, const void* address) {
  static std::mutex mutex;
  static std::map<std::tuple<int64_t, int64_t, int64_t, int>, MapBytes> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(N, K, ld, box_rows);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  const uint64_t dims[2] = {uint64_t(K), uint64_t(N)}, strides[1] = {uint64_t(ld) * 2};
  const uint32_t box[2] = {uint32_t(kBK), uint32_t(box_rows)};
  const CUtensorMap map = tiled_bf16_map(address, 2, dims, strides, box, "grouped_gemm");
  MapBytes bytes;
  static_assert(sizeof(map) == sizeof(bytes));
  std::memcpy(&bytes, &map, sizeof(map));
  cache.emplace(key, bytes);
  return bytes;
}

// A device array of one map per expert of w (device array of E weight pointers).
Tensor weight_maps(const bf16* const* w, int E, int64_t N, int64_t K, int64_t ld, int box_rows, const void* address) {
  Tensor maps = scratch(DType::U8, {int64_t(E) * int64_t(sizeof(MapBytes))});
  MS_CHECK(reinterpret_cast<uintptr_t>(maps.raw()) % 64 == 0, "grouped_gemm: tensor maps need 64-byte alignment");
  const MapBytes tmpl = map_template(N, K, ld, box_rows, address);
  launch_pdl(weight_maps_kernel, dim3(unsigned((E + 127) / 128)), dim3(128), 0, tmpl,
             reinterpret_cast<const void* const*>(w), E, static_cast<MapBytes*>(maps.raw()));
  return maps;
}

}  // namespace

void launch_tma_128x256x64(const Params& p, int64_t row_tiles, bool swiglu) {
  const int box_rows = swiglu ? kBN / 2 : kBN;  // weight rows a map's box: the unit's output columns
  const int64_t n_tiles = (p.N + box_rows - 1) / box_rows;
  // Units are ints on the device (the unit past the last one, a block's end, included).
  MS_CHECK((row_tiles + 1) * n_tiles + sm_count() < (int64_t(1) << 31), "grouped_gemm: ", row_tiles, " x ", n_tiles,
           " tiles");
  Tensor maps = weight_maps(p.w, p.experts, p.N, p.K, p.w_ld, box_rows, p.a);
  Tensor maps2 = swiglu ? weight_maps(p.w2, p.experts, p.N, p.K, p.w_ld, box_rows, p.a) : Tensor();
  const auto* m = static_cast<const MapBytes*>(maps.raw());
  const auto* m2 = swiglu ? static_cast<const MapBytes*>(maps2.raw()) : nullptr;
  // Units past the last row tile (row_tiles is a bound) find no tile and end their block.
  const int64_t blocks = std::min<int64_t>(row_tiles * n_tiles, int64_t(sm_count()));
  static PerDeviceOnce once;
  once([] {
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_tma_kernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
    MS_CUDA(cudaFuncSetAttribute(grouped_gemm_tma_kernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 int(kSmemBytes)));
  });
  // Both products store 16-byte groups of 8 columns where every group lies wholly inside or
  // outside N and rows are 16-byte aligned; MOESERVE_GROUPED_TMA_VEC=0 (read at every call) keeps
  // the pairs. Measured (sessions 35, 36): down 14-20 % faster; SwiGLU 3-5 % at 4k-8k tokens once its
  // silu was cheap (with expf and a division the same stores had made it 5-39 % slower).
  const char* env = std::getenv("MOESERVE_GROUPED_TMA_VEC");
  const bool vec = !(env && std::string_view(env) == "0") && p.N % 8 == 0 && p.c_ld % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(p.c) % 16 == 0;
  const dim3 grid{unsigned(blocks)}, block{unsigned(kThreads)};
  if (swiglu) launch_pdl(grouped_gemm_tma_kernel<true>, grid, block, kSmemBytes, p, m, m2, int(n_tiles), vec);
  else launch_pdl(grouped_gemm_tma_kernel<false>, grid, block, kSmemBytes, p, m, m2, int(n_tiles), vec);
}

}  // namespace ms::cuda::grouped_gemm_impl
