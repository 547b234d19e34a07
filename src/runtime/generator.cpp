#include "runtime/generator.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/check.h"

namespace ms {

ForwardBatch Generator::single_sequence_batch(const std::vector<int32_t>& ids, int start, bool all_logits) {
  ForwardBatch b;
  if (ids.empty()) {  // IDLE: no tokens, no sequences, but the rank joins every collective
    b.attn.q_start = {0};
    b.attn.kv_start = {0};
    b.all_logits = all_logits;
    return b;
  }
  const int n = int(ids.size()), total = start + n;
  b.input_ids = ids;
  b.positions.resize(size_t(n));
  std::iota(b.positions.begin(), b.positions.end(), start);
  b.out_cache_loc = b.positions;  // slot p holds position p
  b.attn.q_start = {0, n};
  b.attn.kv_start = {0, total};
  b.attn.kv_slots.resize(size_t(total));
  std::iota(b.attn.kv_slots.begin(), b.attn.kv_slots.end(), 0);
  b.all_logits = all_logits;
  return b;
}

ForwardBatch Generator::static_batch(const std::vector<std::vector<int32_t>>& step_ids, const std::vector<int>& cached,
                                     int cap) {
  ForwardBatch fb;
  fb.attn.q_start = {0};
  fb.attn.kv_start = {0};
  for (size_t b = 0; b < step_ids.size(); ++b) {
    const int start = cached[b], n = int(step_ids[b].size());
    for (int i = 0; i < n; ++i) {
      fb.input_ids.push_back(step_ids[b][i]);
      fb.positions.push_back(start + i);
      fb.out_cache_loc.push_back(int(b) * cap + start + i);
    }
    for (int p = 0; p < start + n; ++p) fb.attn.kv_slots.push_back(int(b) * cap + p);
    fb.attn.q_start.push_back(fb.attn.q_start.back() + n);
    fb.attn.kv_start.push_back(int(fb.attn.kv_slots.size()));
  }
  return fb;
}

void Generator::check_ids(const std::vector<int32_t>& ids) const {
  MS_CHECK(!ids.empty(), "the prompt is empty");
  for (int32_t id : ids)
    MS_CHECK(id >= 0 && id < model_.config.vocab_size, "token id ", id, " is out of range (vocab_size ",
             model_.config.vocab_size, ")");
  MS_CHECK(int(ids.size()) <= model_.config.max_position_embeddings, "prompt of ", ids.size(),
           " tokens exceeds max_position_embeddings ", model_.config.max_position_embeddings);
}

ForwardContext Generator::context(const ForwardBatch& b, KvCache& kv, std::vector<Tensor>* trace) const {
  ForwardContext ctx{b, kv, bf16_, trace};
  ctx.device = model_.device;
  ctx.act_dtype = model_.act_dtype;
  ctx.parallel = model_.groups;
  return ctx;
}

Tensor Generator::prompt_logits(const std::vector<int32_t>& ids, std::vector<Tensor>* routing_trace) {
  check_ids(ids);
  KvCache kv = model_.make_kv_cache(int64_t(ids.size()));
  ForwardBatch b = single_sequence_batch(ids, 0, true);
  return model_.forward(context(b, kv, routing_trace));
}

Tensor Generator::prompt_hidden(const std::vector<int32_t>& ids) {
  check_ids(ids);
  KvCache kv = model_.make_kv_cache(int64_t(ids.size()));
  ForwardBatch b = single_sequence_batch(ids, 0, true);
  return model_.forward_hidden(context(b, kv));
}

Tensor Generator::mtp_logits(const std::vector<int32_t>& ids) {
  MS_CHECK(ids.size() >= 2, "the MTP layer needs at least two tokens");
  Tensor hidden = prompt_hidden(ids);
  std::vector<int32_t> next(ids.begin() + 1, ids.end());
  KvCache kv = model_.make_mtp_kv_cache(int64_t(next.size()));
  ForwardBatch b = single_sequence_batch(next, 0, true);
  return model_.mtp_forward(context(b, kv), hidden.narrow_rows(0, int64_t(next.size())));
}

static int32_t sample_row(const float* logits, int64_t V, float temperature, std::mt19937_64& rng) {
  if (temperature <= 0) return int32_t(std::max_element(logits, logits + V) - logits);
  float mx = *std::max_element(logits, logits + V);
  std::vector<double> p(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) p[i] = std::exp((logits[i] - mx) / temperature);
  std::discrete_distribution<int32_t> dist(p.begin(), p.end());
  return dist(rng);
}

std::vector<int32_t> Generator::generate(const std::vector<int32_t>& prompt, const GenerateOptions& o) {
  check_ids(prompt);
  MS_CHECK(o.max_new_tokens >= 0, "--max-new-tokens must be >= 0");
  const int64_t capacity = int64_t(prompt.size()) + o.max_new_tokens;
  MS_CHECK(capacity <= model_.config.max_position_embeddings, "prompt + max_new_tokens (", capacity,
           ") exceeds max_position_embeddings ", model_.config.max_position_embeddings);
  KvCache kv = model_.make_kv_cache(std::max<int64_t>(capacity, 1));
  std::mt19937_64 rng(o.seed);
  const auto& eos = model_.config.eos_token_ids;
  std::vector<int32_t> out, step = prompt;
  int pos = 0;
  while (int(out.size()) < o.max_new_tokens) {
    ForwardBatch b = single_sequence_batch(step, pos, false);
    Tensor logits = model_.forward(context(b, kv));
    pos += int(step.size());
    Tensor host = logits.to_f32();
    int32_t next = sample_row(host.data<float>(), host.size(1), o.temperature, rng);
    out.push_back(next);
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    step = {next};
  }
  return out;
}

}  // namespace ms
