// Device dispatch of the op interface. CPU tensors go to kernels/cpu; CUDA tensors to
// kernels/cuda when the CUDA backend is compiled in.
#include "kernels/ops.h"
#include "kernels/step_graph.h"

#include <cmath>

#include "core/check.h"
#include "kernels/cpu/cpu_ops.h"
#if MOESERVE_WITH_CUDA
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/op_trace.h"
// The scope's temporary lives until the op returns: it brackets the op's kernels when tracing.
#define MS_DISPATCH(t, call) \
  ((t).device() == Device::CUDA ? (::ms::cuda::OpScope(#call), ::ms::cuda::call) : ::ms::cpu::call)
#else
// fail() never returns; the comma gives both branches the CPU op's type (void or a value).
#define MS_DISPATCH(t, call)                                                                            \
  ((t).device() == Device::CUDA ? (::ms::fail("this build has no CUDA backend (nvcc was not found)"), \
                                   ::ms::cpu::call)                                                 \
                                : ::ms::cpu::call)
#endif

namespace ms::ops {

void check_fp8_scales(const Tensor& scale_inv, const std::string& name) {
  const Tensor s = scale_inv.to(Device::CPU);  // a host tensor (the file's): itself
  const float* v = s.data<float>();
  for (int64_t i = 0; i < s.numel(); ++i)
    MS_CHECK(std::isfinite(v[i]) && std::fabs(v[i]) < kFp8ScaleBound, "tensor ", name, " holds ", v[i], " at element ",
             i, ": FP8 block scales must be finite and below ", kFp8ScaleBound,
             " (requantize the weights with a smaller block scale)");
}

std::shared_ptr<GraphPool> make_graph_pool(Device device) {
  MS_CHECK(device == Device::CUDA, "captured steps (CUDA graphs) need a CUDA device");
#if MOESERVE_WITH_CUDA
  return ::ms::cuda::make_graph_pool();
#else
  fail("this build has no CUDA backend (nvcc was not found): no CUDA graphs");
#endif
}

std::unique_ptr<StepGraph> capture_step(Device device, const StepArrays& arrays, int64_t kv_capacity, int max_kv,
                                        GraphPool& pool, const std::function<void()>& body) {
  MS_CHECK(device == Device::CUDA, "captured steps (CUDA graphs) need a CUDA device");
#if MOESERVE_WITH_CUDA
  return ::ms::cuda::capture_step(arrays, kv_capacity, max_kv, pool, body);
#else
  (void)arrays, (void)kv_capacity, (void)max_kv, (void)pool, (void)body;
  fail("this build has no CUDA backend (nvcc was not found): no CUDA graphs");
#endif
}

void op_trace_start(Device device) {
  MS_CHECK(device == Device::CUDA, "the op trace times CUDA ops only");
#if MOESERVE_WITH_CUDA
  ::ms::cuda::op_trace_start();
#else
  fail("this build has no CUDA backend (nvcc was not found): no op trace");
#endif
}

std::string op_trace_report(Device device) {
  MS_CHECK(device == Device::CUDA, "the op trace times CUDA ops only");
#if MOESERVE_WITH_CUDA
  return ::ms::cuda::op_trace_report();
#else
  fail("this build has no CUDA backend (nvcc was not found): no op trace");
#endif
}

void init_backend(Device device, int gpu) {
  if (device == Device::CPU) return;
#if MOESERVE_WITH_CUDA
  ::ms::cuda::init(gpu);
#else
  (void)gpu;
  fail("this build has no CUDA backend (nvcc was not found at configure time)");
#endif
}

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out, Overlap overlap) {
  MS_DISPATCH(x, linear(x, w, bias, out, overlap));
}
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) { MS_DISPATCH(x, rms_norm(x, weight, eps, out)); }
void add_inplace(Tensor& x, const Tensor& y) { MS_DISPATCH(x, add_inplace(x, y)); }
void silu_and_mul(const Tensor& gate_up, Tensor& out) { MS_DISPATCH(out, silu_and_mul(gate_up, out)); }
void gated_linear(const Tensor& x, const Weight& gate, const Weight& up, bool round_bf16, Tensor& act,
                  Overlap overlap) {
  MS_CHECK(gate.out_features() == up.out_features() && gate.in_features() == up.in_features() && act.dim() == 2 &&
               act.size(0) == x.size(0) && act.size(1) == gate.out_features(),
           "gated_linear: gate ", gate.w.describe(), ", up ", up.w.describe(), " -> ", act.describe());
  MS_DISPATCH(x, gated_linear(x, gate, up, round_bf16, act, overlap));
}
void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out, const Tensor* earlier) {
  MS_CHECK(!earlier || (earlier->dtype() == DType::I32 && earlier->device() == out.device() && earlier->dim() == 1),
           "embedding: earlier ids ", earlier ? earlier->describe() : "", " must be I32 on the output's device");
  MS_DISPATCH(out, embedding(table, ids, out, earlier));
}
void add_sigmoid_gated(Tensor& x, const Tensor& gate, const Tensor& y) { MS_DISPATCH(x, add_sigmoid_gated(x, gate, y)); }
void round_to_bf16(Tensor& x) { MS_DISPATCH(x, round_to_bf16(x)); }
void gather_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& out) { MS_DISPATCH(out, gather_rows(src, rows, out)); }
void index_add_rows(Tensor& dst, std::span<const int32_t> rows, const Tensor& src) {
  MS_DISPATCH(dst, index_add_rows(dst, rows, src));
}
void scatter_rows(const Tensor& src, std::span<const int32_t> slots, Tensor& dst) { MS_DISPATCH(dst, scatter_rows(src, slots, dst)); }
void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, Tensor& out) {
  MS_DISPATCH(residual, add_rms_norm(residual, y, weight, eps, out));
}
void rope_store_kv(Tensor& q, const Tensor& k, const Tensor& v, const RopeArgs& rope, std::span<const int32_t> slots,
                   bool round_bf16, Tensor& k_cache, Tensor& v_cache, const HeadNorm* qk_norm) {
  MS_DISPATCH(q, rope_store_kv(q, k, v, rope, slots, round_bf16, k_cache, v_cache, qk_norm));
}
void mla_rope_store(Tensor& q, const Tensor& kv, const Tensor& kv_norm, float eps, const RopeArgs& rope,
                    std::span<const int32_t> slots, bool round_bf16, Tensor& cache) {
  MS_DISPATCH(q, mla_rope_store(q, kv, kv_norm, eps, rope, slots, round_bf16, cache));
}
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout, float scale,
               Tensor& out) {
  MS_DISPATCH(q, attention(q, k_cache, v_cache, layout, scale, out));
}
void rope_store_kv_attention(Tensor& q, const Tensor& k, const Tensor& v, const RopeArgs& rope,
                             std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                             const HeadNorm* qk_norm, const AttentionLayout& layout, float scale, Tensor& out) {
  MS_DISPATCH(q, rope_store_kv_attention(q, k, v, rope, slots, round_bf16, k_cache, v_cache, qk_norm, layout, scale,
                                         out));
}
void rope_store_kv_attention_o_add_norm(Tensor& q, const Tensor& k, const Tensor& v, const RopeArgs& rope,
                                        std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache,
                                        Tensor& v_cache, const HeadNorm* qk_norm, const AttentionLayout& layout,
                                        float scale, Tensor& attn, const PostAttention& post) {
  MS_DISPATCH(q, rope_store_kv_attention_o_add_norm(q, k, v, rope, slots, round_bf16, k_cache, v_cache, qk_norm,
                                                    layout, scale, attn, post));
}
void mla_attention(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const AttentionLayout& layout,
                   float scale, Tensor& out) {
  MS_DISPATCH(q_latent, mla_attention(q_latent, q_rope, kv_cache, layout, scale, out));
}
void mla_attention_expand(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                          const AttentionLayout& layout, float scale, const Weight& kv_b, int nope, int v,
                          Tensor& latent, Tensor& out) {
  MS_DISPATCH(q_latent, mla_attention_expand(q_latent, q_rope, kv_cache, layout, scale, kv_b, nope, v, latent, out));
}
void mla_absorb_q(const Tensor& q_nope, const Weight& kv_b, int nope, int v, Tensor& q_latent) {
  MS_DISPATCH(q_nope, mla_absorb_q(q_nope, kv_b, nope, v, q_latent));
}
void mla_expand_v(const Tensor& latent, const Weight& kv_b, int nope, int v, Tensor& out) {
  MS_DISPATCH(latent, mla_expand_v(latent, kv_b, nope, v, out));
}
void mla_prefill_expanded(const Tensor& q, const Tensor& kv_cache, const AttentionLayout& layout, const Weight& kv_b,
                          int nope, int v, float scale, Tensor& out) {
  MS_DISPATCH(q, mla_prefill_expanded(q, kv_cache, layout, kv_b, nope, v, scale, out));
}
void moe_topk(const Tensor& logits, const Tensor* bias, const RouterParams& p, Tensor& ids, Tensor& weights) {
  MS_DISPATCH(logits, moe_topk(logits, bias, p, ids, weights));
}
void moe_route(const Tensor& x, const Weight& gate, const Tensor* gate_bias, const Tensor* bias, const RouterParams& p,
               Tensor& ids, Tensor& weights) {
  MS_DISPATCH(x, moe_route(x, gate, gate_bias, bias, p, ids, weights));
}
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts, Tensor& out) {
  MS_DISPATCH(x, moe_experts(x, ids, weights, experts, out));
}
ExpertRows moe_expert_rows(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts) {
  return MS_DISPATCH(x, moe_expert_rows(x, ids, weights, experts));
}
void moe_combine_add_rms_norm(const ExpertRows& routed, const Tensor* shared, const Tensor* shared_gate,
                              bool round_bf16, Tensor& residual, const Tensor& weight, float eps, Tensor& out) {
  MS_CHECK(!shared_gate || shared, "moe_combine_add_rms_norm: a shared-expert gate without its expert's output");
  MS_DISPATCH(residual, moe_combine_add_rms_norm(routed, shared, shared_gate, round_bf16, residual, weight, eps, out));
}
std::vector<int32_t> argmax_rows(const Tensor& logits) { return MS_DISPATCH(logits, argmax_rows(logits)); }
void argmax_rows_into(const Tensor& logits, Tensor& ids) {
  MS_CHECK(ids.dtype() == DType::I32 && ids.device() == logits.device() && ids.dim() == 1 &&
               ids.size(0) == logits.size(0) && ids.is_contiguous(),
           "argmax_rows_into: ids ", ids.describe(), " for logits ", logits.describe());
  MS_DISPATCH(logits, argmax_rows_into(logits, ids));
}
void sample_rows_into(const Tensor& logits, std::span<const RowSampling> rows, Tensor& ids) {
  MS_CHECK(logits.dim() == 2 && int64_t(rows.size()) == logits.size(0) && logits.size(1) > 0,
           "sample_rows_into: ", rows.size(), " rows of sampling for logits ", logits.describe());
  MS_CHECK(ids.dtype() == DType::I32 && ids.device() == logits.device() && ids.dim() == 1 &&
               ids.size(0) == logits.size(0) && ids.is_contiguous(),
           "sample_rows_into: ids ", ids.describe(), " for logits ", logits.describe());
  MS_DISPATCH(logits, sample_rows_into(logits, rows, ids));
}

std::unique_ptr<HostReadback> make_host_readback(Device device, int64_t capacity) {
  if (device == Device::CPU) return ::ms::cpu::make_host_readback(capacity);
#if MOESERVE_WITH_CUDA
  return ::ms::cuda::make_host_readback(capacity);
#else
  fail("this build has no CUDA backend (nvcc was not found)");
#endif
}

}  // namespace ms::ops
