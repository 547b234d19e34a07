// Continuous batching: a waiting queue and a running batch. Each step is either an extend
// (prefill) batch of waiting requests — chunked when a prompt exceeds --chunked-prefill-size —
// or a decode batch of every running request. A decode step that finds no KV slot left
// retracts the newest running requests (their KV is freed, they go back to the queue and are
// recomputed later with the tokens they already produced). The scheduler only moves requests
// and slots; the engine runs the model and the sampler between next_batch and finish_step.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "runtime/kv_manager.h"
#include "runtime/request.h"

namespace ms {

enum class SchedulePolicy { Fcfs, Lpm };  // first come first served; longest prefix match first

struct SchedulerOptions {
  int max_running_requests = 64;
  int max_prefill_tokens = 16384;  // tokens of one extend batch (a lone longer prompt still runs)
  int chunked_prefill_size = 8192;  // <= 0: no chunking
  SchedulePolicy policy = SchedulePolicy::Fcfs;
  bool enable_radix_cache = true;
  // Scales the share of each running request's remaining max_new_tokens kept free for its
  // decoding when admitting new requests (SGLang's --schedule-conservativeness); lower
  // admits more and retracts more.
  double conservativeness = 1.0;
  // Speculative decoding: draft tokens per request in a decode (verify) step, each taking a
  // slot for that step only; fewer near max_new_tokens, the context end, or when memory is
  // short. 0: plain decoding.
  int speculative_num_steps = 0;
};

enum class ForwardMode { Extend, Decode };

// One sequence of a step: tokens [start, start + num_tokens) of the request's fill_ids(); in
// a speculative decode step, its last token and num_tokens - 1 draft tokens after it.
struct ScheduledSeq {
  Request* req;
  int start;
  int num_tokens;
  bool sample;  // reaches the end of fill_ids: its last logits choose the next token
};

struct ScheduleBatch {
  ForwardMode mode = ForwardMode::Decode;
  std::vector<ScheduledSeq> seqs;
  std::vector<int32_t> out_cache_loc;  // the slots of this step's tokens, sequence after sequence
  // Empty because the decode step must retract, which needs the tokens still in flight first.
  bool needs_pending = false;
  bool empty() const { return seqs.empty(); }
  int num_tokens() const { return int(out_cache_loc.size()); }
};

struct SchedulerStats {
  int64_t extend_batches = 0, decode_batches = 0, retractions = 0, extend_tokens = 0, cached_tokens = 0;
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, int64_t num_slots, int context_len);

  // Queues a request (validated by the caller: it must fit the pool and the context alone).
  void add(std::unique_ptr<Request> r);
  // Removes a waiting or running request and frees all it held; null when it is not here.
  std::unique_ptr<Request> abort(RequestId id);
  // The next step's batch (empty when there is nothing to do). Requests may still have tokens
  // in flight (pending_ids): a decode step computes on them, and leaves out requests that
  // already finished or reach max_new_tokens with them.
  ScheduleBatch next_batch();
  // Plain decoding, in two halves so that the next batch can be scheduled while this one runs:
  // launch_step once the batch's forward and sampling are issued — advances the requests' KV,
  // caches chunk boundaries, and gives every sampled sequence a pending token (the placeholder
  // for row i of the step's sampled ids, i its index in the batch); complete_step once those
  // tokens were resolved (appended and checked, or dropped) — hands back the requests that
  // finished and have nothing left in flight.
  void launch_step(const ScheduleBatch& batch);
  std::vector<std::unique_ptr<Request>> complete_step(const ScheduleBatch& batch);
  // Speculative decoding, after the batch ran and each sampled token was appended and checked
  // (check_finish): advances the requests' KV, caches chunk boundaries, frees the slots of
  // rejected draft tokens, and hands back the finished requests.
  std::vector<std::unique_ptr<Request>> finish_step(const ScheduleBatch& batch);
  // Empties the radix cache; only while idle.
  void flush_cache();

  bool idle() const { return live_.empty(); }
  int num_waiting() const { return int(waiting_.size()); }
  int num_running() const { return int(running_.size()) + (chunked_ ? 1 : 0); }
  const KvManager& kv() const { return kv_; }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  ScheduleBatch extend_batch();
  ScheduleBatch decode_batch();
  bool try_add_to_extend(Request& r, ScheduleBatch& b, int& rem_input, int& rem_chunk, int64_t& reserved);
  std::vector<Request*> waiting_in_policy_order();
  void retract(Request& r);
  int64_t decode_reserve() const;  // slots kept for running requests' future tokens
  int64_t reserve_of(const Request& r) const;
  int draft_count(const Request& r, int64_t& budget) const;  // drafts r verifies this step
  void enqueue(Request* r);  // waiting queue, kept in arrival order
  void advance(const ScheduledSeq& s, ForwardMode mode);  // this step's KV is r's
  void retire(Request* r, std::vector<std::unique_ptr<Request>>& done);

  SchedulerOptions options_;
  KvManager kv_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> live_;
  std::deque<Request*> waiting_;
  std::vector<Request*> running_;
  Request* chunked_ = nullptr;  // a prompt part-way through chunked prefill
  double new_token_ratio_, min_token_ratio_, token_ratio_decay_;
  SchedulerStats stats_;
};

}  // namespace ms
