#include "runtime/spec_worker.h"

#include <chrono>

#include "core/check.h"
#include "runtime/sampler.h"
#include "runtime/spec_verify.h"

namespace ms {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

void SpeculativeOptions::validate() const {
  if (!enabled()) return;
  MS_CHECK(algorithm == "NEXTN" || algorithm == "EAGLE", "--speculative-algorithm must be NEXTN or EAGLE, got \"",
           algorithm, "\"");
  MS_CHECK(num_steps >= 1, "--speculative-num-steps must be >= 1, got ", num_steps);
  MS_CHECK(eagle_topk == 1, "--speculative-eagle-topk ", eagle_topk,
           " is not supported: drafts are a chain (top-k 1); use --speculative-eagle-topk 1");
  MS_CHECK(num_draft_tokens == 0 || num_draft_tokens == num_steps + 1, "--speculative-num-draft-tokens must be ",
           "--speculative-num-steps + 1 (", num_steps + 1, ") with a chain draft, got ", num_draft_tokens);
}

SpeculativeWorker::SpeculativeWorker(ModelRunner& runner, DraftModel& draft, bool lockstep)
    : runner_(runner), draft_(draft), lockstep_(lockstep) {
  if (lockstep_) draft_.enter_lockstep();
}

void SpeculativeWorker::run_extend(const ScheduleBatch& batch, const ReqToTokenTable& table,
                                   const AppendToken& append) {
  if (lockstep_) draft_.propose({}, table);  // joins the chain forwards of peers that verify
  ForwardBatch fb = ModelRunner::build_forward_batch(batch, table);
  const Clock::time_point t0 = Clock::now();
  Tensor hidden = runner_.forward_hidden(fb);
  std::vector<int32_t> last;
  for (int s = 0; s < fb.num_seqs(); ++s) last.push_back(fb.attn.q_start[size_t(s) + 1] - 1);
  const Tensor logits = runner_.model().logits(take_rows(hidden, last));
  std::vector<const Request*> sampled;
  for (const ScheduledSeq& s : batch.seqs) sampled.push_back(s.sample ? s.req : nullptr);
  const std::vector<SampleResult> next = sample_rows(logits, sampled);
  stats_.target_seconds += seconds_since(t0);
  std::vector<DraftSeq> kept;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    if (s.sample) append(*s.req, next[i]);
    kept.push_back({s.req, s.start, s.num_tokens});
  }
  const Clock::time_point t1 = Clock::now();
  draft_.observe(kept, hidden, table);
  stats_.draft_seconds += seconds_since(t1);
}

void SpeculativeWorker::run_idle(const ReqToTokenTable& table) {
  if (lockstep_) draft_.propose({}, table);
  runner_.idle_forward();
  if (lockstep_) draft_.observe({}, Tensor(), table);
}

ForwardBatch SpeculativeWorker::verify_batch(const ScheduleBatch& batch, const std::vector<std::vector<int32_t>>& drafts,
                                             const ReqToTokenTable& table) {
  ForwardBatch fb;
  fb.attn.q_start = {0};
  fb.attn.kv_start = {0};
  fb.all_logits = true;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    MS_CHECK(int(drafts[i].size()) == s.num_tokens - 1, "draft model proposed ", drafts[i].size(), " tokens for request ",
             s.req->id, ", asked for ", s.num_tokens - 1);
    const int32_t* row = table.row(s.req->row);
    fb.input_ids.push_back(s.req->fill_at(s.start));
    fb.input_ids.insert(fb.input_ids.end(), drafts[i].begin(), drafts[i].end());
    for (int p = s.start; p < s.start + s.num_tokens; ++p) {
      fb.positions.push_back(p);
      fb.out_cache_loc.push_back(row[p]);
    }
    fb.attn.kv_slots.insert(fb.attn.kv_slots.end(), row, row + s.start + s.num_tokens);
    fb.attn.q_start.push_back(int32_t(fb.input_ids.size()));
    fb.attn.kv_start.push_back(int32_t(fb.attn.kv_slots.size()));
  }
  return fb;
}

