// Shared-memory mbarriers, tensor copies and setmaxnreg for the warp-specialized kernels (flash_prefill_wgmma_ws.cu,
// flash_mla_expanded_wgmma_ws.cu, grouped_gemm_tma.cu): a producer warpgroup hands stages of copies
// to consumer warpgroups and takes them back. sm_90a only, as the wgmma
// instructions (MS_WGMMA_ASM): a build for another GPU keeps the names, and traps.
#pragma once
#include "kernels/cuda/wgmma.cuh"

namespace ms::cuda::wg {

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  MS_WGMMA_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  MS_WGMMA_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival when all of this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void mbar_arrive_copies(uint32_t bar) {
  MS_WGMMA_ASM("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
  MS_WGMMA_ASM(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// The copy engine's tensor copies (maps from tensor_map.h): the arrival that announces `bytes`
// to come on bar, and the box of `map` at coordinates (x, y[, z]) into shared memory at dst,
// completing its bytes on bar.
__device__ __forceinline__ void expect_bytes(uint32_t bar, uint32_t bytes) {
  MS_WGMMA_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// The same announcement without an arrival, for a barrier whose arrivals come from other threads too.
__device__ __forceinline__ void expect_bytes_only(uint32_t bar, uint32_t bytes) {
  MS_WGMMA_ASM("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int x, int y, uint32_t bar) {
  MS_WGMMA_ASM(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void* map, int x, int y, int z, uint32_t bar) {
  MS_WGMMA_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(z), "r"(bar)
      : "memory");
}

// Registers a thread of the warpgroup may use from here on: the producer gives some up, the
// consumers take them (the launch's per-thread count x threads is the budget).
template <int REGS>
__device__ __forceinline__ void set_max_regs_dec() {
  MS_WGMMA_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void set_max_regs_inc() {
  MS_WGMMA_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

}  // namespace ms::cuda::wg
