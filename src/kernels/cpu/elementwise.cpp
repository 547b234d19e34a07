// Row-wise and element-wise CPU kernels: norms, activations, embedding, cache writes.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms::cpu {
namespace {
float* row_ptr(const Tensor& t, int64_t r) { return t.data<float>() + r * t.strides()[0]; }
}  // namespace

void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  const int64_t T = x.size(0), D = x.size(1);
  MS_CHECK(weight.numel() == D, "rms_norm: weight ", weight.describe(), " for rows of ", D);
  std::vector<float> w(static_cast<size_t>(D));
  decode_weight_row(Weight{weight.view({1, D})}, 0, w.data());
  ThreadPool::global().parallel_for(T, 16, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* xr = row_ptr(x, t);
      float* o = row_ptr(out, t);
      float ss = dot_f32(xr, xr, D);
      float inv = 1.0f / std::sqrt(ss / float(D) + eps);
      for (int64_t i = 0; i < D; ++i) o[i] = xr[i] * inv * w[i];
    }
  });
}

void add_inplace(Tensor& x, const Tensor& y) {
  MS_CHECK(x.shape() == y.shape(), "add: ", x.describe(), " vs ", y.describe());
  const int64_t T = x.size(0), D = x.numel() / std::max<int64_t>(T, 1);
  for (int64_t t = 0; t < T; ++t) axpy_f32(1.0f, row_ptr(y, t), row_ptr(x, t), D);
}

void silu_and_mul(const Tensor& gate_up, Tensor& out) {
  const int64_t T = gate_up.size(0), I = out.size(1);
  MS_CHECK(gate_up.size(1) == 2 * I, "silu_and_mul: ", gate_up.describe(), " -> ", out.describe());
  for (int64_t t = 0; t < T; ++t) {
    const float* g = row_ptr(gate_up, t);
    float* o = row_ptr(out, t);
    for (int64_t i = 0; i < I; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * g[I + i];
  }
}

void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out, const Tensor* earlier) {
  const int64_t V = table.size(0);
  Weight rows{table};
  for (size_t t = 0; t < ids.size(); ++t) {
    int32_t id = ids[t];
    if (id < 0 && earlier) {
      MS_CHECK(-int64_t(id) <= earlier->size(0), "token placeholder ", id, " beyond ", earlier->size(0), " earlier ids");
      id = earlier->data<int32_t>()[-int64_t(id) - 1];
    }
    MS_CHECK(id >= 0 && id < V, "token id ", id, " is out of range for a vocabulary of ", V);
    decode_weight_row(rows, id, row_ptr(out, int64_t(t)));
  }
}

void add_sigmoid_gated(Tensor& x, const Tensor& gate, const Tensor& y) {
  const int64_t T = x.size(0), D = x.size(1);
  for (int64_t t = 0; t < T; ++t) {
    float g = 1.0f / (1.0f + std::exp(-row_ptr(gate, t)[0]));
    axpy_f32(g, row_ptr(y, t), row_ptr(x, t), D);
  }
}

void round_to_bf16(Tensor& x) {
  const int64_t T = x.size(0), D = x.numel() / std::max<int64_t>(T, 1);
  for (int64_t t = 0; t < T; ++t) {
    float* r = row_ptr(x, t);
    for (int64_t i = 0; i < D; ++i) r[i] = round_bf16(r[i]);
  }
}

void gather_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& out) {
  const int64_t W = src.size(1);
  MS_CHECK(out.size(0) == int64_t(rows.size()) && out.size(1) == W, "gather_rows: ", src.describe(), " -> ",
           out.describe());
  for (size_t i = 0; i < rows.size(); ++i) {
    MS_CHECK(rows[i] >= 0 && rows[i] < src.size(0), "gather_rows: row ", rows[i], " of ", src.describe());
    std::memcpy(row_ptr(out, int64_t(i)), row_ptr(src, rows[i]), size_t(W) * 4);
  }
}

void index_add_rows(Tensor& dst, std::span<const int32_t> rows, const Tensor& src) {
  const int64_t W = dst.size(1);
  MS_CHECK(src.size(0) == int64_t(rows.size()) && src.size(1) == W, "index_add_rows: ", src.describe(), " into ",
           dst.describe());
  for (size_t i = 0; i < rows.size(); ++i) {
    MS_CHECK(rows[i] >= 0 && rows[i] < dst.size(0), "index_add_rows: row ", rows[i], " of ", dst.describe());
    axpy_f32(1.0f, row_ptr(src, int64_t(i)), row_ptr(dst, rows[i]), W);
  }
}

