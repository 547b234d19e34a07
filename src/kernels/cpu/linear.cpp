// Dense linear layers on the CPU. The weight stays in its stored dtype (bf16, fp8 blocks):
// each thread decodes a few rows into f32 scratch and reuses them for every token, so a
// decode step streams the weight once and a prefill amortises the decode over the batch.
#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms::cpu {

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out, ops::Overlap) {  // in order
  const int64_t T = x.size(0), K = x.size(1), N = w.out_features();
  MS_CHECK(w.in_features() == K, "linear: input has ", K, " features, weight ", w.w.describe());
  MS_CHECK(out.size(0) == T && out.size(1) == N, "linear: output ", out.describe(), " for ", T, "x", N);
  MS_CHECK(x.strides()[1] == 1 && out.strides()[1] == 1 && w.w.strides()[1] == 1, "linear: rows must be contiguous");
  const int64_t xs = x.strides()[0], os = out.strides()[0];
  const float* xp = x.data<float>();
  float* op = out.data<float>();
  const float* bp = bias ? bias->data<float>() : nullptr;
  MS_CHECK(!bias || bias->dtype() == DType::F32, "linear: bias must be F32");
  constexpr int64_t kRows = 4;  // weight rows decoded together
  ThreadPool::global().parallel_for((N + kRows - 1) / kRows, std::max<int64_t>(1, 4096 / std::max<int64_t>(K, 1)),
                                    [&](int64_t b, int64_t e) {
    std::vector<float> rows(static_cast<size_t>(kRows * K));
    for (int64_t blk = b; blk < e; ++blk) {
      int64_t n0 = blk * kRows, nr = std::min(kRows, N - n0);
      for (int64_t r = 0; r < nr; ++r) decode_weight_row(w, n0 + r, rows.data() + r * K);
      for (int64_t t = 0; t < T; ++t) {
        const float* xr = xp + t * xs;
        for (int64_t r = 0; r < nr; ++r)
          op[t * os + n0 + r] = dot_f32(xr, rows.data() + r * K, K) + (bp ? bp[n0 + r] : 0.f);
      }
    }
  });
}

// Both MLA absorptions decode head h's rows of kv_b once and apply them to every token.
void mla_absorb_q(const Tensor& q_nope, const Weight& kv_b, int nope, int v, Tensor& q_latent) {
  const int64_t T = q_nope.size(0), H = q_nope.size(1), L = kv_b.in_features();
  MS_CHECK(q_nope.size(2) == nope && q_latent.size(2) == L && kv_b.out_features() == H * (nope + v),
           "mla_absorb_q: shapes ", q_nope.describe(), " ", kv_b.w.describe(), " ", q_latent.describe());
  ThreadPool::global().parallel_for(H, 1, [&](int64_t b, int64_t e) {
    std::vector<float> rows(static_cast<size_t>(nope * L));
    for (int64_t h = b; h < e; ++h) {
      for (int i = 0; i < nope; ++i) decode_weight_row(kv_b, h * (nope + v) + i, rows.data() + i * L);
      for (int64_t t = 0; t < T; ++t) {
        const float* qn = q_nope.data<float>() + t * q_nope.strides()[0] + h * q_nope.strides()[1];
        float* ql = q_latent.data<float>() + t * q_latent.strides()[0] + h * q_latent.strides()[1];
        std::fill(ql, ql + L, 0.f);
        for (int i = 0; i < nope; ++i) axpy_f32(qn[i], rows.data() + i * L, ql, L);
      }
    }
  });
}

void mla_expand_v(const Tensor& latent, const Weight& kv_b, int nope, int v, Tensor& out) {
  const int64_t T = latent.size(0), H = latent.size(1), L = kv_b.in_features();
  MS_CHECK(latent.size(2) == L && out.size(2) == v && kv_b.out_features() == H * (nope + v),
           "mla_expand_v: shapes ", latent.describe(), " ", kv_b.w.describe(), " ", out.describe());
  ThreadPool::global().parallel_for(H, 1, [&](int64_t b, int64_t e) {
    std::vector<float> rows(static_cast<size_t>(v * L));
    for (int64_t h = b; h < e; ++h) {
      for (int j = 0; j < v; ++j) decode_weight_row(kv_b, h * (nope + v) + nope + j, rows.data() + j * L);
      for (int64_t t = 0; t < T; ++t) {
        const float* lat = latent.data<float>() + t * latent.strides()[0] + h * latent.strides()[1];
        float* o = out.data<float>() + t * out.strides()[0] + h * out.strides()[1];
        for (int j = 0; j < v; ++j) o[j] = dot_f32(lat, rows.data() + j * L, L);
      }
    }
  });
}

}  // namespace ms::cpu
