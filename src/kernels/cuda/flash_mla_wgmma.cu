// Absorbed MLA decode on Hopper warpgroup MMAs (flash_prefill.h's MlaLaunch contract, sm_90a):
// a block takes 64 heads of one query, which are the M = 64 rows of wgmma, and one split of its
// keys, so every key tile is read once for 64 heads (flash_mla.cu's mma.sync kernel: 16 heads a
// block, 4 warps an SM, ~83 TFLOP/s on an H200; DeepSeek-V3's 128 heads reread each key 8 times).
//
// Per 64-key tile (a key's latent cache row: 512 latent + 64 rope bf16, the first 512 also its
// value), gathered by slot with cp.async into 128-byte-swizzled column blocks of 64 dims:
//   S = Q K^T   36 m64n64k16, A = Q (shared, 9 column blocks, copied once), B = K K-major.
//   softmax     flash_softmax_probs on the accumulators (mma.sync's C layout); keys past the
//               split's end are masked like a causal diagonal.
//   O += P V    per warpgroup 8 m64n128k16 with P from registers (flash_p_fragment) and V, the
//               tile's first 512 dims, N-major through the transpose bit.
// O is 64 x 512 f32: 256 accumulators a thread for one warpgroup, so two warpgroups own 256
// output dims each, and both compute the whole S. The duplicated score product makes the MMA
// work 2 x 576 + 512 products a (head, key) instead of 576 + 512, but keeps each warpgroup's P
// in its registers and the warpgroups independent between two barriers a tile: splitting S
// (each warpgroup 32 of the keys) needs the row maxima and P exchanged through shared memory
// every tile, in the 10 KB that Q (72 KB) and two 72 KB stages leave.
//
// Two stages: tile t + 1 is in flight while tile t computes, and tile t + 2 goes into tile t's
// stage once both warpgroups have waited for its P V. Ordering as flash_prefill_wgmma.cu: wait
// for the copies, fence.proxy.async, __syncthreads; wgmma.fence before wgmmas whose registers
// normal code wrote; commit and wait before reading S or touching O.
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "kernels/cuda/flash_prefill.h"
#include "kernels/cuda/flash_softmax.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda {
namespace {

using namespace wg;

constexpr int kL = 512, kR = 64, kDk = kL + kR, kHeads = 64, kKeys = 64, kThreads = 256;
constexpr int kBlocks = kDk / 64;                  // column blocks of 64 dims: 8 latent + 1 rope
constexpr int kColBytes = kKeys * kRowBytes;       // one column block of 64 rows (heads or keys): 8 KB
constexpr int kTileBytes = kBlocks * kColBytes;    // 72 KB: Q, or one stage of keys
constexpr int kStages = 2;
constexpr int kDvWg = kL / 2;                      // output dims a warpgroup owns
constexpr size_t kSmemBytes = size_t(1 + kStages) * kTileBytes + kAtomBytes;  // + alignment slack
static_assert(kSmemBytes <= 227 * 1024, "shared memory of one block an SM");
static_assert(kHeads == kKeys, "Q and key tiles share one column-block size");

__global__ void __launch_bounds__(kThreads, 1) flash_mla_wgmma_kernel(const MlaLaunch p) {
  extern __shared__ __align__(16) uint8_t smem_raw[];
  pdl_trigger();  // the merge after this may launch: it waits for these partials
  // [Q: 9 column blocks of 64 heads][stage s: 9 column blocks of 64 keys], 1024-aligned.
  const uint32_t misalign = uint32_t(__cvta_generic_to_shared(smem_raw)) % kAtomBytes;
  uint8_t* const smem = smem_raw + (kAtomBytes - misalign) % kAtomBytes;
  const uint32_t q_addr = uint32_t(__cvta_generic_to_shared(smem)), kv_addr = q_addr + kTileBytes;
  const int t = blockIdx.x, h0 = blockIdx.y * kHeads;
  const int kv0 = p.kv_begin[t], visible = p.visible[t];
  const int len = p.split_len > 0 ? p.split_len : ((visible + p.splits - 1) / p.splits + kKeys - 1) / kKeys * kKeys;
  const int kb = min(visible, int(blockIdx.z) * len), keys = min(visible, kb + len);  // this block's keys [kb, keys)
  const int ntiles = (keys - kb + kKeys - 1) / kKeys;
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32, g = lane / 4, qd = lane % 4;

  // This thread's copies: chunk cc (16 bytes) of rows cr and cr + 32 in each column block; both
  // rows share one swizzle phase.
  const int cc = tid % 8, cr = tid / 8;
  const uint32_t swz = swizzled_offset(cr, cc);
  int slot[2];  // of the two rows this thread copies next; -1 past the block's keys (zeros)
  auto fetch_slots = [&](int i) {
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int key = kb + i * kKeys + cr + 32 * n;
      slot[n] = key < keys ? p.slots[kv0 + key] : -1;
    }
  };
  auto issue = [&](int stage) {
    uint8_t* dst = smem + (1 + stage) * kTileBytes + swz;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const bf16* src = p.kv + (slot[n] >= 0 ? int64_t(slot[n]) * p.kv_s0 : 0) + cc * 8;
#pragma unroll
      for (int b = 0; b < kBlocks; ++b) cp_async16(dst + b * kColBytes + n * 32 * kRowBytes, src + 64 * b, slot[n] >= 0);
    }
  };
  // The first slots are the step's metadata, on the device before any kernel of the step ran:
  // read before the wait for the kernel before this one (launch_pdl), which wrote the query and
  // the new keys.
  fetch_slots(0);
  pdl_wait();
