#include "runtime/spec_mtp_draft.h"

#include <algorithm>

#include "core/check.h"
#include "runtime/sampler.h"

namespace ms {
namespace {

// Opens sequence bookkeeping of a batch under construction.
ForwardBatch empty_batch() {
  ForwardBatch b;
  b.attn.q_start = {0};
  b.attn.kv_start = {0};
  return b;
}

// Closes a sequence whose keys are the slots of positions [0, end) of `row`.
void close_sequence(ForwardBatch& b, const int32_t* row, int end) {
  b.attn.kv_slots.insert(b.attn.kv_slots.end(), row, row + end);
  b.attn.q_start.push_back(int32_t(b.input_ids.size()));
  b.attn.kv_start.push_back(int32_t(b.attn.kv_slots.size()));
}

}  // namespace

MtpDraft::MtpDraft(const CausalLM& model, bool bf16_activations, CudaGraphSettings graphs)
    : model_(model), bf16_(bf16_activations), graph_settings_(graphs) {
  MS_CHECK(model.mtp != nullptr, "speculative decoding with NEXTN/EAGLE drafts with the checkpoint's MTP layer, "
                                 "and this checkpoint has none (num_nextn_predict_layers is 0)");
}

size_t MtpDraft::kv_bytes_per_slot() const {
  size_t bytes = 0;
  for (const Shape& s : model_.kv_shapes) {
    size_t n = dtype_size(model_.act_dtype);
    for (int64_t d : s) n *= size_t(d);
    bytes += n;
  }
  return bytes;  // one layer
}

void MtpDraft::attach(int64_t num_slots, int rows) {
  const bool graphs = graph_settings_.enabled_on(model_.device);
  kv_ = std::make_unique<KvCache>(model_.make_mtp_kv_cache(num_slots + (graphs ? 1 : 0)));
  last_hidden_ = Tensor::empty(model_.act_dtype, {rows, model_.config.hidden_size}, model_.device);
  next_guess_.assign(size_t(rows), 0);
  if (!graphs) return;
  CudaGraphOptions o{graph_settings_.max_bs, int32_t(num_slots),
                     int(std::min<int64_t>(model_.config.max_position_embeddings, num_slots)), bf16_,
                     int(model_.config.hidden_size)};
  graphs_ = std::make_unique<CudaGraphRunner>(model_, *kv_, o, [this](const ForwardContext& ctx, const Tensor& hidden) {
    Tensor h = model_.mtp_hidden(ctx, hidden);
    return std::vector<Tensor>{h, model_.mtp->head(h)};
  });
  graphs_->capture_all();
}

ForwardContext MtpDraft::context(const ForwardBatch& b) {
  MS_CHECK(kv_ != nullptr, "MTP draft: used before attach()");
  ForwardContext ctx{b, *kv_, bf16_};
  ctx.device = model_.device;
  ctx.act_dtype = model_.act_dtype;
  ctx.parallel = model_.groups;  // this rank's groups when the model is one shard of several
  return ctx;
}

void MtpDraft::idle_forward() {
  ForwardBatch b = empty_batch();
  ForwardContext ctx = context(b);
  model_.mtp_hidden(ctx, ctx.empty({0, model_.config.hidden_size}));
}

void MtpDraft::observe(std::span<const DraftSeq> seqs, const Tensor& hidden, const ReqToTokenTable& table) {
  ForwardBatch b = empty_batch();
  std::vector<int32_t> last_rows, req_rows;
  for (const DraftSeq& s : seqs) {
    const int32_t* row = table.row(s.req->row);
    for (int i = s.start; i < s.start + s.count; ++i) {
      b.input_ids.push_back(s.req->fill_at(i + 1));  // position i pairs the next token with hidden i
      b.positions.push_back(i);
      b.out_cache_loc.push_back(row[i]);
    }
    close_sequence(b, row, s.start + s.count);
    last_rows.push_back(int32_t(b.input_ids.size()) - 1);
    req_rows.push_back(s.req->row);
  }
  if (b.input_ids.empty()) {
    if (lockstep_) idle_forward();
    return;
  }
  MS_CHECK(hidden.size(0) == b.num_tokens(), "MTP observe: ", b.num_tokens(), " positions but ", hidden.size(0),
           " hidden rows");
  ForwardContext ctx = context(b);
  Tensor h = model_.mtp_hidden(ctx, hidden);
  ++forwards_;
  Tensor last = ctx.empty({int64_t(last_rows.size()), h.size(1)});
  ops::gather_rows(h, last_rows, last);
  ops::scatter_rows(last, req_rows, last_hidden_);
  const std::vector<int32_t> guesses = ops::argmax_rows(model_.mtp->head(last));
  for (size_t i = 0; i < req_rows.size(); ++i) next_guess_[size_t(req_rows[i])] = guesses[i];
}

Tensor MtpDraft::chain_step(std::span<const DraftSeq> seqs, const std::vector<int32_t>& tokens,
                            const std::vector<int32_t>& positions, const Tensor& hidden, const ReqToTokenTable& table,
                            std::vector<int32_t>& guesses) {
  ForwardBatch b = empty_batch();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const int32_t* row = table.row(seqs[i].req->row);
    b.input_ids.push_back(tokens[i]);
    b.positions.push_back(positions[i]);
    b.out_cache_loc.push_back(row[positions[i]]);  // a verify slot, scratch until observe
    close_sequence(b, row, positions[i] + 1);
  }
  Tensor h, logits;
  if (auto replayed = graphs_ ? graphs_->run(b, &hidden) : std::nullopt) {
    h = (*replayed)[0], logits = (*replayed)[1];
  } else {
    ForwardContext ctx = context(b);
    h = model_.mtp_hidden(ctx, hidden);
    logits = model_.mtp->head(h);
  }
  ++forwards_;
  guesses = ops::argmax_rows(logits);  // on the device: only the ids cross
  return h;
}

