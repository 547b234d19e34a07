// Row-wise and element-wise kernels: residual adds, SiLU-and-mul, embedding, row gathers and
// KV-cache scatters (RMSNorm: norm.cu; rope: rope.cu). Rows may be strided (a column slice, a
// [T, H, D] view) exactly as the CPU ops allow: row r starts at r * strides[0], and the rest of
// the row is contiguous. Arithmetic is f32; the result is rounded once into the output dtype.
// Rows that allow it take 16-byte accesses (residual adds, SiLU-and-mul).
#include <algorithm>

#include "kernels/cuda/cuda_common.h"
#include "kernels/cuda/cuda_ops.h"

namespace ms::cuda {
namespace {

struct Rows {
  int64_t n, width, stride;
};

// A tensor seen as rows: [size(0), numel / size(0)] with row stride strides[0]; the elements
// inside a row must be laid out contiguously.
Rows rows_of(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.device() == Device::CUDA, op, ": ", what, " must be a CUDA tensor");
  MS_CHECK(t.dim() >= 1, op, ": ", what, " is a scalar");
  int64_t expect = 1;
  for (int d = t.dim() - 1; d >= 1; --d) {
    MS_CHECK(t.size(d) == 1 || t.strides()[d] == expect, op, ": ", what, " ", t.describe(),
             " must have contiguous rows");
    expect *= t.size(d);
  }
  return {t.size(0), expect, t.strides()[0]};  // the width holds with no rows too (an IDLE batch)
}

// x += y for bf16 rows whose width is a multiple of 8 and whose rows are 16-byte aligned.
__global__ void add_bf16x8_kernel(bf16* x, int64_t xs, const bf16* y, int64_t ys, int64_t T, int64_t D8) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * D8) return;
  int64_t t = idx / D8, i = idx % D8;
  uint4* xp = reinterpret_cast<uint4*>(x + t * xs) + i;
  const uint4 a = *xp, b = reinterpret_cast<const uint4*>(y + t * ys)[i];
  const uint32_t wa[4] = {a.x, a.y, a.z, a.w}, wb[4] = {b.x, b.y, b.z, b.w};
  uint32_t res[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 fa = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wa[j]));
    const float2 fb = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&wb[j]));
    const __nv_bfloat162 r = __floats2bfloat162_rn(fa.x + fb.x, fa.y + fb.y);
    res[j] = *reinterpret_cast<const uint32_t*>(&r);
  }
  *xp = make_uint4(res[0], res[1], res[2], res[3]);
}

template <class TX, class TY>
__global__ void add_kernel(TX* x, int64_t xs, const TY* y, int64_t ys, int64_t T, int64_t D) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * D) return;
  int64_t t = idx / D, i = idx % D;
  store_f(x + t * xs + i, load_f(x + t * xs + i) + load_f(y + t * ys + i));
}

template <class TI, class TO>
__global__ void silu_mul_kernel(const TI* gu, int64_t gs, int64_t T, int64_t I, TO* out, int64_t os) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * I) return;
  int64_t t = idx / I, i = idx % I;
  float g = load_f(gu + t * gs + i), u = load_f(gu + t * gs + I + i);
  store_f(out + t * os + i, g / (1.0f + expf(-g)) * u);
}

// The same, eight elements a thread through 16-byte accesses (I8 = I / 8; rows 16-byte aligned):
// the kernel only moves bytes, and one-element accesses left it at a third of the bandwidth.
template <class TI, class TO>
__global__ void silu_mul_x8_kernel(const TI* gu, int64_t gs, int64_t T, int64_t I8, TO* out, int64_t os) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * I8) return;
  const int64_t t = idx / I8, i = (idx % I8) * 8;
  float g[8], u[8];
  load8(gu + t * gs + i, g);
  load8(gu + t * gs + I8 * 8 + i, u);
#pragma unroll
  for (int j = 0; j < 8; ++j) g[j] = g[j] / (1.0f + expf(-g[j])) * u[j];
  store8(out + t * os + i, g);
}

template <class TT, class TO>
__global__ void embedding_kernel(const TT* table, int64_t ts, const int32_t* ids, const int32_t* earlier, int64_t T,
                                 int64_t H, TO* out, int64_t os) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * H) return;
  int64_t t = idx / H, i = idx % H;
  int32_t id = ids[t];
  if (id < 0) id = earlier[-int64_t(id) - 1];  // a device argmax wrote it: inside the vocabulary
  store_f(out + t * os + i, load_f(table + int64_t(id) * ts + i));
}

