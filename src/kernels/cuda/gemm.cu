#include "kernels/cuda/gemm.h"

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

namespace ms::cuda {
namespace {

cudaDataType_t lt_type(DType d) {
  switch (d) {
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    default: fail("matmul: unsupported output dtype ", dtype_name(d));
  }
}

// Largest power of two (up to 256) dividing the address and every stride in bytes: cuBLASLt
// only picks algorithms whose alignment needs the operands meet.
uint32_t alignment(const void* p, int64_t ld, int64_t batch_stride, size_t elem) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | uint64_t(ld * int64_t(elem)) |
                  uint64_t(batch_stride * int64_t(elem)) | 256u;
  return uint32_t(bits & (~bits + 1));
}

struct LtLayout {
  cublasLtMatrixLayout_t h = nullptr;
  LtLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int batch, int64_t batch_stride) {
    MS_CUBLAS(cublasLtMatrixLayoutCreate(&h, type, uint64_t(rows), uint64_t(cols), ld));
    if (batch > 1) {
      int32_t count = batch;
      MS_CUBLAS(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
      MS_CUBLAS(cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &batch_stride,
                                                 sizeof batch_stride));
    }
  }
  ~LtLayout() { cublasLtMatrixLayoutDestroy(h); }
};

struct LtDesc {
  cublasLtMatmulDesc_t h = nullptr;
  LtDesc(bool ta, bool tb) {
    MS_CUBLAS(cublasLtMatmulDescCreate(&h, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    MS_CUBLAS(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSA, &a, sizeof a));
    MS_CUBLAS(cublasLtMatmulDescSetAttribute(h, CUBLASLT_MATMUL_DESC_TRANSB, &b, sizeof b));
  }
  ~LtDesc() { cublasLtMatmulDescDestroy(h); }
};

struct LtPref {
  cublasLtMatmulPreference_t h = nullptr;
  LtPref(size_t workspace, uint32_t al_a, uint32_t al_b, uint32_t al_d) {
    MS_CUBLAS(cublasLtMatmulPreferenceCreate(&h));
    MS_CUBLAS(cublasLtMatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                   sizeof workspace));
    MS_CUBLAS(cublasLtMatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    MS_CUBLAS(cublasLtMatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    MS_CUBLAS(cublasLtMatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d));
    MS_CUBLAS(cublasLtMatmulPreferenceSetAttribute(h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d));
  }
  ~LtPref() { cublasLtMatmulPreferenceDestroy(h); }
};

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

// The heuristic's first choice per problem, remembered (decode steps repeat their shapes);
// an empty optional marks a problem no cuBLASLt algorithm takes.
using PlanKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int,
                           int, int, uint32_t, uint32_t, uint32_t>;
std::mutex g_plan_mu;
std::map<PlanKey, std::pair<bool, cublasLtMatmulAlgo_t>> g_plans;

// The cuBLASLt algorithm for a problem, asked of the heuristic once per key; `first` is false
// when it has none (or a call later refused the one it offered).
template <class Key>
std::pair<bool, cublasLtMatmulAlgo_t> cached_plan(std::map<Key, std::pair<bool, cublasLtMatmulAlgo_t>>& plans,
                                                  const Key& key, const LtDesc& desc, const LtLayout& la,
                                                  const LtLayout& lb, const LtLayout& ld, uint32_t al_a,
                                                  uint32_t al_b, uint32_t al_d) {
  std::lock_guard<std::mutex> lock(g_plan_mu);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  LtPref pref(kWorkspaceBytes, al_a, al_b, al_d);
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_handle(), desc.h, la.h, lb.h, ld.h, ld.h, pref.h, 1, &result, &found);
  const std::pair<bool, cublasLtMatmulAlgo_t> plan{st == CUBLAS_STATUS_SUCCESS && found > 0, result.algo};
  plans.emplace(key, plan);
  return plan;
}

// Reference product for layouts cuBLASLt refuses: one thread per output element.
template <class TD>
__global__ void naive_matmul(int64_t m, int64_t n, int64_t k, const bf16* a, int64_t lda, int64_t sa, bool ta,
                             const bf16* b, int64_t ldb, int64_t sb, bool tb, TD* d, int64_t ldd, int64_t sd, int batch) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= m * n * batch) return;
  int64_t i = idx % m, j = (idx / m) % n, bi = idx / (m * n);
  const bf16* ab = a + bi * sa;
  const bf16* bb = b + bi * sb;
  float acc = 0.f;
  for (int64_t l = 0; l < k; ++l) {
    float av = __bfloat162float(ta ? ab[l + i * lda] : ab[i + l * lda]);
    float bv = __bfloat162float(tb ? bb[j + l * ldb] : bb[l + j * ldb]);
    acc += av * bv;
  }
  store_f(d + bi * sd + i + j * ldd, acc);
}

