#include "runtime/scheduler.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "core/check.h"

namespace ms {

// SGLang's defaults: keep 70% of each running request's remaining tokens free at first, relax
// to 10% over 600 decode steps while nothing is retracted, and go back up after a retraction.
static constexpr double kInitTokenRatio = 0.7, kMinTokenRatio = 0.1, kRatioDecaySteps = 600;
static constexpr size_t kLpmMaxQueue = 128;

Scheduler::Scheduler(const SchedulerOptions& o, int64_t num_slots, int context_len)
    : options_(o), kv_(num_slots, std::max(o.max_running_requests, 1), context_len, o.enable_radix_cache) {
  MS_CHECK(o.max_running_requests >= 1, "--max-running-requests must be >= 1, got ", o.max_running_requests);
  MS_CHECK(o.max_prefill_tokens >= 1, "--max-prefill-tokens must be >= 1, got ", o.max_prefill_tokens);
  MS_CHECK(o.conservativeness >= 0, "--schedule-conservativeness must be >= 0, got ", o.conservativeness);
  new_token_ratio_ = std::min(1.0, kInitTokenRatio * o.conservativeness);
  min_token_ratio_ = std::min(new_token_ratio_, kMinTokenRatio * o.conservativeness);
  token_ratio_decay_ = (new_token_ratio_ - min_token_ratio_) / kRatioDecaySteps;
}

void Scheduler::enqueue(Request* r) {
  auto at = std::upper_bound(waiting_.begin(), waiting_.end(), r,
                             [](const Request* a, const Request* b) { return a->arrival < b->arrival; });
  waiting_.insert(at, r);
  r->state = RequestState::Waiting;
}

void Scheduler::add(std::unique_ptr<Request> r) {
  MS_CHECK(!live_.count(r->id), "request id ", r->id, " is already queued");
  Request* raw = r.get();
  live_.emplace(r->id, std::move(r));
  enqueue(raw);
}

std::unique_ptr<Request> Scheduler::abort(RequestId id) {
  auto it = live_.find(id);
  if (it == live_.end()) return nullptr;
  Request* r = it->second.get();
  if (chunked_ == r) chunked_ = nullptr;
  std::erase(running_, r);
  std::erase(waiting_, r);
  kv_.release(*r, /*cache=*/false);
  r->finish = FinishReason::Abort;
  r->state = RequestState::Finished;
  std::unique_ptr<Request> out = std::move(it->second);
  live_.erase(it);
  return out;
}

int64_t Scheduler::reserve_of(const Request& r) const {
  const int remaining = std::max(0, r.sampling.max_new_tokens - r.produced());
  return int64_t(std::ceil(remaining * new_token_ratio_));
}

int64_t Scheduler::decode_reserve() const {
  int64_t total = chunked_ ? reserve_of(*chunked_) + (chunked_->fill_len() - chunked_->kv_len) : 0;
  for (const Request* r : running_) total += reserve_of(*r);
  return total;
}

ScheduleBatch Scheduler::next_batch() {
  ScheduleBatch b = extend_batch();
  if (!b.empty()) {
    ++stats_.extend_batches;
    stats_.extend_tokens += b.num_tokens();
    return b;
  }
  b = decode_batch();
  if (!b.empty()) ++stats_.decode_batches;
  return b;
}

std::vector<Request*> Scheduler::waiting_in_policy_order() {
  std::vector<Request*> order(waiting_.begin(), waiting_.end());
  RadixCache* radix = kv_.radix();
  // Matching every waiting prompt each step costs O(queue x prompt); past a long queue lpm
  // falls back to fcfs, as SGLang does.
  if (options_.policy != SchedulePolicy::Lpm || !radix || order.size() < 2 || order.size() > kLpmMaxQueue) return order;
  std::unordered_map<const Request*, size_t> matched;
  for (const Request* r : order) {
    const std::vector<int32_t> ids = r->fill_ids();
    matched[r] = radix->match_prefix(std::span<const int32_t>(ids.data(), ids.size() - 1)).slots.size();
  }
  std::stable_sort(order.begin(), order.end(), [&](const Request* a, const Request* b) { return matched[a] > matched[b]; });
  return order;
}

ScheduleBatch Scheduler::extend_batch() {
  ScheduleBatch b;
  b.mode = ForwardMode::Extend;
  int rem_input = options_.max_prefill_tokens;
  int rem_chunk = options_.chunked_prefill_size > 0 ? options_.chunked_prefill_size : INT_MAX;
  if (chunked_) {
    Request& r = *chunked_;
    const int rest = r.fill_len() - r.kv_len;
    const int n = int(std::min<int64_t>({rest, rem_chunk, kv_.available()}));
    if (n <= 0) return b;  // no memory: decode steps finish or retract others first
    MS_ASSERT(kv_.extend(r, n, b.out_cache_loc));
    b.seqs.push_back({&r, r.kv_len, n, n == rest});
    if (n < rest) return b;
    rem_input -= n;
    rem_chunk -= n;
  }
  int64_t reserved = 0;
  for (Request* r : waiting_in_policy_order())
    if (!try_add_to_extend(*r, b, rem_input, rem_chunk, reserved)) break;
  return b;
}

// Admits r into the extend batch when the request, batch and memory budgets allow; false
// stops admission for this step (fcfs never lets a later request overtake a blocked one).
bool Scheduler::try_add_to_extend(Request& r, ScheduleBatch& b, int& rem_input, int& rem_chunk, int64_t& reserved) {
  const bool chunking = options_.chunked_prefill_size > 0;
  if (int(running_.size() + b.seqs.size()) >= options_.max_running_requests) return false;
  if (rem_input <= 0 || rem_chunk <= 0 || kv_.free_rows() == 0) return false;
  kv_.admit(r);
  const int extend_len = r.fill_len() - r.kv_len;
  const bool alone = running_.empty() && b.seqs.empty();
  int n = extend_len;
  if (chunking && n > rem_chunk) n = rem_chunk;
  const bool over_input = !chunking && n > rem_input && !alone;
  // A lone request always fits (submission checked it against the whole pool); others must
  // leave room for what the running requests and this one will still decode.
  const int64_t headroom = kv_.available() - decode_reserve() - reserved;
  const bool over_memory = !alone && extend_len + reserve_of(r) > headroom;
  if (over_input || over_memory || !kv_.extend(r, n, b.out_cache_loc)) {
    kv_.release(r, /*cache=*/false);
    return false;
  }
  std::erase(waiting_, &r);
  if (!r.admitted_once) {
    r.admitted_once = true;
    r.cached_tokens = r.prefix_len;
    stats_.cached_tokens += r.prefix_len;
  }
  b.seqs.push_back({&r, r.kv_len, n, n == extend_len});
  rem_input -= n;
  rem_chunk -= n;
  reserved += reserve_of(r) + (extend_len - n);
  if (n < extend_len) {
    chunked_ = &r;
    return false;
  }
  return true;
}

// A request whose last token is in flight decodes on it, unless it is known to end there.
static bool decodes(const Request& r) {
  return !r.finished() && r.produced() < r.sampling.max_new_tokens;
}

ScheduleBatch Scheduler::decode_batch() {
  ScheduleBatch b;
  b.mode = ForwardMode::Decode;
  if (running_.empty()) return b;
  const auto decoding = [&] { return std::count_if(running_.begin(), running_.end(), [](const Request* r) { return decodes(*r); }); };
  if (kv_.available() < int64_t(decoding()) &&
      std::any_of(running_.begin(), running_.end(), [](const Request* r) { return !r->pending_ids.empty(); })) {
    b.needs_pending = true;  // a retracted request's cached tokens must be real ones
    return b;
  }
  // Retract the newest requests until every running one gets its slot; a prompt part-way
  // through chunked prefill is a candidate too (it may hold the memory the others need).
  while (kv_.available() < int64_t(decoding())) {
    Request* victim = chunked_;
    for (Request* r : running_)
      if (running_.size() > 1 && (!victim || r->arrival > victim->arrival)) victim = r;
    if (!victim) break;
    retract(*victim);
  }
  MS_CHECK(kv_.available() >= int64_t(decoding()), "KV pool exhausted: request ", running_[0]->id,
           " cannot decode alone in ", kv_.capacity(), " slots");
  int64_t draft_budget = kv_.available() - int64_t(decoding());
  for (Request* r : running_) {
    if (!decodes(*r)) continue;
    MS_ASSERT(r->kv_len == r->fill_len() - 1);
    const int drafts = draft_count(*r, draft_budget);
    MS_ASSERT(kv_.extend_speculative(*r, 1 + drafts, b.out_cache_loc));
    b.seqs.push_back({r, r->kv_len, 1 + drafts, true});
  }
  new_token_ratio_ = std::max(min_token_ratio_, new_token_ratio_ - token_ratio_decay_);
  return b;
}

// No more than the request can still emit after its verified token, than its row and the
// context hold, or than the slots left once every running request has its own.
int Scheduler::draft_count(const Request& r, int64_t& budget) const {
  if (options_.speculative_num_steps <= 0) return 0;
  const int remaining = r.sampling.max_new_tokens - int(r.output_ids.size());
  const int64_t n = std::min<int64_t>({options_.speculative_num_steps, remaining - 1,
                                       kv_.context_len() - r.fill_len(), budget});
  if (n <= 0) return 0;
  budget -= n;
  return int(n);
}

void Scheduler::retract(Request& r) {
  std::erase(running_, &r);
  if (chunked_ == &r) chunked_ = nullptr;
  kv_.release(r, /*cache=*/true);  // its tokens stay matchable until the pool needs them
  ++r.retractions;
  ++stats_.retractions;
  enqueue(&r);
  new_token_ratio_ = std::min(1.0, kInitTokenRatio * options_.conservativeness);
}

void Scheduler::advance(const ScheduledSeq& s, ForwardMode mode) {
  Request* r = s.req;
  MS_ASSERT(r->kv_len == s.start);
  r->kv_len += s.num_tokens;
  if (!s.sample) {
    kv_.cache_chunk(*r);
    return;
  }
  if (r == chunked_) chunked_ = nullptr;
  if (mode == ForwardMode::Extend) {
    r->state = RequestState::Running;
    running_.push_back(r);
  }
}

void Scheduler::retire(Request* r, std::vector<std::unique_ptr<Request>>& done) {
  std::erase(running_, r);
  kv_.release(*r, /*cache=*/true);
  r->state = RequestState::Finished;
  auto it = live_.find(r->id);
  done.push_back(std::move(it->second));
  live_.erase(it);
}

void Scheduler::launch_step(const ScheduleBatch& batch) {
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const ScheduledSeq& s = batch.seqs[i];
    MS_ASSERT(s.num_tokens == 1 || batch.mode == ForwardMode::Extend);
    advance(s, batch.mode);
    if (s.sample) s.req->pending_ids.push_back(-int32_t(i) - 1);
  }
}

