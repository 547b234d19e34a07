// The MLA absorptions (cuda::mla_absorb_q, cuda::mla_expand_v) at decode sizes, where
// mla_absorb.cu's streaming kernels run them, against the CPU ops: V2-Lite's 16 heads and V3's 128
// (nope 128, v 128, kv_lora_rank 512), q_nope a slice of q [T, H, nope + rope], a BF16 kv_b and an
// FP8 one (through its kept BF16 copy). 1 token must run the streaming kernels and 3, 8, 9 and
// 12 cuBLASLt, as must an FP8 kv_b with keeping off and MOESERVE_MLA_STREAM=0 (each checked by the
// kernel names a capture of the call holds). In a replayed CUDA graph each op follows an RMSNorm
// that writes its input (both launched early): the result must be that of the norm's output of
// the same replay. A decode step's split merge expanding the latent itself must give the bits
// of the merge and the expansion apart. CudaMlaAbsorb.Bench (MOESERVE_BENCH_MLA=1) times both
// ops, streaming and cuBLASLt, at 1 token, replayed from graphs, over weights far larger than L2.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_absorb.h"

namespace ms {
namespace {
using namespace test;

constexpr int kNope = 128, kRope = 64, kV = 128, kL = 512;
constexpr double kBf16Tol = 1e-2;

// Largest element error over the largest reference element (the L2 error of rel_error could
// hide a few wrong elements among thousands).
double max_error(const Tensor& got, const Tensor& ref) {
  const auto g = got.to_vector(), r = ref.to_vector();
  double err = 0, top = 1e-30;
  for (size_t i = 0; i < r.size(); ++i) {
    err = std::max(err, std::isfinite(g[i]) ? std::fabs(double(g[i]) - r[i]) : 1e30);
    top = std::max(top, std::fabs(double(r[i])));
  }
  return err / top;
}

// Kernel nodes of a capture of `body` whose function name contains `name`.
template <class F>
int kernels_named(const char* name, F body) {
  return count_captured(body, [&](cudaGraphNode_t node) {
    cudaGraphNodeType type;
    cudaKernelNodeParams p{};
    const char* fn = nullptr;
    // cuBLASLt's kernels may not be the runtime's functions: no name, not ours.
    if (cudaGraphNodeGetType(node, &type) != cudaSuccess || type != cudaGraphNodeTypeKernel ||
        cudaGraphKernelNodeGetParams(node, &p) != cudaSuccess || cudaFuncGetName(&fn, p.func) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return int(std::string(fn).find(name) != std::string::npos);
  });
}

struct KvB {
  ops::Weight cpu, gpu;
};
KvB make_kv_b(int H, bool fp8) {
  if (fp8) {
    Fp8Weight f = random_fp8(int64_t(H) * (kNope + kV), kL, 0.01f);
    return {f.cpu, f.gpu};
  }
  Tensor w = randn({int64_t(H) * (kNope + kV), kL}, 0.05f);
  KvB k;
  k.cpu.w = host_as(w, DType::BF16), k.gpu.w = gpu(w);
  return k;
}

// Both ops at T tokens against the CPU; whether each ran its streaming kernel.
void check_both(const KvB& kv_b, int H, int64_t T, bool streamed, const std::string& what) {
  Tensor q = randn({T, H, kNope + kRope}), lat = randn({T, H, kL});
  Tensor ql_ref = Tensor::empty(DType::F32, {T, H, kL}), o_ref = Tensor::empty(DType::F32, {T, H, kV});
  cpu::mla_absorb_q(q.slice(2, 0, kNope), kv_b.cpu, kNope, kV, ql_ref);
  cpu::mla_expand_v(lat, kv_b.cpu, kNope, kV, o_ref);
  const Tensor qg = gpu(q).slice(2, 0, kNope), lg = gpu(lat);
  Tensor ql = poisoned(DType::BF16, {T, H, kL}), o = poisoned(DType::BF16, {T, H, kV});
  cuda::mla_absorb_q(qg, kv_b.gpu, kNope, kV, ql);
  cuda::mla_expand_v(lg, kv_b.gpu, kNope, kV, o);
  EXPECT_LT(max_error(ql, ql_ref), kBf16Tol) << "absorb " << what;
  EXPECT_LT(max_error(o, o_ref), kBf16Tol) << "expand " << what;
  EXPECT_EQ(kernels_named("mla_absorb_kernel", [&] { cuda::mla_absorb_q(qg, kv_b.gpu, kNope, kV, ql); }),
            streamed ? 1 : 0)
      << "absorb " << what;
  EXPECT_EQ(kernels_named("mla_expand_kernel", [&] { cuda::mla_expand_v(lg, kv_b.gpu, kNope, kV, o); }),
            streamed ? 1 : 0)
      << "expand " << what;
}

TEST(CudaMlaAbsorb, MatchesCpuAndStreamsOneToken) {
  MS_REQUIRE_CUDA();
  ASSERT_TRUE(cuda::mla_streaming()) << "run without MOESERVE_MLA_STREAM=0";
  for (int H : {16, 128})
    for (bool fp8 : {false, true}) {
      const KvB kv_b = make_kv_b(H, fp8);
      for (int64_t T : {1, 3, 8, 9, 12})
        check_both(kv_b, H, T, T <= cuda::kMlaStreamMaxTokens,
                   "H=" + std::to_string(H) + " fp8=" + std::to_string(fp8) + " T=" + std::to_string(T));
    }
}

TEST(CudaMlaAbsorb, CublasTakesWhatTheKernelsDoNot) {
  MS_REQUIRE_CUDA();
  const KvB fp8 = make_kv_b(16, true), bf16 = make_kv_b(16, false);
  cuda::set_keep_bf16(false);  // dequantised into scratch by a kernel just before: not read early
  check_both(fp8, 16, 1, false, "fp8, keeping off");
  cuda::set_keep_bf16(true);
  cuda::set_mla_streaming(false);
  check_both(bf16, 16, 1, false, "streaming off");
  cuda::set_mla_streaming(true);
}

// norm(src_q) -> q, absorb(q) and norm(src_lat) -> lat, expand(lat), captured once and replayed
// with new sources and poisoned outputs: each op must read its norm's output of that replay.
TEST(CudaMlaAbsorb, ReplayedAfterTheKernelThatWritesItsInput) {
  MS_REQUIRE_CUDA();
  for (int H : {16, 128})
    for (int64_t T : {1, 3, 8}) {
      const KvB kv_b = make_kv_b(H, false);
      const Tensor nw = gpu(randn({kNope + kRope}, 0.5f)), lw = gpu(randn({kL}, 0.5f));
      Tensor src_q = gpu(randn({T * H, kNope + kRope})), src_lat = gpu(randn({T * H, kL}));
      Tensor q = poisoned(DType::BF16, {T, H, kNope + kRope}), lat = poisoned(DType::BF16, {T, H, kL});
      Tensor ql = poisoned(DType::BF16, {T, H, kL}), o = poisoned(DType::BF16, {T, H, kV});
      auto step = [&] {
        Tensor q2 = q.view({T * H, kNope + kRope}), lat2 = lat.view({T * H, kL});
        cuda::rms_norm(src_q, nw, 1e-6f, q2);
        cuda::mla_absorb_q(q.slice(2, 0, kNope), kv_b.gpu, kNope, kV, ql);
        cuda::rms_norm(src_lat, lw, 1e-6f, lat2);
        cuda::mla_expand_v(lat, kv_b.gpu, kNope, kV, o);
      };
      step();
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(cuda::stream(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
      step();
      ASSERT_EQ(cudaStreamEndCapture(cuda::stream(), &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      for (int replay = 0; replay < 3; ++replay) {
        src_q.copy_from(gpu(randn({T * H, kNope + kRope})));
        src_lat.copy_from(gpu(randn({T * H, kL})));
        ql.copy_from(poisoned(DType::BF16, {T, H, kL}));
        o.copy_from(poisoned(DType::BF16, {T, H, kV}));
        ASSERT_EQ(cudaGraphLaunch(exec, cuda::stream()), cudaSuccess);
        ASSERT_EQ(cudaStreamSynchronize(cuda::stream()), cudaSuccess);
        const Tensor qh = q.to_f32(), lh = lat.to_f32();
        Tensor ql_ref = Tensor::empty(DType::F32, {T, H, kL}), o_ref = Tensor::empty(DType::F32, {T, H, kV});
        cpu::mla_absorb_q(qh.slice(2, 0, kNope), kv_b.cpu, kNope, kV, ql_ref);
        cpu::mla_expand_v(lh, kv_b.cpu, kNope, kV, o_ref);
        const std::string what = "H=" + std::to_string(H) + " T=" + std::to_string(T) + " replay " +
                                 std::to_string(replay);
        EXPECT_LT(max_error(ql, ql_ref), kBf16Tol) << "absorb " << what;
        EXPECT_LT(max_error(o, o_ref), kBf16Tol) << "expand " << what;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
}

// A decode step's MLA attention and expansion (cuda::mla_attention_expand) with the split merge
// expanding the latent itself (mla_merge_expand_kernel) against the merge kernel and
// mla_expand_v after it (set_mla_merge_expand(false)): the same bits, eager at one split (no
// merge), up to 16 (merge_few) and more (merge_many), and replayed from captured steps whose queries
// see other key counts than they were captured at. Three queries take the two ops as before. Both
// against the CPU's composition.
struct MergeExpandCase {
  int H;
  int64_t T;
  int keys;
};

void expect_same_bits(const MergeExpandCase& c, bool captured) {
  const int64_t pool = 3 * 8192, T = c.T;
  Tensor cache = randn({pool, kL + kRope}), cg = gpu(cache);
  const KvB kv_b = make_kv_b(c.H, false);
  const Tensor ql = randn({T, c.H, kL}, 0.3f), qfull = randn({T, c.H, kNope + kRope});
  const Tensor qlg = gpu(ql), qrg = gpu(qfull).slice(2, kNope, kNope + kRope);
  Tensor latent = poisoned(DType::BF16, {T, c.H, kL});
  Tensor fused = poisoned(DType::BF16, {T, c.H, kV}), apart = poisoned(DType::BF16, {T, c.H, kV});
  std::vector<std::pair<int, int>> seqs;
  for (int64_t i = 0; i < T; ++i) seqs.push_back({1, std::max(1, c.keys - int(i) * 100)});
  const auto layout = make_layout(seqs, int(pool));
  auto call = [&](bool merge_expand, const ops::AttentionLayout& at, Tensor& out) {
    cuda::set_mla_merge_expand(merge_expand);
    cuda::mla_attention_expand(qlg, qrg, cg, at, 0.06f, kv_b.gpu, kNope, kV, latent, out);
    cuda::set_mla_merge_expand(true);
  };
  const std::string what = "H=" + std::to_string(c.H) + " T=" + std::to_string(T) + " keys=" + std::to_string(c.keys);
  auto against_cpu = [&](const ops::AttentionLayout& at, const Tensor& got, const std::string& where) {
    Tensor lat_ref = Tensor::empty(DType::F32, {T, c.H, kL}), ref = Tensor::empty(DType::F32, {T, c.H, kV});
    cpu::mla_attention_expand(ql, qfull.slice(2, kNope, kNope + kRope), cache, at, 0.06f, kv_b.cpu, kNope, kV,
                              lat_ref, ref);
    EXPECT_LT(max_error(got, ref), kBf16Tol) << where;
  };
  if (!captured) {
    call(false, layout, apart);
    const Tensor unwritten = poisoned(DType::BF16, {T, c.H, kL});
    latent.copy_from(unwritten);
    call(true, layout, fused);
    EXPECT_EQ(bit_mismatches(fused, apart), 0) << what;
    against_cpu(layout, fused, what);
    // The one kernel never writes the latent. (A capture cannot count kernels here: the host
    // layout's upload may allocate pinned memory, which a capture forbids.)
    const bool merges = T <= cuda::kMlaStreamMaxTokens && c.keys > 64;  // more than one split
    EXPECT_EQ(bit_mismatches(latent, unwritten) == 0, merges) << what;
    return;
  }
  const std::vector<int32_t> ids(size_t(T), 0);
  const auto at_capture = make_layout(std::vector<std::pair<int, int>>(size_t(T), {1, c.keys}), int(pool));
  auto graph_pool = ops::make_graph_pool(Device::CUDA);
  auto capture = [&](bool merge_expand, Tensor& out) {
    auto body = [&, merge_expand] { call(merge_expand, at_capture, out); };
    body();  // eagerly first, as the runner does
    return ops::capture_step(Device::CUDA, ops::StepArrays{ids, ids, ids, &at_capture}, T * c.keys, c.keys,
                             *graph_pool, body);
  };
  auto g_apart = capture(false, apart), g_fused = capture(true, fused);
  for (const int len : {c.keys, c.keys / 3, 50}) {
    const auto at = make_layout(std::vector<std::pair<int, int>>(size_t(T), {1, len}), int(pool));
    const ops::StepArrays arrays{ids, ids, ids, &at};
    fused.copy_from(poisoned(DType::BF16, {T, c.H, kV}));
    g_apart->replay(arrays), g_fused->replay(arrays);
    const std::string where = what + " captured, replayed at " + std::to_string(len);
    EXPECT_EQ(bit_mismatches(fused, apart), 0) << where;
    against_cpu(at, fused, where);
  }
}

TEST(CudaMlaAbsorb, MergeAndExpansionInOneKernelGiveTheSameBits) {
  MS_REQUIRE_CUDA();
  // 16 heads (flash_mla.cu): 1, 5, 16, 64 and 128 splits; 128 (the wgmma kernel on a Hopper): 1,
  // 3, 8, 32 and 64.
  for (const int H : {16, 128})
    for (const int keys : {40, 300, 1000, 4096, 8192}) expect_same_bits({H, 1, keys}, false);
  expect_same_bits({16, 3, 4096}, false);
  for (const int H : {16, 128})
    for (const int keys : {1000, 4096}) expect_same_bits({H, 1, keys}, true);
}

// Microseconds a call of each op, streaming and cuBLASLt, replayed from graphs of 20 calls, each
// call reading its own copy of kv_b (copies for 150 MB, far past the H200's 50 MB of L2, as a
// decode step's next layer reads other weights). MB: the half of kv_b a call reads.
TEST(CudaMlaAbsorb, Bench) {
  MS_REQUIRE_CUDA();
  const char* env = std::getenv("MOESERVE_BENCH_MLA");
  if (!env || std::string(env) != "1") GTEST_SKIP() << "set MOESERVE_BENCH_MLA=1 to time the absorptions";
  for (int H : {16, 128}) {
    const int64_t rows = int64_t(H) * (kNope + kV), bytes = rows * kL * 2;
    std::vector<ops::Weight> copies(size_t((150'000'000 + bytes - 1) / bytes));
    for (auto& w : copies) {
      w.w = Tensor::empty(DType::BF16, {rows, kL}, Device::CUDA);
      ASSERT_EQ(cudaMemsetAsync(w.w.raw(), 0x3c, size_t(bytes), cuda::stream()), cudaSuccess);
    }
    for (int64_t T : {int64_t(1)}) {  // 8 tokens: see kMlaStreamMaxTokens
      const Tensor q = gpu(randn({T, H, kNope + kRope})), lat = gpu(randn({T, H, kL}));
      Tensor ql = Tensor::empty(DType::BF16, {T, H, kL}, Device::CUDA);
      Tensor o = Tensor::empty(DType::BF16, {T, H, kV}, Device::CUDA);
      for (bool stream : {true, false}) {
        cuda::set_mla_streaming(stream);
        size_t next = 0;
        const double absorb = graphed_us(T, [&] {
          cuda::mla_absorb_q(q.slice(2, 0, kNope), copies[next++ % copies.size()], kNope, kV, ql);
        });
        const double expand = graphed_us(T, [&] {
          cuda::mla_expand_v(lat, copies[next++ % copies.size()], kNope, kV, o);
        });
        const double mb = double(bytes) / 2e6;  // MB a microsecond: TB/s
        std::printf("[bench] mla %3d heads T=%ld %-9s absorb %6.2f us (%4.2f TB/s)  expand %6.2f us (%4.2f TB/s), "
                    "%.1f MB each\n",
                    H, long(T), stream ? "streaming" : "cublaslt", absorb, mb / absorb, expand, mb / expand, mb);
        std::fflush(stdout);
      }
      cuda::set_mla_streaming(true);
    }
  }
}

}  // namespace
}  // namespace ms