template <class T>
__global__ void sigmoid_gated_kernel(T* x, int64_t xs, const T* gate, int64_t gs, const T* y, int64_t ys, int64_t N,
                                     int64_t D) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= N * D) return;
  int64_t t = idx / D, i = idx % D;
  float g = 1.0f / (1.0f + expf(-load_f(gate + t * gs)));
  store_f(x + t * xs + i, load_f(x + t * xs + i) + g * load_f(y + t * ys + i));
}

__global__ void round_bf16_kernel(float* x, int64_t xs, int64_t T, int64_t D) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= T * D) return;
  float* p = x + (idx / D) * xs + idx % D;
  *p = __bfloat162float(__float2bfloat16_rn(*p));
}

// dst row dst_rows[r] (or r) = src row src_rows[r] (or r), element type E moved bit for bit.
template <class E>
__global__ void copy_rows_kernel(const E* src, int64_t ss, const int32_t* src_rows, E* dst, int64_t ds,
                                 const int32_t* dst_rows, int64_t n, int64_t W) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= n * W) return;
  int64_t r = idx / W, i = idx % W;
  int64_t sr = src_rows ? src_rows[r] : r, dr = dst_rows ? dst_rows[r] : r;
  dst[dr * ds + i] = src[sr * ss + i];
}

void copy_rows(const Tensor& src, Rows s, const int32_t* src_rows, Tensor& dst, Rows d, const int32_t* dst_rows,
               int64_t n, int64_t W) {
  MS_CHECK(src.dtype() == dst.dtype(), "row copy: ", src.describe(), " into ", dst.describe());
  if (n == 0 || W == 0) return;
  const int threads = 256;
  unsigned grid = blocks_for(n * W, threads);
  switch (dtype_size(src.dtype())) {
    case 2:
      copy_rows_kernel<uint16_t><<<grid, threads, 0, stream()>>>(src.data<uint16_t>(), s.stride, src_rows,
                                                                 dst.data<uint16_t>(), d.stride, dst_rows, n, W);
      break;
    case 4:
      copy_rows_kernel<uint32_t><<<grid, threads, 0, stream()>>>(src.data<uint32_t>(), s.stride, src_rows,
                                                                 dst.data<uint32_t>(), d.stride, dst_rows, n, W);
      break;
    default: fail("row copy: unsupported dtype ", dtype_name(src.dtype()));
  }
  MS_CUDA_LAUNCHED("copy_rows_kernel");
}

// dst[rows_of_group[g]] += src[srcs[offsets[g]]] + ... + src[srcs[offsets[g + 1] - 1]], one rounding.
template <class TD, class TS>
__global__ void index_add_kernel(TD* dst, int64_t ds, const TS* src, int64_t ss, const int32_t* group_row,
                                 const int32_t* offsets, const int32_t* srcs, int64_t groups, int64_t W) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= groups * W) return;
  int64_t g = idx / W, i = idx % W;
  TD* d = dst + int64_t(group_row[g]) * ds + i;
  float acc = load_f(d);
  for (int32_t k = offsets[g]; k < offsets[g + 1]; ++k) acc += load_f(src + int64_t(srcs[k]) * ss + i);
  store_f(d, acc);
}

void check_indices(std::span<const int32_t> idx, int64_t limit, const char* what) {
  for (int32_t i : idx) MS_CHECK(i >= 0 && i < limit, what, " ", i, " outside 0..", limit - 1);
}

constexpr int kThreads = 256;

// Whether rows starting at `p`, `stride` elements of 2 bytes apart, are all 16-byte aligned.
bool wide(const void* p, int64_t stride) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && stride % 8 == 0; }

// dst[w] = src[w] for the words w of ranges a then b.
__global__ void copy_ranges_kernel(const uint32_t* src, uint32_t* dst, WordRange a, WordRange b) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < a.n + b.n; i += stride) {
    const int64_t w = i < a.n ? a.at + i : b.at + (i - a.n);
    dst[w] = src[w];
  }
}

}  // namespace

void copy_word_ranges(const void* src, void* dst, WordRange a, WordRange b) {
  if (a.n + b.n == 0) return;
  const int threads = 256;
  const unsigned blocks = std::min<unsigned>(blocks_for(a.n + b.n, threads), 4 * sm_count());
  copy_ranges_kernel<<<blocks, threads, 0, stream()>>>(static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst),
                                                       a, b);
  MS_CUDA_LAUNCHED("copy_ranges_kernel");
}