void naive(int64_t m, int64_t n, int64_t k, const MatRef& a, const MatRef& b, void* d, DType dt, int64_t ldd,
           int64_t sd, int batch) {
  const int threads = 256;
  unsigned grid = blocks_for(m * n * batch, threads);
  auto* pa = static_cast<const bf16*>(a.ptr);
  auto* pb = static_cast<const bf16*>(b.ptr);
  MS_FLOAT_DISPATCH(dt, TD,
                    naive_matmul<TD><<<grid, threads, 0, stream()>>>(m, n, k, pa, a.ld, a.batch_stride, a.trans, pb, b.ld,
                                                                     b.batch_stride, b.trans, static_cast<TD*>(d), ldd,
                                                                     sd, batch));
  MS_CUDA_LAUNCHED("naive_matmul");
}

}  // namespace

void matmul(int64_t m, int64_t n, int64_t k, const MatRef& a, const MatRef& b, void* d, DType d_dtype, int64_t ldd,
            int64_t d_batch_stride, int batch) {
  if (m == 0 || n == 0 || batch == 0) return;
  MS_CHECK(k > 0, "matmul: empty reduction");
  const uint32_t al_a = alignment(a.ptr, a.ld, a.batch_stride, 2), al_b = alignment(b.ptr, b.ld, b.batch_stride, 2),
                 al_d = alignment(d, ldd, d_batch_stride, dtype_size(d_dtype));
  LtDesc desc(a.trans, b.trans);
  LtLayout la(CUDA_R_16BF, a.trans ? k : m, a.trans ? m : k, a.ld, batch, a.batch_stride);
  LtLayout lb(CUDA_R_16BF, b.trans ? n : k, b.trans ? k : n, b.ld, batch, b.batch_stride);
  LtLayout ld(lt_type(d_dtype), m, n, ldd, batch, d_batch_stride);
  PlanKey key{m, n, k, a.ld, b.ld, ldd, a.batch_stride, b.batch_stride, d_batch_stride, batch, int(a.trans),
              int(b.trans), int(d_dtype), al_a, al_b, al_d};
  const std::pair<bool, cublasLtMatmulAlgo_t> plan = cached_plan(g_plans, key, desc, la, lb, ld, al_a, al_b, al_d);
  if (!plan.first) return naive(m, n, k, a, b, d, d_dtype, ldd, d_batch_stride, batch);
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasLtMatmul(lt_handle(), desc.h, &alpha, a.ptr, la.h, b.ptr, lb.h, &beta, d, ld.h, d, ld.h,
                                     &plan.second, lt_workspace(kWorkspaceBytes), kWorkspaceBytes, stream());
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    // The heuristic offered an algorithm the call then refused for this layout: remember
    // that, and compute this problem with the plain kernel from now on.
    std::lock_guard<std::mutex> lock(g_plan_mu);
    g_plans[key].first = false;
    return naive(m, n, k, a, b, d, d_dtype, ldd, d_batch_stride, batch);
  }
  MS_CUBLAS(st);
}

namespace {

using Fp8Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, uint32_t, uint32_t, uint32_t>;
std::map<Fp8Key, std::pair<bool, cublasLtMatmulAlgo_t>> g_fp8_plans;

void set_scale(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t mode_attr, int32_t mode,
               cublasLtMatmulDescAttributes_t ptr_attr, const float* ptr) {
  MS_CUBLAS(cublasLtMatmulDescSetAttribute(desc, mode_attr, &mode, sizeof mode));
  MS_CUBLAS(cublasLtMatmulDescSetAttribute(desc, ptr_attr, &ptr, sizeof ptr));
}

}  // namespace

bool matmul_fp8_blocks(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, const float* a_scales,
                       const void* b, const float* b_scales, void* d, DType d_dtype, int64_t ldd) {
  MS_ASSERT(k % 512 == 0 && n % 4 == 0);
  const uint32_t al_a = alignment(a, lda, 0, 1), al_b = alignment(b, k, 0, 1),
                 al_d = alignment(d, ldd, 0, dtype_size(d_dtype));
  LtDesc desc(true, false);
  set_scale(desc.h, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
            CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scales);
  set_scale(desc.h, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F,
            CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scales);
  LtLayout la(CUDA_R_8F_E4M3, k, m, lda, 1, 0), lb(CUDA_R_8F_E4M3, k, n, k, 1, 0);
  LtLayout ld(lt_type(d_dtype), m, n, ldd, 1, 0);
  const Fp8Key key{m, n, k, lda, ldd, int(d_dtype), al_a, al_b, al_d};
  const std::pair<bool, cublasLtMatmulAlgo_t> plan = cached_plan(g_fp8_plans, key, desc, la, lb, ld, al_a, al_b, al_d);
  if (!plan.first) return false;
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasLtMatmul(lt_handle(), desc.h, &alpha, a, la.h, b, lb.h, &beta, d, ld.h, d, ld.h,
                                     &plan.second, lt_workspace(kWorkspaceBytes), kWorkspaceBytes, stream());
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || st == CUBLAS_STATUS_INVALID_VALUE) {
    std::lock_guard<std::mutex> lock(g_plan_mu);
    g_fp8_plans[key].first = false;
    return false;
  }
  MS_CUBLAS(st);
  return true;
}

