#include "runtime/cuda_graph_runner.h"

#include <algorithm>

#include "core/check.h"

namespace ms {

CudaGraphRunner::CudaGraphRunner(const CausalLM& model, KvCache& kv, CudaGraphOptions options)
    : model_(model), kv_(kv), options_(options), sizes_(capture_sizes(options.max_bs)) {
  MS_CHECK(model.device == Device::CUDA, "CUDA graphs need a model on the GPU");
  MS_CHECK(options.pad_slot >= 0 && options.pad_slot < kv.num_slots(), "CUDA graphs: padding slot ",
           options.pad_slot, " outside the KV pool of ", kv.num_slots());
}

std::vector<int> CudaGraphRunner::capture_sizes(int max_bs) {
  std::vector<int> s;
  for (int b : {1, 2, 4}) if (b <= max_bs) s.push_back(b);
  for (int b = 8; b <= max_bs; b += 8) s.push_back(b);
  if (max_bs > 0 && s.back() != max_bs) s.push_back(max_bs);
  return s;
}

Tensor CudaGraphRunner::run_eager(const ForwardBatch& b) const {
  ForwardContext ctx{b, kv_, options_.bf16_activations};
  ctx.device = model_.device, ctx.act_dtype = model_.act_dtype;
  return model_.forward(ctx);
}

// Real sequences first, then dummies of one token at position 0 in the padding slot.
ForwardBatch CudaGraphRunner::padded(const ForwardBatch& b, int bs) const {
  ForwardBatch p = b;
  if (p.attn.q_start.empty()) p.attn.q_start = {0}, p.attn.kv_start = {0};
  for (int s = p.num_seqs(); s < bs; ++s) {
    p.input_ids.push_back(0), p.positions.push_back(0), p.out_cache_loc.push_back(options_.pad_slot);
    p.attn.kv_slots.push_back(options_.pad_slot);
    p.attn.q_start.push_back(p.attn.q_start.back() + 1);
    p.attn.kv_start.push_back(int32_t(p.attn.kv_slots.size()));
  }
  return p;
}

CudaGraphRunner::Captured& CudaGraphRunner::captured(int bs) {
  auto it = graphs_.find(bs);
  if (it != graphs_.end()) return it->second;
  Captured& c = graphs_[bs];
  c.batch = padded(ForwardBatch{}, bs);
  run_eager(c.batch);  // allocations, GEMM plans and expert tables exist before the capture
  ops::StepArrays arrays{c.batch.input_ids, c.batch.positions, c.batch.out_cache_loc, &c.batch.attn};
  c.graph = ops::capture_step(model_.device, arrays, int64_t(bs) * options_.max_context, options_.max_context,
                              [&] { c.logits = run_eager(c.batch); });
  return c;
}

// A replay runs no op, so none of their host-side checks: the ranges are checked here.
void CudaGraphRunner::check_ranges(const ForwardBatch& b) const {
  const int vocab = model_.config.vocab_size, max_pos = model_.config.max_position_embeddings;
  for (int32_t id : b.input_ids) MS_CHECK(id >= 0 && id < vocab, "token id ", id, " outside the vocabulary of ", vocab);
  for (int32_t p : b.positions) MS_CHECK(p >= 0 && p < max_pos, "position ", p, " beyond max_position_embeddings");
  const int64_t slots = kv_.num_slots();
  for (int32_t s : b.out_cache_loc) MS_CHECK(s >= 0 && s < slots, "KV slot ", s, " outside the pool of ", slots);
  for (int32_t s : b.attn.kv_slots) MS_CHECK(s >= 0 && s < slots, "KV slot ", s, " outside the pool of ", slots);
}

std::optional<Tensor> CudaGraphRunner::decode(const ForwardBatch& batch) {
  const int n = batch.num_seqs();
  if (n == 0 || batch.all_logits || batch.num_tokens() != n || sizes_.empty() || n > sizes_.back()) return std::nullopt;
  for (int s = 0; s < n; ++s) {
    const int nk = batch.attn.kv_start[s + 1] - batch.attn.kv_start[s];
    if (batch.attn.q_start[s + 1] - batch.attn.q_start[s] != 1 || nk > options_.max_context) return std::nullopt;
  }
  const int bs = *std::lower_bound(sizes_.begin(), sizes_.end(), n);
  check_ranges(batch);
  Captured& c = captured(bs);
  ForwardBatch p = padded(batch, bs);
  c.graph->replay(ops::StepArrays{p.input_ids, p.positions, p.out_cache_loc, &p.attn});
  return c.logits.slice(0, 0, n);
}

}  // namespace ms
