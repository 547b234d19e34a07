// Attention over a slot cache on the CPU: one task per (query, head), scores in f32 with a
// max-subtracted softmax. Keys are gathered through the layout's slot lists, so sequences of
// different lengths (and a prefix already cached) share one call.
#include <cmath>

#include "core/check.h"
#include "core/thread_pool.h"
#include "kernels/cpu/cpu_ops.h"

namespace ms::cpu {
namespace {

struct QueryInfo {
  int seq;
  int64_t visible;  // keys this query sees (causal)
};

std::vector<QueryInfo> query_infos(const AttentionLayout& l) {
  std::vector<QueryInfo> out;
  for (int s = 0; s < l.num_seqs(); ++s) {
    int64_t nq = l.q_start[s + 1] - l.q_start[s], nk = l.kv_start[s + 1] - l.kv_start[s];
    MS_CHECK(nq <= nk, "attention: sequence ", s, " has ", nq, " queries but only ", nk, " keys");
    for (int64_t i = 0; i < nq; ++i) out.push_back({s, nk - nq + i + 1});
  }
  return out;
}

// p[j] = softmax(scale * scores[j]) in place; returns nothing, scores become weights.
void softmax_scaled(std::vector<float>& p, int64_t n, float scale) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < n; ++j) mx = std::max(mx, p[j] * scale);
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] * scale - mx));
  float inv = 1.0f / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
}

}  // namespace

void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout,
               float scale, Tensor& out) {
  const int64_t T = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k_cache.size(1), Dv = v_cache.size(2);
  MS_CHECK(k_cache.size(2) == D && Hq % Hkv == 0 && out.size(2) == Dv, "attention: shapes ", q.describe(), " ",
           k_cache.describe(), " ", v_cache.describe());
  auto infos = query_infos(layout);
  MS_CHECK(int64_t(infos.size()) == T, "attention: layout has ", infos.size(), " queries, batch ", T);
  const int64_t group = Hq / Hkv;
  ThreadPool::global().parallel_for(T * Hq, 4, [&](int64_t b, int64_t e) {
    std::vector<float> p;
    for (int64_t i = b; i < e; ++i) {
      int64_t t = i / Hq, h = i % Hq, kvh = h / group;
      const QueryInfo& qi = infos[t];
      const int32_t* slots = layout.kv_slots.data() + layout.kv_start[qi.seq];
      const float* qr = q.data<float>() + t * q.strides()[0] + h * q.strides()[1];
      p.resize(size_t(qi.visible));
      for (int64_t j = 0; j < qi.visible; ++j)
        p[j] = dot_f32(qr, k_cache.data<float>() + slots[j] * k_cache.strides()[0] + kvh * k_cache.strides()[1], D);
      softmax_scaled(p, qi.visible, scale);
      float* o = out.data<float>() + t * out.strides()[0] + h * out.strides()[1];
      std::fill(o, o + Dv, 0.f);
      for (int64_t j = 0; j < qi.visible; ++j)
        axpy_f32(p[j], v_cache.data<float>() + slots[j] * v_cache.strides()[0] + kvh * v_cache.strides()[1], o, Dv);
    }
  });
}

void mla_attention(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const AttentionLayout& layout,
                   float scale, Tensor& out) {
  const int64_t T = q_latent.size(0), H = q_latent.size(1), L = q_latent.size(2), R = q_rope.size(2);
  MS_CHECK(kv_cache.size(1) == L + R && out.size(2) == L, "mla_attention: shapes ", q_latent.describe(), " ",
           q_rope.describe(), " ", kv_cache.describe());
  auto infos = query_infos(layout);
  MS_CHECK(int64_t(infos.size()) == T, "mla_attention: layout has ", infos.size(), " queries, batch ", T);
  const int64_t cs = kv_cache.strides()[0];
  ThreadPool::global().parallel_for(T * H, 4, [&](int64_t b, int64_t e) {
    std::vector<float> p;
    for (int64_t i = b; i < e; ++i) {
      int64_t t = i / H, h = i % H;
      const QueryInfo& qi = infos[t];
      const int32_t* slots = layout.kv_slots.data() + layout.kv_start[qi.seq];
      const float* ql = q_latent.data<float>() + t * q_latent.strides()[0] + h * q_latent.strides()[1];
      const float* qr = q_rope.data<float>() + t * q_rope.strides()[0] + h * q_rope.strides()[1];
      p.resize(size_t(qi.visible));
      for (int64_t j = 0; j < qi.visible; ++j) {
        const float* kv = kv_cache.data<float>() + slots[j] * cs;
        p[j] = dot_f32(ql, kv, L) + dot_f32(qr, kv + L, R);
      }
      softmax_scaled(p, qi.visible, scale);
      float* o = out.data<float>() + t * out.strides()[0] + h * out.strides()[1];
      std::fill(o, o + L, 0.f);
      for (int64_t j = 0; j < qi.visible; ++j) axpy_f32(p[j], kv_cache.data<float>() + slots[j] * cs, o, L);
    }
  });
}

void mla_attention_expand(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                          const AttentionLayout& layout, float scale, const Weight& kv_b, int nope, int v,
                          Tensor& latent, Tensor& out) {
  cpu::mla_attention(q_latent, q_rope, kv_cache, layout, scale, latent);
  cpu::mla_expand_v(latent, kv_b, nope, v, out);
}

// The composition of the absorbed ops, so that a CPU step's results do not depend on which form
// the layer asked for (the tests' references, and CPU serving, stay where they were).
void mla_prefill_expanded(const Tensor& q, const Tensor& kv_cache, const AttentionLayout& layout, const Weight& kv_b,
                          int nope, int v, float scale, Tensor& out) {
  const int64_t T = q.size(0), H = q.size(1), R = q.size(2) - nope, L = kv_cache.size(1) - R;
  Tensor q_latent = Tensor::empty(DType::F32, {T, H, L}), o_latent = Tensor::empty(DType::F32, {T, H, L});
  cpu::mla_absorb_q(q.slice(2, 0, nope), kv_b, nope, v, q_latent);
  cpu::mla_attention(q_latent, q.slice(2, nope, nope + R), kv_cache, layout, scale, o_latent);
  cpu::mla_expand_v(o_latent, kv_b, nope, v, out);
}

}  // namespace ms::cpu