namespace {

// dst[r, c] = bf16(value of the stored weight), fp8 times its block's scale_inv.
template <class TS>
__global__ void weight_to_bf16(const TS* src, int64_t src_ld, const float* scales, int64_t scale_ld, int bn, int bk,
                               int64_t rows, int64_t cols, bf16* dst) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * cols) return;
  int64_t r = idx / cols, c = idx % cols;
  float v;
  if constexpr (std::is_same_v<TS, uint8_t>) {
    v = fp8_to_f(src[r * src_ld + c]) * scales[(r / bn) * scale_ld + c / bk];
  } else if constexpr (std::is_same_v<TS, __half>) {
    v = __half2float(src[r * src_ld + c]);
  } else {
    v = load_f(src + r * src_ld + c);
  }
  dst[idx] = __float2bfloat16_rn(v);
}

// The same for FP8 blocks, 16 weights a thread: one 16-byte load, two 16-byte stores, one scale
// (16 | block_k, so the 16 share a block). The scalar kernel above moved a byte a thread and ran
// at ~0.6 TB/s of its 3 bytes a weight; a DeepSeek-V3 prefill dequantises every FP8 weight of a
// layer (1.6 GB an EP8 shard's layer) this way, which made it half of the layer's time.
__global__ void fp8_to_bf16_x16(const uint4* __restrict__ src, int64_t src_ld16, const float* __restrict__ scales,
                                int64_t scale_ld, int bn, int bk, int64_t rows, int64_t cols16, uint4* __restrict__ dst) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * cols16) return;
  const int64_t r = idx / cols16, c16 = idx % cols16;
  const uint4 q = __ldg(src + r * src_ld16 + c16);
  const float s = __ldg(scales + (r / bn) * scale_ld + c16 * 16 / bk);
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // e4m3 pairs to half (exact), to f32, times the scale, to bf16 once
      const __half2_raw pair = __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t(words[i] >> (16 * h)), __NV_E4M3);
      const float2 f = __half22float2(__half2(pair));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
      out[2 * i + h] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
  dst[2 * idx] = make_uint4(out[0], out[1], out[2], out[3]);
  dst[2 * idx + 1] = make_uint4(out[4], out[5], out[6], out[7]);
}

}  // namespace

Tensor weight_bf16(const ops::Weight& w) {
  const Tensor& t = w.w;
  MS_CHECK(t.device() == Device::CUDA && t.dim() == 2 && t.strides()[1] == 1, "linear: weight ", t.describe(),
           " must be a CUDA matrix with contiguous rows");
  if (t.dtype() == DType::BF16) return t;
  const int64_t rows = t.size(0), cols = t.size(1), ld = t.strides()[0];
  Tensor out = scratch(DType::BF16, {rows, cols});
  const int threads = 256;
  unsigned grid = blocks_for(rows * cols, threads);
  auto* dst = out.data<bf16>();
  switch (t.dtype()) {
    case DType::F8_E4M3: {
      check_device_tensor(w.scale_inv, {DType::F32}, "linear", "weight_scale_inv");
      if (cols % 16 == 0 && ld % 16 == 0 && w.block_k % 16 == 0 && reinterpret_cast<uintptr_t>(t.raw()) % 16 == 0) {
        const int64_t n16 = rows * (cols / 16);
        fp8_to_bf16_x16<<<blocks_for(n16, threads), threads, 0, stream()>>>(
            static_cast<const uint4*>(t.raw()), ld / 16, w.scale_inv.data<float>(), w.scale_inv.strides()[0],
            w.block_n, w.block_k, rows, cols / 16, static_cast<uint4*>(out.raw()));
        MS_CUDA_LAUNCHED("fp8_to_bf16_x16");
        return out;
      }
      weight_to_bf16<uint8_t><<<grid, threads, 0, stream()>>>(t.data<uint8_t>(), ld, w.scale_inv.data<float>(),
                                                              w.scale_inv.strides()[0], w.block_n, w.block_k, rows,
                                                              cols, dst);
      break;
    }
    case DType::F16:
      weight_to_bf16<__half><<<grid, threads, 0, stream()>>>(t.data<__half>(), ld, nullptr, 0, 1, 1, rows, cols, dst);
      break;
    case DType::F32:
      weight_to_bf16<float><<<grid, threads, 0, stream()>>>(t.data<float>(), ld, nullptr, 0, 1, 1, rows, cols, dst);
      break;
    default: fail("linear: unsupported weight dtype ", dtype_name(t.dtype()));
  }
  MS_CUDA_LAUNCHED("weight_to_bf16");
  return out;
}

