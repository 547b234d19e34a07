// CUDA implementations of kernels/ops.h (same signatures, namespace ms::cuda). Activations are
// BF16 device tensors (F32 accepted where noted in the .cu files), accumulation is in f32, and
// host-side metadata (token ids, positions, slots, layouts) is uploaded inside each op.
#pragma once
#include "kernels/ops.h"
#include "kernels/step_graph.h"

namespace ms::cuda {
using ops::AttentionLayout;
using ops::ExpertRows;
using ops::ExpertWeights;
using ops::GroupRank;
using ops::RouterParams;
using ops::Scoring;
using ops::Weight;

// Makes the calling thread work on GPU `gpu` (-1: keep its current device, 0 for a new thread),
// creating that GPU's stream, cuBLASLt handle and caching allocator on first use and
// registering Device::CUDA's memory with core. Idempotent; throws when the GPU cannot be used.
void init(int gpu = -1);

void linear(const Tensor& x, const Weight& w, const Tensor* bias, Tensor& out,
            ops::Overlap overlap = ops::Overlap::AfterLast);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out);
void add_inplace(Tensor& x, const Tensor& y);
void silu_and_mul(const Tensor& gate_up, Tensor& out);
void gated_linear(const Tensor& x, const Weight& gate, const Weight& up, bool round_bf16, Tensor& act,
                  ops::Overlap overlap = ops::Overlap::AfterLast);
void embedding(const Tensor& table, std::span<const int32_t> ids, Tensor& out, const Tensor* earlier);
void add_sigmoid_gated(Tensor& x, const Tensor& gate, const Tensor& y);
void round_to_bf16(Tensor& x);
void gather_rows(const Tensor& src, std::span<const int32_t> rows, Tensor& out);
void index_add_rows(Tensor& dst, std::span<const int32_t> rows, const Tensor& src);
void scatter_rows(const Tensor& src, std::span<const int32_t> slots, Tensor& dst);
void add_rms_norm(Tensor& residual, const Tensor& y, const Tensor& weight, float eps, Tensor& out);
void rope_store_kv(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                   std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                   const ops::HeadNorm* qk_norm);
void mla_rope_store(Tensor& q, const Tensor& kv, const Tensor& kv_norm, float eps, const ops::RopeArgs& rope,
                    std::span<const int32_t> slots, bool round_bf16, Tensor& cache);
void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const AttentionLayout& layout,
               float scale, Tensor& out);
void rope_store_kv_attention(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                             std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache, Tensor& v_cache,
                             const ops::HeadNorm* qk_norm, const AttentionLayout& layout, float scale, Tensor& out);
void rope_store_kv_attention_o_add_norm(Tensor& q, const Tensor& k, const Tensor& v, const ops::RopeArgs& rope,
                                        std::span<const int32_t> slots, bool round_bf16, Tensor& k_cache,
                                        Tensor& v_cache, const ops::HeadNorm* qk_norm, const AttentionLayout& layout,
                                        float scale, Tensor& attn, const ops::PostAttention& post);
void mla_attention(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache, const AttentionLayout& layout,
                   float scale, Tensor& out);
void mla_attention_expand(const Tensor& q_latent, const Tensor& q_rope, const Tensor& kv_cache,
                          const AttentionLayout& layout, float scale, const Weight& kv_b, int nope, int v,
                          Tensor& latent, Tensor& out);
void mla_absorb_q(const Tensor& q_nope, const Weight& kv_b, int nope, int v, Tensor& q_latent);
void mla_expand_v(const Tensor& latent, const Weight& kv_b, int nope, int v, Tensor& out);
void mla_prefill_expanded(const Tensor& q, const Tensor& kv_cache, const AttentionLayout& layout, const Weight& kv_b,
                          int nope, int v, float scale, Tensor& out);
void moe_topk(const Tensor& logits, const Tensor* bias, const RouterParams& p, Tensor& ids, Tensor& weights);
void moe_route(const Tensor& x, const Weight& gate, const Tensor* gate_bias, const Tensor* bias, const RouterParams& p,
               Tensor& ids, Tensor& weights);
void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts, Tensor& out);
ExpertRows moe_expert_rows(const Tensor& x, const Tensor& ids, const Tensor& weights, const ExpertWeights& experts);
void moe_combine_add_rms_norm(const ExpertRows& routed, const Tensor* shared, const Tensor* shared_gate,
                              bool round_bf16, Tensor& residual, const Tensor& weight, float eps, Tensor& out);
std::vector<int32_t> argmax_rows(const Tensor& logits);
void argmax_rows_into(const Tensor& logits, Tensor& ids);
void sample_rows_into(const Tensor& logits, std::span<const ops::RowSampling> rows, Tensor& ids);
std::unique_ptr<ops::HostReadback> make_host_readback(int64_t capacity);
std::shared_ptr<ops::GraphPool> make_graph_pool();
std::unique_ptr<ops::StepGraph> capture_step(const ops::StepArrays& arrays, int64_t kv_capacity, int max_kv,
                                             ops::GraphPool& pool, const std::function<void()>& body);

}  // namespace ms::cuda