std::vector<std::vector<int32_t>> MtpDraft::propose(std::span<const DraftSeq> seqs, const ReqToTokenTable& table) {
  std::vector<std::vector<int32_t>> out(seqs.size());
  int64_t agreed = 0;  // chain forwards every rank runs: the most any rank needs
  if (lockstep_) {
    int64_t needed = 0;  // the first draft of each request comes from observe
    for (const DraftSeq& s : seqs) needed = std::max<int64_t>(needed, s.count - 1);
    const std::vector<int64_t> all = model_.groups->world->all_gather_values(needed);
    agreed = *std::max_element(all.begin(), all.end());
  }
  for (int64_t i = chain(seqs, table, out); i < agreed; ++i) idle_forward();
  return out;
}

int MtpDraft::chain(std::span<const DraftSeq> seqs, const ReqToTokenTable& table,
                    std::vector<std::vector<int32_t>>& out) {
  std::vector<size_t> active;  // sequences that want more drafts, in the row order of `hidden`
  std::vector<int32_t> rows;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].count <= 0) continue;
    out[i].push_back(next_guess_[size_t(seqs[i].req->row)]);  // from observe: no forward needed
    active.push_back(i);
    rows.push_back(seqs[i].req->row);
  }
  if (active.empty()) return 0;
  Tensor hidden = Tensor::uninit(model_.act_dtype, {int64_t(active.size()), model_.config.hidden_size}, model_.device);
  ops::gather_rows(last_hidden_, rows, hidden);
  for (int k = 1;; ++k) {  // k drafts so far; the next one comes from MTP position start + k - 1
    std::vector<size_t> still;
    std::vector<int32_t> keep;
    for (size_t j = 0; j < active.size(); ++j)
      if (seqs[active[j]].count > k) {
        still.push_back(active[j]);
        keep.push_back(int32_t(j));
      }
    if (still.empty()) return k - 1;
    if (still.size() != active.size()) hidden = take_rows(hidden, keep);
    active = std::move(still);
    std::vector<DraftSeq> step;
    std::vector<int32_t> tokens, positions, guesses;
    for (size_t i : active) {
      step.push_back(seqs[i]);
      tokens.push_back(out[i].back());
      positions.push_back(seqs[i].start + k - 1);
    }
    hidden = chain_step(step, tokens, positions, hidden, table, guesses);
    for (size_t j = 0; j < active.size(); ++j) out[active[j]].push_back(guesses[j]);
  }
}

}  // namespace ms
