#include "kernels/cuda/moe_grouped.h"

#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace ms::cuda {
namespace {

constexpr int kAlignThreads = 1024;

// One block sorts all pairs (moe_topk.cuh).
__global__ void align_kernel(const int32_t* ids, int pairs, int K, int first, SortedPairs out) {
  extern __shared__ int32_t counts[];
  sort_pairs_by_expert(ids, pairs, K, first, out, counts);
}

// A prefill's pairs (8192 tokens x 8: 65k) sorted by one block took ~56 us on the H200, its
// 1024 threads' shared atomics contending on a few experts' counters, in two serial passes.
// Above kSortBlockPairs pairs the sort runs over many blocks in two kernels instead:
//   count: block b counts its chunk of pairs in shared memory into hist[b][e]; the block that
//          finishes last turns the counts into offsets / active / n_active and each hist[b][e]
//          into block b's first row of expert e (the rows of e before b's chunk, by earlier
//          blocks), then sets the done counter back to 0 (graph replays start from 0);
//   place: block b walks its chunk again, each pair taking the next row of its expert from
//          block b's shared cursors.
// Rows of one expert come in any order, as with one block (sort_pairs_by_expert).
constexpr int kSortBlockPairs = 4096, kSortThreads = 512, kSortMaxBlocks = 128;
__device__ unsigned g_sort_blocks_done = 0;

__device__ __forceinline__ int local_expert(const int32_t* ids, int i, int first, int E) {
  const int e = ids[i] - first;
  return e >= 0 && e < E ? e : -1;
}

__global__ void __launch_bounds__(kSortThreads)
    sort_count_kernel(const int32_t* ids, int pairs, int chunk, int first, SortedPairs out, int32_t* hist) {
  extern __shared__ int32_t counts[];
  const int E = out.experts, nb = int(gridDim.x), b = int(blockIdx.x);
  for (int e = threadIdx.x; e < E; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  const int end = min(pairs, (b + 1) * chunk);
  for (int i = b * chunk + int(threadIdx.x); i < end; i += blockDim.x) {
    const int e = local_expert(ids, i, first, E);
    if (e >= 0) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[b * E + e] = counts[e];
  __shared__ bool last;
  __threadfence();  // this block's counts visible device-wide before it counts as done
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&g_sort_blocks_done, 1u) == unsigned(nb) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Per expert, the blocks' counts become running bases; totals go to counts[] for the scan.
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int run = 0;
#pragma unroll 8
    for (int j = 0; j < nb; ++j) {
      const int c = __ldcg(hist + j * E + e);
      hist[j * E + e] = run;
      run += c;
    }
    counts[e] = run;
  }
  __syncthreads();
  if (threadIdx.x < 32) scan_expert_counts(counts, out, counts, int(threadIdx.x));  // counts become first rows
  __syncthreads();
  for (int i = threadIdx.x; i < nb * E; i += blockDim.x) hist[i] += counts[i % E];
  if (threadIdx.x == 0) g_sort_blocks_done = 0;
}

__global__ void __launch_bounds__(kSortThreads)
    sort_place_kernel(const int32_t* ids, int pairs, int chunk, int K, int first, SortedPairs out, const int32_t* hist) {
  extern __shared__ int32_t cursor[];
  const int E = out.experts, b = int(blockIdx.x);
  for (int e = threadIdx.x; e < E; e += blockDim.x) cursor[e] = hist[b * E + e];
  __syncthreads();
  const int end = min(pairs, (b + 1) * chunk);
  for (int i = b * chunk + int(threadIdx.x); i < end; i += blockDim.x) {
    const int e = local_expert(ids, i, first, E);
    int32_t r = -1;
    if (e >= 0) {
      r = atomicAdd(&cursor[e], 1);
      out.token_of_row[r] = i / K;
    }
    out.row_of[i] = r;
  }
}

// The pointer arrays of one matrix kind, or false when an expert does not fit the kernels.
bool collect(const std::vector<ops::Weight>& ws, int64_t rows, int64_t cols, bool fp8, std::vector<uint64_t>& ptrs,
             std::vector<uint64_t>& scales, int64_t& ld, int64_t& scale_ld, int& bn, int& bk) {
  ld = ws[0].w.strides()[0];
  scale_ld = fp8 ? ws[0].scale_inv.strides()[0] : 0;
  bn = ws[0].block_n, bk = ws[0].block_k;
  for (const auto& w : ws) {
    if (w.out_features() != rows || w.in_features() != cols || w.w.device() != Device::CUDA ||
        w.w.strides()[1] != 1 || w.w.strides()[0] != ld || w.is_fp8() != fp8 ||
        reinterpret_cast<uintptr_t>(w.w.raw()) % 16 != 0)
      return false;
    if (!fp8 && w.w.dtype() != DType::BF16) return false;
    if (fp8 && (w.scale_inv.dtype() != DType::F32 || w.scale_inv.device() != Device::CUDA ||
                w.scale_inv.strides()[0] != scale_ld || w.block_n != bn || w.block_k != bk || !gemv_fp8_block_k(bk)))
      return false;
    ptrs.push_back(reinterpret_cast<uint64_t>(w.w.raw()));
    scales.push_back(fp8 ? reinterpret_cast<uint64_t>(w.scale_inv.raw()) : 0);
  }
  return true;
}

std::unique_ptr<ExpertTable> build_table(const ops::ExpertWeights& ex) {
  auto t = std::make_unique<ExpertTable>();
  t->experts = ex.num_experts();
  t->intermediate = ex.gate[0].out_features(), t->hidden = ex.gate[0].in_features();
  t->fp8 = ex.gate[0].is_fp8();
  std::vector<uint64_t> p[3], s[3];
  int64_t ld[3], sld[3];
  int bn[3], bk[3];
  const std::vector<ops::Weight>* mats[3] = {&ex.gate, &ex.up, &ex.down};
  for (int m = 0; m < 3; ++m) {
    const int64_t rows = m < 2 ? t->intermediate : t->hidden, cols = m < 2 ? t->hidden : t->intermediate;
    if (!collect(*mats[m], rows, cols, t->fp8, p[m], s[m], ld[m], sld[m], bn[m], bk[m])) return nullptr;
  }
  if (ld[0] != ld[1] || sld[0] != sld[1]) return nullptr;
  const int64_t E = t->experts;
  Tensor host = Tensor::empty(DType::I64, {6 * E});
  auto* h = host.data<int64_t>();
  for (int m = 0; m < 3; ++m)
    for (int64_t e = 0; e < E; ++e) h[m * E + e] = int64_t(p[m][e]), h[(3 + m) * E + e] = int64_t(s[m][e]);
  t->pointers = host.to(Device::CUDA);
  t->host_pointers.assign(reinterpret_cast<uint64_t*>(h), reinterpret_cast<uint64_t*>(h) + 6 * E);
  auto* d = reinterpret_cast<const void* const*>(t->pointers.raw());
  auto* ds = reinterpret_cast<const float* const*>(t->pointers.raw());
  t->gate_up.w = d, t->gate_up.w2 = d + E, t->down.w = d + 2 * E;
  if (t->fp8) t->gate_up.s = ds + 3 * E, t->gate_up.s2 = ds + 4 * E, t->down.s = ds + 5 * E;
  t->gate_up.ld = ld[0], t->gate_up.scale_ld = sld[0], t->gate_up.block_n = bn[0], t->gate_up.block_k = bk[0];
  t->down.ld = ld[2], t->down.scale_ld = sld[2], t->down.block_n = bn[2], t->down.block_k = bk[2];
  t->gate_up.fp8 = t->down.fp8 = t->fp8;
  return t;
}

}  // namespace