void SpeculativeWorker::run_verify(const ScheduleBatch& batch, const ReqToTokenTable& table,
                                   const AppendToken& append) {
  std::vector<DraftSeq> want;
  for (const ScheduledSeq& s : batch.seqs) want.push_back({s.req, s.start, s.num_tokens - 1});
  const Clock::time_point t0 = Clock::now();
  const std::vector<std::vector<int32_t>> drafts = draft_.propose(want, table);
  stats_.draft_seconds += seconds_since(t0);
  MS_CHECK(drafts.size() == want.size(), "draft model answered for ", drafts.size(), " of ", want.size(), " requests");

  ForwardBatch fb = verify_batch(batch, drafts, table);
  const Clock::time_point t1 = Clock::now();
  const auto [hidden, logits] = runner_.forward_verify(fb);
  const std::vector<VerifyResult> verdicts = verify(batch, fb, logits, drafts);
  stats_.target_seconds += seconds_since(t1);
  ++stats_.verify_forwards;

  std::vector<DraftSeq> kept;
  std::vector<int32_t> kept_rows;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    const int32_t q0 = fb.attn.q_start[i];
    const VerifyResult& v = verdicts[i];
    int emitted = 0;
    for (const SampleResult& t : v.tokens) {
      ++emitted;
      if (!append(*s.req, t)) break;
    }
    record(s.num_tokens - 1, v.accepted, emitted);
    // The kept positions: the request's last token and the emitted drafts, all but the newest
    // emitted token (whose KV the next step computes).
    kept.push_back({s.req, s.start, emitted});
    for (int j = 0; j < emitted; ++j) kept_rows.push_back(q0 + j);
  }
  const Clock::time_point t2 = Clock::now();
  draft_.observe(kept, take_rows(hidden, kept_rows), table);
  stats_.draft_seconds += seconds_since(t2);
}

// Requests whose sampling is argmax_only are verified from the target's argmax of their rows,
// picked on the device (only ids cross to the host); the others' rows are copied to the host.
std::vector<VerifyResult> SpeculativeWorker::verify(const ScheduleBatch& batch, const ForwardBatch& fb,
                                                    const Tensor& logits,
                                                    const std::vector<std::vector<int32_t>>& drafts) {
  std::vector<int32_t> by_argmax, by_host;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    std::vector<int32_t>& rows = batch.seqs[i].req->sampling.argmax_only() ? by_argmax : by_host;
    for (int32_t r = fb.attn.q_start[i]; r < fb.attn.q_start[i + 1]; ++r) rows.push_back(r);
  }
  std::vector<int32_t> ids;
  if (!by_argmax.empty()) ids = ops::argmax_rows(take_rows(logits, by_argmax));
  Tensor host;
  if (!by_host.empty()) host = take_rows(logits, by_host).to_f32();
  std::vector<VerifyResult> out;
  size_t at_ids = 0, at_host = 0;  // rows of each kind used so far
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    const size_t n = size_t(s.num_tokens);
    if (s.req->sampling.argmax_only()) {
      out.push_back(verify_argmax(std::span<const int32_t>(ids).subspan(at_ids, n), drafts[i]));
      at_ids += n;
    } else {
      const int64_t V = host.size(1);
      std::span<const float> rows(host.data<float>() + int64_t(at_host) * V, n * size_t(V));
      out.push_back(verify_drafts(rows, V, *s.req, drafts[i]));
      at_host += n;
    }
  }
  return out;
}

void SpeculativeWorker::record(int drafted, int accepted, int emitted) {
  ++stats_.verified_seqs;
  stats_.drafted_tokens += drafted;
  stats_.accepted_tokens += accepted;
  stats_.emitted_tokens += emitted;
  if (stats_.accept_histogram.size() <= size_t(accepted)) stats_.accept_histogram.resize(size_t(accepted) + 1, 0);
  ++stats_.accept_histogram[size_t(accepted)];
}

SpeculativeStats SpeculativeWorker::stats() const {
  SpeculativeStats s = stats_;
  s.draft_forwards = draft_.forward_passes();
  return s;
}

}  // namespace ms
