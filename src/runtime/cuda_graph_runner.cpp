#include "runtime/cuda_graph_runner.h"

#include <algorithm>

#include "core/check.h"

namespace ms {

CudaGraphRunner::CudaGraphRunner(const CausalLM& model, KvCache& kv, CudaGraphOptions options)
    : CudaGraphRunner(model, kv, options, [&model](const ForwardContext& ctx, const Tensor&) {
        return std::vector<Tensor>{model.forward(ctx)};
      }) {}

CudaGraphRunner::CudaGraphRunner(const CausalLM& model, KvCache& kv, CudaGraphOptions options, GraphBody body)
    : model_(model), kv_(kv), options_(options), body_(std::move(body)), sizes_(capture_sizes(options.max_bs)),
      pool_(ops::make_graph_pool(model.device)) {
  MS_CHECK(options.pad_slot >= 0 && options.pad_slot < kv.num_slots(), "CUDA graphs: padding slot ",
           options.pad_slot, " outside the KV pool of ", kv.num_slots());
  MS_CHECK(options.max_context > 0 && options.tokens_per_seq >= 1 && options.tokens_per_seq <= options.max_context,
           "CUDA graphs: max_context ", options.max_context, ", tokens per sequence ", options.tokens_per_seq);
}

std::vector<int> CudaGraphRunner::capture_sizes(int max_bs) {
  std::vector<int> s;
  for (int b : {1, 2, 4}) if (b <= max_bs) s.push_back(b);
  for (int b = 8; b <= max_bs; b += 8) s.push_back(b);
  if (max_bs > 0 && s.back() != max_bs) s.push_back(max_bs);
  return s;
}

std::vector<Tensor> CudaGraphRunner::run_eager(const ForwardBatch& b, const Tensor& input) const {
  ForwardContext ctx{b, kv_, options_.bf16_activations};
  ctx.device = model_.device, ctx.act_dtype = model_.act_dtype;
  return body_(ctx, input);
}

// Real sequences first, then dummies whose tokens sit at positions 0, 1, ... and all read and
// write the padding slot.
ForwardBatch CudaGraphRunner::padded(const ForwardBatch& b, int bs) const {
  ForwardBatch p = b;
  const int k = options_.tokens_per_seq;
  if (p.attn.q_start.empty()) p.attn.q_start = {0}, p.attn.kv_start = {0};
  for (int s = p.num_seqs(); s < bs; ++s) {
    for (int i = 0; i < k; ++i) {
      p.input_ids.push_back(0), p.positions.push_back(i), p.out_cache_loc.push_back(options_.pad_slot);
      p.attn.kv_slots.push_back(options_.pad_slot);
    }
    p.attn.q_start.push_back(p.attn.q_start.back() + k);
    p.attn.kv_start.push_back(int32_t(p.attn.kv_slots.size()));
  }
  return p;
}

CudaGraphRunner::Captured& CudaGraphRunner::captured(int bs) {
  auto it = graphs_.find(bs);
  if (it != graphs_.end()) return it->second;
  Captured& c = graphs_[bs];  // in place: the capture records the addresses of c.batch's arrays
  try {
    c.batch = padded(ForwardBatch{}, bs);
    c.batch.earlier_ids = options_.earlier_ids;
    // Distinct sequences use distinct slots, so a batch names at most the pool plus its dummies;
    // more (sequences sharing a radix prefix) runs op by op.
    c.kv_capacity = std::min<int64_t>(int64_t(bs) * options_.max_context,
                                      kv_.num_slots() + int64_t(bs) * options_.tokens_per_seq);
    if (options_.input_width > 0)  // zeros: padding rows stay finite whatever the body does with them
      c.input = Tensor::empty(model_.act_dtype, {bs, options_.input_width}, model_.device);
    run_eager(c.batch, c.input);  // allocations, GEMM plans and expert tables exist before the capture
    ops::StepArrays arrays{c.batch.input_ids, c.batch.positions, c.batch.out_cache_loc, &c.batch.attn};
    c.graph = ops::capture_step(model_.device, arrays, c.kv_capacity, options_.max_context, *pool_,
                                [&] { c.outputs = run_eager(c.batch, c.input); });
  } catch (...) {
    graphs_.erase(bs);
    throw;
  }
  return c;
}

void CudaGraphRunner::capture_all() {
  for (int bs : sizes_) captured(bs);
}

// A replay runs no op, so none of their host-side checks: the ranges are checked here.
void CudaGraphRunner::check_ranges(const ForwardBatch& b) const {
  const int vocab = model_.config.vocab_size, max_pos = model_.config.max_position_embeddings;
  // Placeholders read the array the graph captured: only the batch's own one may be it.
  const bool same = b.earlier_ids.defined() && options_.earlier_ids.defined() &&
                    b.earlier_ids.raw() == options_.earlier_ids.raw();
  const int64_t placeholders = same ? options_.earlier_ids.size(0) : 0;
  for (int32_t id : b.input_ids)
    MS_CHECK(id >= -placeholders && id < vocab, "token id ", id, " outside the vocabulary of ", vocab);
  for (int32_t p : b.positions) MS_CHECK(p >= 0 && p < max_pos, "position ", p, " beyond max_position_embeddings");
  const int64_t slots = kv_.num_slots();
  for (int32_t s : b.out_cache_loc) MS_CHECK(s >= 0 && s < slots, "KV slot ", s, " outside the pool of ", slots);
  for (int32_t s : b.attn.kv_slots) MS_CHECK(s >= 0 && s < slots, "KV slot ", s, " outside the pool of ", slots);
}

std::optional<std::vector<Tensor>> CudaGraphRunner::run(const ForwardBatch& batch, const Tensor* input) {
  const int n = batch.num_seqs(), k = options_.tokens_per_seq;
  if (n <= 0 || batch.num_tokens() != n * k || sizes_.empty() || n > sizes_.back()) return std::nullopt;
  for (int s = 0; s < n; ++s) {
    const int nk = batch.attn.kv_start[s + 1] - batch.attn.kv_start[s];
    if (batch.attn.q_start[s + 1] - batch.attn.q_start[s] != k || nk > options_.max_context) return std::nullopt;
  }
  const int bs = *std::lower_bound(sizes_.begin(), sizes_.end(), n);
  MS_CHECK((options_.input_width > 0) == (input != nullptr), "CUDA graphs: this body ",
           options_.input_width > 0 ? "needs" : "takes no", " input rows");
  if (input) MS_CHECK(input->dim() == 2 && input->size(0) == n && input->size(1) == options_.input_width,
                      "CUDA graphs: input ", input->describe(), " for ", n, " sequences of width ", options_.input_width);
  check_ranges(batch);
  Captured& c = captured(bs);
  if (int64_t(batch.attn.kv_slots.size()) + int64_t(bs - n) * k > c.kv_capacity) return std::nullopt;
  if (input) {
    Tensor rows = c.input.narrow_rows(0, n);
    rows.copy_from(input->is_contiguous() ? *input : input->clone());
  }
  ForwardBatch p = padded(batch, bs);
  c.graph->replay(ops::StepArrays{p.input_ids, p.positions, p.out_cache_loc, &p.attn});
  ++replays_;
  std::vector<Tensor> out;
  for (const Tensor& t : c.outputs) out.push_back(t.narrow_rows(0, t.size(0) / bs * n));  // rows per sequence alike
  return out;
}

std::optional<Tensor> CudaGraphRunner::decode(const ForwardBatch& batch) {
  auto out = run(batch);
  if (!out) return std::nullopt;
  return out->front();
}

}  // namespace ms