std::vector<std::unique_ptr<Request>> Scheduler::complete_step(const ScheduleBatch& batch) {
  std::vector<std::unique_ptr<Request>> done;
  for (const ScheduledSeq& s : batch.seqs) {
    Request* r = s.req;
    if (!s.sample || !r->finished() || !r->pending_ids.empty()) continue;
    MS_CHECK(r->kv_len >= r->fill_len() - 1, "request ", r->id, ": its KV is behind its tokens");
    retire(r, done);
  }
  return done;
}

std::vector<std::unique_ptr<Request>> Scheduler::finish_step(const ScheduleBatch& batch) {
  std::vector<std::unique_ptr<Request>> done;
  for (const ScheduledSeq& s : batch.seqs) {
    Request* r = s.req;
    // A verify's request is running already: advance only adds requests that end an extend.
    advance(s, batch.mode);
    if (!s.sample) continue;
    if (batch.mode == ForwardMode::Decode && s.num_tokens > 1) {
      // A speculative verify: keep the KV of the tokens before the newest one, free the rest.
      MS_CHECK(r->fill_len() - 1 > s.start && r->fill_len() - 1 <= r->kv_len, "request ", r->id, ": ",
               r->fill_len() - 1 - s.start, " tokens appended after verifying ", s.num_tokens);
      kv_.rollback(*r, r->fill_len() - 1);
    }
    MS_CHECK(r->kv_len == r->fill_len() - 1, "request ", r->id, ": no token was appended after its step");
    if (r->finished()) retire(r, done);
  }
  return done;
}

void Scheduler::flush_cache() {
  MS_CHECK(idle(), "cannot flush the cache while ", live_.size(), " requests are in flight");
  kv_.flush();
}

}  // namespace ms