void copy_words(const void* src, void* dst, int64_t words) { copy_word_ranges(src, dst, {0, words}, {words, 0}); }

void add_inplace(Tensor& x, const Tensor& y) {
  MS_CHECK(x.shape() == y.shape(), "add: ", x.describe(), " vs ", y.describe());
  Rows xr = rows_of(x, "add", "x"), yr = rows_of(y, "add", "y");
  if (x.numel() == 0) return;
  if (x.dtype() == DType::BF16 && y.dtype() == DType::BF16 && xr.width % 8 == 0 && wide(x.raw(), xr.stride) &&
      wide(y.raw(), yr.stride)) {
    const int64_t n = xr.n * (xr.width / 8);
    add_bf16x8_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(x.data<bf16>(), xr.stride, y.data<bf16>(),
                                                                         yr.stride, xr.n, xr.width / 8);
    MS_CUDA_LAUNCHED("add_bf16x8_kernel");
    return;
  }
  MS_FLOAT_DISPATCH(x.dtype(), TX, MS_FLOAT_DISPATCH(y.dtype(), TY,
    add_kernel<TX, TY><<<blocks_for(x.numel(), kThreads), kThreads, 0, stream()>>>(
        x.data<TX>(), xr.stride, y.data<TY>(), yr.stride, xr.n, xr.width)));
  MS_CUDA_LAUNCHED("add_kernel");
}

void silu_and_mul(const Tensor& gate_up, Tensor& out) {
  Rows g = rows_of(gate_up, "silu_and_mul", "gate_up"), o = rows_of(out, "silu_and_mul", "output");
  MS_CHECK(g.width == 2 * o.width && g.n == o.n, "silu_and_mul: ", gate_up.describe(), " -> ", out.describe());
  if (o.n * o.width == 0) return;
  if (o.width % 8 == 0 && aligned16(gate_up.raw(), g.stride * dtype_size(gate_up.dtype())) &&
      aligned16(out.raw(), o.stride * dtype_size(out.dtype()))) {
    const int64_t n = o.n * (o.width / 8);
    MS_FLOAT_DISPATCH(gate_up.dtype(), TI, MS_FLOAT_DISPATCH(out.dtype(), TO,
      silu_mul_x8_kernel<TI, TO><<<blocks_for(n, kThreads), kThreads, 0, stream()>>>(
          gate_up.data<TI>(), g.stride, o.n, o.width / 8, out.data<TO>(), o.stride)));
    MS_CUDA_LAUNCHED("silu_mul_x8_kernel");
    return;
  }
  MS_FLOAT_DISPATCH(gate_up.dtype(), TI, MS_FLOAT_DISPATCH(out.dtype(), TO,
    silu_mul_kernel<TI, TO><<<blocks_for(o.n * o.width, kThreads), kThreads, 0, stream()>>>(
        gate_up.data<TI>(), g.stride, o.n, o.width, out.data<TO>(), o.stride)));
  MS_CUDA_LAUNCHED("silu_mul_kernel");
}

void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out, const Tensor* earlier) {
  Rows t = rows_of(table, "embedding", "table"), o = rows_of(out, "embedding", "output");
  MS_CHECK(o.n == int64_t(ids.size()) && o.width == t.width, "embedding: ", ids.size(), " ids from ",
           table.describe(), " into ", out.describe());
  const int64_t placeholders = earlier ? earlier->size(0) : 0;
  for (int32_t id : ids)
    MS_CHECK(id < t.n && id >= -placeholders, "token id ", id, " is out of range for a vocabulary of ", t.n);
  if (ids.empty()) return;
  Tensor dev_ids = upload_i32(ids);
  MS_FLOAT_DISPATCH(table.dtype(), TT, MS_FLOAT_DISPATCH(out.dtype(), TO,
    embedding_kernel<TT, TO><<<blocks_for(o.n * o.width, kThreads), kThreads, 0, stream()>>>(
        table.data<TT>(), t.stride, dev_ids.data<int32_t>(), earlier ? earlier->data<int32_t>() : nullptr, o.n,
        o.width, out.data<TO>(), o.stride)));
  MS_CUDA_LAUNCHED("embedding_kernel");
}