namespace {

struct KeptCopy {
  ops::Weight source;  // held, with its scales: their memory stays theirs while the copy is used for them
  Tensor bf16;
};

std::atomic<bool>& keep_flag() {
  static std::atomic<bool> on{[] {
    const char* env = std::getenv("MOESERVE_KEEP_BF16");
    return !env || std::string(env) != "0";
  }()};
  return on;
}

// Kept copies by the weight's address (unique across GPUs); never freed. Guarded by kept_mu().
std::map<const void*, std::vector<KeptCopy>>& kept() {
  static auto* copies = new std::map<const void*, std::vector<KeptCopy>>();  // buffers may outlive static destruction
  return *copies;
}
std::mutex& kept_mu() {
  static std::mutex mu;
  return mu;
}

// The copy made for this very view of an FP8 weight (the same address may be viewed with
// another shape or other scales), or null. kept_mu() held.
const Tensor* find_kept(const ops::Weight& w) {
  auto it = kept().find(w.w.raw());
  if (it == kept().end()) return nullptr;
  for (const KeptCopy& k : it->second) {
    const ops::Weight& s = k.source;
    if (s.w.dtype() == w.w.dtype() && s.w.shape() == w.w.shape() && s.w.strides() == w.w.strides() &&
        s.scale_inv.raw() == w.scale_inv.raw() && s.scale_inv.shape() == w.scale_inv.shape() &&
        s.scale_inv.strides() == w.scale_inv.strides() && s.block_n == w.block_n && s.block_k == w.block_k)
      return &k.bf16;
  }
  return nullptr;
}

}  // namespace

void set_keep_bf16(bool on) { keep_flag().store(on); }
bool keep_bf16() { return keep_flag().load(); }

Tensor weight_bf16_kept(const ops::Weight& w) {
  if (!w.is_fp8() || !keep_bf16()) return weight_bf16(w);
  check_device_tensor(w.scale_inv, {DType::F32}, "linear", "weight_scale_inv");
  std::lock_guard<std::mutex> lock(kept_mu());
  if (const Tensor* copy = find_kept(w)) return *copy;
  MS_CHECK(!capturing(), "weight_bf16_kept: the BF16 copy of the FP8 weight ", w.w.describe(),
           " is first needed inside a graph capture, which cannot fill it: run the step eagerly once first");
  // From the shared cache (no capture pool is set outside a capture), held from now on.
  Tensor copy = weight_bf16(w);
  kept()[w.w.raw()].push_back({w, copy});
  return copy;
}

Tensor weight_bf16_if_kept(const ops::Weight& w) {
  if (w.is_fp8() && w.scale_inv.defined() && keep_bf16()) {
    std::lock_guard<std::mutex> lock(kept_mu());
    if (const Tensor* copy = find_kept(w)) return *copy;
  }
  return weight_bf16(w);
}

Tensor rows_bf16(const Tensor& x) {
  MS_CHECK(x.device() == Device::CUDA && x.dim() == 2 && x.strides()[1] == 1, "matmul input ", x.describe(),
           " must be CUDA rows with contiguous elements");
  if (x.dtype() == DType::BF16) return x;
  check_dtype(x, {DType::F32}, "matmul input");
  Tensor out = scratch(DType::BF16, x.shape());
  const int threads = 256;
  weight_to_bf16<float><<<blocks_for(x.numel(), threads), threads, 0, stream()>>>(
      x.data<float>(), x.strides()[0], nullptr, 0, 1, 1, x.size(0), x.size(1), out.data<bf16>());
  MS_CUDA_LAUNCHED("weight_to_bf16");
  return out;
}

void gemm_xwT(const Tensor& x, const Tensor& w, void* out, DType out_dtype, int64_t os) {
  const int64_t T = x.size(0), K = x.size(1), N = w.size(0);
  MS_ASSERT(x.dtype() == DType::BF16 && w.dtype() == DType::BF16 && w.size(1) == K);
  matmul(N, T, K, MatRef{w.raw(), w.strides()[0], 0, true}, MatRef{x.raw(), x.strides()[0], 0, false}, out, out_dtype,
         os);
}

}  // namespace ms::cuda
