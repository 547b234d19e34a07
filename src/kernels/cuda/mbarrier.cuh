// Shared-memory mbarriers and setmaxnreg for the warp-specialized kernels (flash_prefill_wgmma_ws.cu,
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