namespace {

// Whether the table still describes these weights: freed weights' memory can come back at the
// same address for other experts, so every pointer (and the dtype) is compared.
bool matches(const ExpertTable& t, const ops::ExpertWeights& ex) {
  const int64_t E = t.experts;
  if (ex.num_experts() != E || ex.gate[0].is_fp8() != t.fp8 || ex.gate[0].w.dtype() != (t.fp8 ? DType::F8_E4M3 : DType::BF16))
    return false;
  const std::vector<ops::Weight>* mats[3] = {&ex.gate, &ex.up, &ex.down};
  for (int m = 0; m < 3; ++m)
    for (int64_t e = 0; e < E; ++e) {
      const ops::Weight& w = (*mats[m])[size_t(e)];
      if (t.host_pointers[size_t(m * E + e)] != reinterpret_cast<uint64_t>(w.w.raw()) ||
          (t.fp8 && t.host_pointers[size_t((3 + m) * E + e)] != reinterpret_cast<uint64_t>(w.scale_inv.raw())))
        return false;
    }
  return true;
}

}  // namespace

const ExpertTable* expert_table(const ops::ExpertWeights& experts) {
  static std::mutex mu;
  // Keyed by the first expert's address; a copy of ExpertWeights shares the table.
  // A table is never freed: a captured graph keeps reading the device pointer array it was
  // captured with, so a replaced table's memory must not go back to the allocator.
  static std::map<const void*, std::vector<std::unique_ptr<ExpertTable>>> tables;
  if (experts.gate.empty()) return nullptr;
  std::lock_guard<std::mutex> lock(mu);
  auto& slots = tables[experts.gate[0].w.raw()];
  for (const auto& t : slots)
    if (t && matches(*t, experts)) return t.get();
  MS_CHECK(!capturing(), "moe_experts: the expert table must be built before graph capture");
  std::unique_ptr<ExpertTable> built = build_table(experts);
  if (!built) return nullptr;  // these weights cannot use the grouped kernels
  slots.push_back(std::move(built));
  return slots.back().get();
}