#pragma unroll
  for (int n = 0; n < 2; ++n) {  // Q joins tile 0's group
    const int h = h0 + cr + 32 * n;
    const bf16* ql = p.ql + int64_t(t) * p.ql_s0 + int64_t(h) * p.ql_s1 + cc * 8;
    uint8_t* dst = smem + swz + n * 32 * kRowBytes;
#pragma unroll
    for (int b = 0; b < kBlocks - 1; ++b) cp_async16(dst + b * kColBytes, ql + 64 * b, true);
    cp_async16(dst + (kBlocks - 1) * kColBytes, p.qr + int64_t(t) * p.qr_s0 + int64_t(h) * p.qr_s1 + cc * 8, true);
  }
#pragma unroll
  for (int i = 0; i < kStages; ++i) {
    if (i < ntiles) issue(i), fetch_slots(i + 1);
    cp_async_commit();
  }

  float o[kDvWg / 8][4] = {};  // columns 8 n + 2 qd, + 1 of the warpgroup's dims; rows g, g + 8
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
  float s[kKeys / 8][4];  // each tile's first wgmma overwrites it
  float(&s_acc)[kKeys / 2] = reinterpret_cast<float(&)[kKeys / 2]>(s);
  uint32_t pa[kKeys / 16][4];
  const float scale_log2 = p.scale * float(M_LOG2E);
  const int seen[2] = {keys, keys};
  for (int i = 0; i < ntiles; ++i) {
    const int stage = i % kStages, k0 = kb + i * kKeys;
    cp_async_wait<kStages - 1>();  // tile i (and Q) landed; tile i + 1 may still be in flight
    fence_proxy_async();
    __syncthreads();
    const uint32_t k_addr = kv_addr + stage * kTileBytes;
    fence_operands(s_acc);  // the last tile's softmax is done with S
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      const uint32_t off = (kk / 4) * kColBytes + (kk % 4) * 32;  // 16 dims are 32 bytes on
      wgmma_bf16_n64(s_acc, smem_desc(q_addr + off), smem_desc(k_addr + off), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s_acc);
    flash_softmax_probs<kKeys>(s, k0 + kKeys > keys, k0, seen, scale_log2, lane, m, l, alpha);
    flash_rescale<kDvWg>(o, alpha);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) flash_p_fragment<kKeys>(s, kk, pa[kk]);
    // Keys [16 kk, +16) start 16 rows (2048 bytes) on; this warpgroup's dims start at column
    // block 4 wg, and the next 128 of them two column blocks on. O and P are written before the
    // wgmma.fence, which orders them before P V reads them.
