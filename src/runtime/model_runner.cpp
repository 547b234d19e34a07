#include "runtime/model_runner.h"

#include <algorithm>

#include "core/check.h"
#include "core/device_memory.h"

namespace ms {

ModelRunner::ModelRunner(const CausalLM& model, int64_t num_slots, bool bf16_activations, CudaGraphSettings graphs,
                         int verify_tokens, int sampled_rows)
    : model_(model),
      num_slots_(num_slots),
      kv_(model.make_kv_cache(num_slots + (graphs.enabled_on(model.device) ? 1 : 0))),
      bf16_(bf16_activations) {
  if (sampled_rows > 0) sampled_ids_ = Tensor::empty(DType::I32, {sampled_rows}, model.device);
  if (!graphs.enabled_on(model.device)) return;
  const int max_context = int(std::min<int64_t>(model.config.max_position_embeddings, num_slots));
  CudaGraphOptions o{graphs.max_bs, int32_t(num_slots), max_context, bf16_activations, 0};
  o.earlier_ids = sampled_ids_;
  if (verify_tokens > 0) {
    o.tokens_per_seq = verify_tokens;
    graphs_ = std::make_unique<CudaGraphRunner>(model, kv_, o, [&model](const ForwardContext& ctx, const Tensor&) {
      Tensor hidden = model.forward_hidden(ctx);
      return std::vector<Tensor>{hidden, model.logits(hidden)};
    });
  } else {
    graphs_ = std::make_unique<CudaGraphRunner>(model, kv_, o);
  }
  verify_graphs_ = verify_tokens > 0;
  graphs_->capture_all();
}

size_t ModelRunner::bytes_per_slot(const CausalLM& model) {
  size_t per_layer = 0;
  for (const Shape& s : model.kv_shapes) {
    size_t n = dtype_size(model.act_dtype);
    for (int64_t d : s) n *= size_t(d);
    per_layer += n;
  }
  return per_layer * model.layers.size();
}

ForwardBatch ModelRunner::build_forward_batch(const ScheduleBatch& batch, const ReqToTokenTable& table) {
  ForwardBatch fb;
  const size_t T = size_t(batch.num_tokens());
  fb.input_ids.reserve(T);
  fb.positions.reserve(T);
  fb.out_cache_loc = batch.out_cache_loc;
  fb.attn.q_start.push_back(0);
  fb.attn.kv_start.push_back(0);
  for (const ScheduledSeq& s : batch.seqs) {
    const Request& r = *s.req;
    for (int i = s.start; i < s.start + s.num_tokens; ++i) {
      fb.input_ids.push_back(r.fill_at(i));
      fb.positions.push_back(i);
    }
    // The sequence's keys are all its positions so far, this step's included (the scheduler
    // wrote this step's slots into the row when it allocated them).
    const int32_t* row = table.row(r.row);
    fb.attn.kv_slots.insert(fb.attn.kv_slots.end(), row, row + s.start + s.num_tokens);
    fb.attn.q_start.push_back(int32_t(fb.input_ids.size()));
    fb.attn.kv_start.push_back(int32_t(fb.attn.kv_slots.size()));
  }
  MS_ASSERT(fb.input_ids.size() == T);
  return fb;
}

Tensor ModelRunner::forward(const ScheduleBatch& batch, const ReqToTokenTable& table) {
  ForwardBatch fb = build_forward_batch(batch, table);
  fb.earlier_ids = sampled_ids_;
  if (graphs_ && !verify_graphs_)
    if (std::optional<Tensor> logits = graphs_->decode(fb)) return *logits;
  return model_.forward(context(fb));
}

Tensor ModelRunner::forward_hidden(const ForwardBatch& fb) {
  return model_.forward_hidden(context(fb));
}

ModelRunner::HiddenAndLogits ModelRunner::forward_verify(const ForwardBatch& fb) {
  if (graphs_ && verify_graphs_)
    if (auto out = graphs_->run(fb)) return {(*out)[0], (*out)[1]};
  Tensor hidden = forward_hidden(fb);
  return {hidden, model_.logits(hidden)};
}

ForwardContext ModelRunner::context(const ForwardBatch& fb) {
  ForwardContext ctx{fb, kv_, bf16_};
  ctx.device = model_.device;
  ctx.act_dtype = model_.act_dtype;
  ctx.parallel = model_.groups;  // this rank's groups when the model is one shard of several
  return ctx;
}

void ModelRunner::idle_forward() {
  ForwardBatch fb;
  fb.attn.q_start = {0};
  fb.attn.kv_start = {0};
  model_.forward(context(fb));
}

MemoryInfo device_memory_info(Device device) {
  if (device == Device::CPU) return host_memory_info();
  MemoryInfo m;
  MS_CHECK(device_memory(device)->memory_info(&m.free_bytes, &m.total_bytes),
           "sizing the KV pool from --mem-fraction-static needs the device's free memory, which this backend does "
           "not report; pass --max-total-tokens");
  return m;
}

}  // namespace ms