namespace {

// The sort a fused routing made along with its ids (keep_routed_pairs), until taken. It holds the
// ids' buffer, so no other tensor can come to the same address meanwhile; `capture` (0 outside
// one) keeps a sort made eagerly from standing in for one inside a graph and the reverse.
struct RoutedPairs {
  Tensor ids;
  int experts = 0;
  unsigned long long capture = 0;
  Permuted perm;
};
thread_local std::optional<RoutedPairs> t_routed;

unsigned long long capture_id() {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  MS_CUDA(cudaStreamGetCaptureInfo(stream(), &status, &id));
  return status == cudaStreamCaptureStatusNone ? 0 : id;
}

}  // namespace

Permuted permuted_scratch(int64_t pairs, int E) {
  Permuted p;
  p.offsets = scratch(DType::I32, {E + 1}), p.active = scratch(DType::I32, {E});
  p.n_active = scratch(DType::I32, {1});
  p.token_of_row = scratch(DType::I32, {pairs}), p.row_of = scratch(DType::I32, {pairs});
  return p;
}

SortedPairs sorted_pairs(const Permuted& p, int E) {
  return SortedPairs{p.offsets.data<int32_t>(), p.active.data<int32_t>(), p.n_active.data<int32_t>(),
                     p.token_of_row.data<int32_t>(), p.row_of.data<int32_t>(), E};
}

void keep_routed_pairs(const Tensor& ids, int experts, Permuted perm) {
  t_routed = RoutedPairs{ids, experts, capture_id(), std::move(perm)};
}

void drop_routed_pairs() { t_routed.reset(); }

Permuted permute_on_device(const Tensor& ids, int first, int E) {
  if (t_routed && first == 0 && t_routed->experts == E && t_routed->ids.raw() == ids.raw() &&
      t_routed->ids.shape() == ids.shape() && t_routed->capture == capture_id()) {
    Permuted p = std::move(t_routed->perm);
    t_routed.reset();
    return p;
  }
  const int64_t pairs = ids.numel();
  Permuted p = permuted_scratch(pairs, E);
  const size_t smem = sort_pairs_smem(E);
  MS_CHECK(smem <= 48 * 1024, "moe: ", E, " local experts exceed the sort kernel's shared memory");
  const int K = int(ids.size(1));
  if (pairs <= kSortBlockPairs) {
    align_kernel<<<1, kAlignThreads, smem, stream()>>>(ids.data<int32_t>(), int(pairs), K, first, sorted_pairs(p, E));
    MS_CUDA_LAUNCHED("align_kernel");
    return p;
  }
  const int blocks = int(std::min<int64_t>(kSortMaxBlocks, (pairs + kSortBlockPairs / 2 - 1) / (kSortBlockPairs / 2)));
  const int chunk = int((pairs + blocks - 1) / blocks);
  Tensor hist = scratch(DType::I32, {int64_t(blocks) * E});
  sort_count_kernel<<<blocks, kSortThreads, E * sizeof(int32_t), stream()>>>(ids.data<int32_t>(), int(pairs), chunk,
                                                                            first, sorted_pairs(p, E),
                                                                            hist.data<int32_t>());
  MS_CUDA_LAUNCHED("sort_count_kernel");
  sort_place_kernel<<<blocks, kSortThreads, E * sizeof(int32_t), stream()>>>(ids.data<int32_t>(), int(pairs), chunk, K,
                                                                            first, sorted_pairs(p, E),
                                                                            hist.data<int32_t>());
  MS_CUDA_LAUNCHED("sort_place_kernel");
  return p;
}

}  // namespace ms::cuda