void scatter_rows(const Tensor& src, std::span<const int32_t> slots, Tensor& dst) {
  int64_t W = 1;  // elements per row (from the shape: an IDLE batch has no rows)
  for (int d = 1; d < src.dim(); ++d) W *= src.size(d);
  MS_CHECK(int64_t(slots.size()) == src.size(0) && dst.numel() / dst.size(0) == W,
           "scatter_rows: ", src.describe(), " into ", dst.describe());
  MS_CHECK(src.strides()[src.dim() - 1] == 1, "scatter_rows: source rows must be contiguous");
  for (size_t t = 0; t < slots.size(); ++t) {
    MS_CHECK(slots[t] >= 0 && slots[t] < dst.size(0), "KV slot ", slots[t], " outside the pool of ", dst.size(0));
    std::memcpy(row_ptr(dst, slots[t]), row_ptr(src, int64_t(t)), size_t(W) * 4);
  }
}

std::vector<int32_t> argmax_rows(const Tensor& logits) {
  Tensor ids = Tensor::empty(DType::I32, {logits.size(0)});
  argmax_rows_into(logits, ids);
  return {ids.data<int32_t>(), ids.data<int32_t>() + ids.numel()};
}

void argmax_rows_into(const Tensor& logits, Tensor& ids) {
  const int64_t T = logits.size(0), V = logits.size(1);
  for (int64_t t = 0; t < T; ++t) {
    const float* r = row_ptr(logits, t);
    ids.data<int32_t>()[t] = int32_t(std::max_element(r, r + V) - r);
  }
}

namespace {
// The CPU computes a step before its caller goes on: the ids are final when the copy starts.
class CpuReadback final : public ops::HostReadback {
 public:
  explicit CpuReadback(int64_t capacity) : ids_(size_t(capacity)) {}
  void start(const Tensor& ids) override {
    MS_CHECK(ids.numel() <= int64_t(ids_.size()), "readback of ", ids.numel(), " ids, capacity ", ids_.size());
    std::copy_n(ids.data<int32_t>(), ids.numel(), ids_.begin());
    count_ = size_t(ids.numel());
  }
  std::span<const int32_t> wait() override { return {ids_.data(), count_}; }

 private:
  std::vector<int32_t> ids_;
  size_t count_ = 0;
};
}  // namespace

std::unique_ptr<ops::HostReadback> make_host_readback(int64_t capacity) { return std::make_unique<CpuReadback>(capacity); }

void rope(Tensor& x, int offset, int rot_dim, std::span<const int32_t> positions, const Tensor& cos,
          const Tensor& sin, bool interleaved) {
  const int64_t T = x.size(0), H = x.size(1), half = rot_dim / 2;
  MS_CHECK(int64_t(positions.size()) == T && cos.size(1) == half, "rope: ", x.describe(), " with ",
           positions.size(), " positions and a table of ", cos.describe());
  std::vector<float> tmp(static_cast<size_t>(rot_dim));
  for (int64_t t = 0; t < T; ++t) {
    MS_CHECK(positions[t] >= 0 && positions[t] < cos.size(0), "position ", positions[t],
             " is beyond the rope table (max_position_embeddings ", cos.size(0), ")");
    const float* c = cos.data<float>() + positions[t] * half;
    const float* s = sin.data<float>() + positions[t] * half;
    for (int64_t h = 0; h < H; ++h) {
      float* v = x.data<float>() + t * x.strides()[0] + h * x.strides()[1] + offset;
      if (interleaved) {
        // Pairs (2i, 2i+1); the result is written de-interleaved (i, i + half) as the reference
        // does. Queries and keys get the same layout, so their dot products are unchanged.
        for (int64_t i = 0; i < half; ++i) {
          float a = v[2 * i], b = v[2 * i + 1];
          tmp[i] = a * c[i] - b * s[i];
          tmp[i + half] = b * c[i] + a * s[i];
        }
      } else {
        for (int64_t i = 0; i < half; ++i) {
          float a = v[i], b = v[i + half];
          tmp[i] = a * c[i] - b * s[i];
          tmp[i + half] = b * c[i] + a * s[i];
        }
      }
      std::memcpy(v, tmp.data(), size_t(rot_dim) * 4);
    }
  }
}

}  // namespace ms::cpu