void add_sigmoid_gated(Tensor& x, const Tensor& gate, const Tensor& y) {
  Rows xr = rows_of(x, "add_sigmoid_gated", "x"), g = rows_of(gate, "add_sigmoid_gated", "gate"),
       yr = rows_of(y, "add_sigmoid_gated", "y");
  MS_CHECK(g.n == xr.n && g.width == 1 && yr.n == xr.n && yr.width == xr.width && x.dtype() == gate.dtype() &&
               x.dtype() == y.dtype(),
           "add_sigmoid_gated: ", x.describe(), " ", gate.describe(), " ", y.describe());
  if (x.numel() == 0) return;
  MS_FLOAT_DISPATCH(x.dtype(), T,
    sigmoid_gated_kernel<T><<<blocks_for(x.numel(), kThreads), kThreads, 0, stream()>>>(
        x.data<T>(), xr.stride, gate.data<T>(), g.stride, y.data<T>(), yr.stride, xr.n, xr.width));
  MS_CUDA_LAUNCHED("sigmoid_gated_kernel");
}

void round_to_bf16(Tensor& x) {
  Rows r = rows_of(x, "round_to_bf16", "x");
  if (x.dtype() == DType::BF16 || x.numel() == 0) return;  // bf16 storage is already rounded
  check_device_tensor(x, {DType::F32}, "round_to_bf16", "x");
  round_bf16_kernel<<<blocks_for(x.numel(), kThreads), kThreads, 0, stream()>>>(x.data<float>(), r.stride, r.n,
                                                                                r.width);
  MS_CUDA_LAUNCHED("round_bf16_kernel");
}

void gather_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& out) {
  Rows s = rows_of(src, "gather_rows", "source"), o = rows_of(out, "gather_rows", "output");
  MS_CHECK(o.n == int64_t(rows.size()) && o.width == s.width, "gather_rows: ", src.describe(), " -> ",
           out.describe());
  check_indices(rows, s.n, "gather_rows: row");
  if (rows.empty()) return;
  Tensor idx = upload_i32(rows);
  copy_rows(src, s, idx.data<int32_t>(), out, o, nullptr, o.n, o.width);
}

// Sources are grouped by destination row on the host (keeping their order, as the CPU op adds
// them), so every destination element is read, summed in f32 and written by one thread.
void index_add_rows(Tensor& dst, std::span<const int32_t> rows, const Tensor& src) {
  Rows d = rows_of(dst, "index_add_rows", "destination"), s = rows_of(src, "index_add_rows", "source");
  MS_CHECK(s.n == int64_t(rows.size()) && s.width == d.width, "index_add_rows: ", src.describe(), " into ",
           dst.describe());
  check_indices(rows, d.n, "index_add_rows: row");
  if (rows.empty() || d.width == 0) return;
  std::vector<int32_t> order(rows.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return rows[a] < rows[b]; });
  std::vector<int32_t> group_row, offsets;
  for (size_t k = 0; k < order.size(); ++k)
    if (k == 0 || rows[order[k]] != rows[order[k - 1]]) group_row.push_back(rows[order[k]]), offsets.push_back(int32_t(k));
  offsets.push_back(int32_t(order.size()));
  Tensor g_row = upload_i32(group_row), g_off = upload_i32(offsets), g_src = upload_i32(order);
  const int64_t groups = int64_t(group_row.size());
  MS_FLOAT_DISPATCH(dst.dtype(), TD, MS_FLOAT_DISPATCH(src.dtype(), TS,
    index_add_kernel<TD, TS><<<blocks_for(groups * d.width, kThreads), kThreads, 0, stream()>>>(
        dst.data<TD>(), d.stride, src.data<TS>(), s.stride, g_row.data<int32_t>(), g_off.data<int32_t>(),
        g_src.data<int32_t>(), groups, d.width)));
  MS_CUDA_LAUNCHED("index_add_kernel");
}

void scatter_rows(const Tensor& src, std::span<const int32_t> slots, Tensor& dst) {
  Rows s = rows_of(src, "scatter_rows", "source"), d = rows_of(dst, "scatter_rows", "cache");
  MS_CHECK(int64_t(slots.size()) == s.n && d.width == s.width, "scatter_rows: ", src.describe(), " into ",
           dst.describe());
  check_indices(slots, d.n, "KV slot");
  if (slots.empty()) return;
  Tensor idx = upload_i32(slots);
  copy_rows(src, s, nullptr, dst, d, idx.data<int32_t>(), s.n, s.width);
}

}  // namespace ms::cuda