#pragma unroll
    for (int j = 0; j < 2; ++j) fence_operands(reinterpret_cast<float(&)[64]>(o[16 * j]));
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wgmma_bf16_rs_nmajor128(reinterpret_cast<float(&)[64]>(o[16 * j]), pa[kk],
                                smem_desc_nmajor(k_addr + (4 * wg + 2 * j) * kColBytes + kk * 16 * kRowBytes, kColBytes));
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < 2; ++j) fence_operands(reinterpret_cast<float(&)[64]>(o[16 * j]));
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) fence_operands(pa[kk]);
    __syncthreads();  // both warpgroups are done with this stage
    if (i + kStages < ntiles) issue(stage), fetch_slots(i + kStages + 1);
    cp_async_commit();
  }
  cp_async_wait<0>();  // only empty groups remain; leave none behind

  // Rows g and g + 8 of this warp's 16 heads; a row's sums are spread over its quad.
  const int row[2] = {(tid % 128) / 32 * 16 + g, (tid % 128) / 32 * 16 + g + 8};
  if (p.splits == 1)
    return flash_store_rows<kDvWg>(o, l, row, kHeads, [&](int r) {
      return p.out + int64_t(t) * p.o_s0 + int64_t(h0 + row[r]) * p.o_s1 + wg * kDvWg + 2 * qd;
    });
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int64_t prow = (int64_t(blockIdx.z) * p.T + t) * p.H + h0 + row[r];
    float* dst = p.part_acc + prow * kL + wg * kDvWg + 2 * qd;
#pragma unroll
    for (int n = 0; n < kDvWg / 8; ++n) *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
    if (wg == 0 && qd == 0)  // an empty split reports m = -inf, l = 0 and zeros
      p.part_ml[2 * prow] = m[r] * float(M_LN2), p.part_ml[2 * prow + 1] = l[r];
  }
}

}  // namespace

bool use_flash_mla_wgmma(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const Tensor& out) {
  const char* env = std::getenv("MOESERVE_MLA_DECODE_WGMMA");
  if (!hopper() || (env && std::string_view(env) == "0")) return false;
  // Queries come by 16-byte cp.async too, where flash_mla.cu reads them a word at a time.
  auto rows16 = [](const Tensor& q) {
    return reinterpret_cast<uintptr_t>(q.raw()) % 16 == 0 && q.strides()[0] % 8 == 0 && q.strides()[1] % 8 == 0;
  };
  return flash_mla_supported(q_latent, q_rope, kv_cache, out) && q_latent.size(1) % kHeads == 0 && rows16(q_latent) &&
         rows16(q_rope);
}

void flash_mla_wgmma(const MlaLaunch& l) {
  static PerDeviceOnce smem_limit;
  smem_limit([] {
    MS_CUDA(cudaFuncSetAttribute(flash_mla_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
  });
  dim3 grid(unsigned(l.T), unsigned(l.H / kHeads), unsigned(l.splits));
  launch_pdl(flash_mla_wgmma_kernel, grid, dim3(kThreads), kSmemBytes, l);
  MS_CUDA_LAUNCHED("flash_mla_wgmma_kernel");
}

// One resident block a multiprocessor (217 KB of shared memory), rounded down so that the launch
// is one wave; at least 128 keys (two tiles) a split: a split's partial, 128 KB of f32 for 64
// heads, is written and merged, and should not outweigh the 147 KB of keys it reads.
int flash_mla_wgmma_decode_splits(int64_t T, int64_t H, int max_visible) {
  const int64_t blocks = T * (H / kHeads), want = sm_count();
  return int(std::max<int64_t>(1, std::min<int64_t>(want / blocks, (max_visible + 127) / 128)));
}

}  // namespace ms::cuda
