#include "runtime/parallel_engine.h"

#include <algorithm>
#include <chrono>
#include <unordered_map>

#include "core/check.h"

namespace ms {
namespace {

// Every rank takes the same pool (the smallest any rank could hold), so that a request valid on
// one replica is valid on all. On the CPU the ranks share the host's memory: each gets its part
// of the fraction.
EngineOptions rank_options(const ParallelRunner& runner, EngineOptions o) {
  MS_CHECK(runner.config().nnodes == 1,
           "serving over several nodes is not supported; run one node (--nnodes 1) per server");
  o.cuda_graph.disable = true;  // graphs would capture the collectives; every step runs op by op
  if (o.max_total_tokens == 0 && runner.model(0).device == Device::CPU)
    o.mem_fraction_static = (o.mem_fraction_static > 0 ? o.mem_fraction_static : 0.3) / runner.num_local_ranks();
  return o;
}

void add_speculative(SpeculativeStats& total, const SpeculativeStats& s) {
  total.verify_forwards += s.verify_forwards;
  total.verified_seqs += s.verified_seqs;
  total.drafted_tokens += s.drafted_tokens;
  total.accepted_tokens += s.accepted_tokens;
  total.emitted_tokens += s.emitted_tokens;
  total.draft_forwards += s.draft_forwards;
  total.draft_seconds += s.draft_seconds;
  total.target_seconds += s.target_seconds;
  if (total.accept_histogram.size() < s.accept_histogram.size()) total.accept_histogram.resize(s.accept_histogram.size());
  for (size_t k = 0; k < s.accept_histogram.size(); ++k) total.accept_histogram[k] += s.accept_histogram[k];
}

}  // namespace

ParallelEngine::ParallelEngine(ParallelRunner& runner, const EngineOptions& options, Detokenizer detokenizer)
    : runner_(runner), options_(rank_options(runner, options)) {
  const int n = runner_.num_local_ranks();
  std::vector<int64_t> slots(size_t(n), 0);
  runner_.on_all_ranks([&](int r) { slots[size_t(r)] = Engine::pool_slots(runner_.model(r), options_); });
  options_.max_total_tokens = *std::min_element(slots.begin(), slots.end());
  engines_.resize(size_t(n));
  local_ids_.resize(size_t(n));
  runner_.on_all_ranks(
      [&](int r) { engines_[size_t(r)] = std::make_unique<Engine>(runner_.model(r), options_, detokenizer); });
  kv_slots_ = engines_[0]->kv_slots();
  group_load_.assign(size_t(runner_.dp_size()), 0);
}

ParallelEngine::~ParallelEngine() {
  stop();
  // Device memory goes back on the thread bound to its device.
  runner_.on_all_ranks([&](int r) { engines_[size_t(r)].reset(); });
}

void ParallelEngine::validate(const GenerateRequest& request) const { engines_[0]->validate(request); }

RequestId ParallelEngine::submit(GenerateRequest request, StreamCallback on_output) {
  MS_CHECK(on_output, "ParallelEngine::submit needs a callback");
  validate(request);
  std::lock_guard lk(mu_);
  MS_CHECK(!failed_, "engine failed: ", error_);
  const int group = int(std::min_element(group_load_.begin(), group_load_.end()) - group_load_.begin());
  ++group_load_[size_t(group)];
  const RequestId id = next_id_++;
  outstanding_[id] = {group, std::move(on_output)};
  inbox_.push_back({id, group, std::move(request)});
  cv_.notify_all();
  return id;
}

void ParallelEngine::abort(RequestId id) {
  std::lock_guard lk(mu_);
  aborts_.push_back(id);
  cv_.notify_all();
}

void ParallelEngine::flush_cache() {
  std::lock_guard lk(mu_);
  flush_ = true;
  cv_.notify_all();
}

void ParallelEngine::publish(uint64_t step) {
  std::lock_guard lk(mu_);
  StepInputs in;
  in.step = step;
  in.stop = stopping_;
  in.arrivals.assign(std::make_move_iterator(inbox_.begin()), std::make_move_iterator(inbox_.end()));
  inbox_.clear();
  in.aborts.swap(aborts_);
  in.flush = std::exchange(flush_, false);
  published_ = std::move(in);
  has_published_ = true;
  cv_.notify_all();
}

// Local rank 0 publishes step s + 1 only after the vote of step s, which every rank enters
// after reading step s's inputs: one published slot is enough.
ParallelEngine::StepInputs ParallelEngine::inputs_of(uint64_t step) {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return failed_ || (has_published_ && published_.step == step); });
  MS_CHECK(!failed_, "engine failed: ", error_);
  return published_;
}

// An OR over the rank threads, and the step's barrier. The ranks are threads of this process
// (one node), so a host-side vote does what a device all-gather would without a stream sync.
bool ParallelEngine::any_busy(bool mine) {
  std::unique_lock lk(mu_);
  const uint64_t round = vote_round_;
  vote_any_ = vote_any_ || mine;
  if (++vote_arrived_ == runner_.num_local_ranks()) {
    vote_result_ = vote_any_;
    vote_any_ = false, vote_arrived_ = 0, ++vote_round_;
    cv_.notify_all();
    return vote_result_;
  }
  // The next round cannot end before this rank joins it, so vote_result_ is still this round's.
  cv_.wait(lk, [&] { return failed_ || vote_round_ != round; });
  MS_CHECK(!failed_, "engine failed: ", error_);
  return vote_result_;
}

void ParallelEngine::rank_loop(int r) {
  Engine& engine = *engines_[size_t(r)];
  const ParallelGroups& pg = runner_.groups(r);
  const int group = pg.layout.attn_dp_rank % runner_.dp_size();
  const bool leader = pg.layout.attn_tp_rank == 0;
  auto& local = local_ids_[size_t(r)];  // outlives this loop: a restarted loop serves the same requests
  for (uint64_t step = 0;; ++step) {
    if (r == 0) publish(step);
    StepInputs in = inputs_of(step);
    if (in.stop) return;
    if (in.flush) engine.flush_cache();
    for (Arrival& a : in.arrivals) {
      if (a.group != group) continue;
      const RequestId id = a.id;
      local[id] = engine.submit(std::move(a.request), [this, id, leader, &local](const StreamOutput& o) {
        if (o.finished) local.erase(id);
        if (leader) deliver(id, o);
      });
    }
    for (RequestId id : in.aborts)
      if (auto it = local.find(id); it != local.end()) engine.abort(it->second);
    if (any_busy(engine.has_work())) {
      engine.step(/*forward_when_idle=*/true);
      continue;
    }
    if (r != 0) continue;  // the others wait for the next step's inputs
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return stopping_ || failed_ || !inbox_.empty() || !aborts_.empty() || flush_; });
  }
}

void ParallelEngine::deliver(RequestId id, StreamOutput o) {
  StreamCallback callback;
  {
    std::lock_guard lk(mu_);
    auto it = outstanding_.find(id);
    if (it == outstanding_.end()) return;
    callback = it->second.callback;
    if (o.finished) {
      --group_load_[size_t(it->second.group)];
      outstanding_.erase(it);
    }
  }
  o.id = id;
  callback(o);
}

// A failed rank ends every request in flight (its callers see an aborted finish, not silence).
void ParallelEngine::fail_outstanding(const std::string& why) {
  std::map<RequestId, Outstanding> gone;
  {
    std::lock_guard lk(mu_);
    failed_ = true;
    if (error_.empty()) error_ = why;
    gone.swap(outstanding_);
    std::fill(group_load_.begin(), group_load_.end(), 0);
  }
  cv_.notify_all();
  for (auto& [id, o] : gone) {
    StreamOutput out;
    out.id = id;
    out.finished = true;
    out.finish_reason = FinishReason::Abort;
    o.callback(out);
  }
}

void ParallelEngine::start() {
  std::lock_guard lk(mu_);
  if (thread_.joinable() || failed_) return;
  stopping_ = false;
  has_published_ = false;
  thread_ = std::thread([this] {
    try {
      runner_.on_all_ranks([this](int r) {
        try {
          rank_loop(r);
        } catch (const std::exception& e) {
          fail_outstanding(e.what());  // wakes the ranks waiting for inputs
          throw;
        }
      });
    } catch (const std::exception& e) {
      fail_outstanding(e.what());
    }
  });
}

void ParallelEngine::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ParallelEngine::run_until(const FinishedWait& finished) {
  start();
  while (!finished(std::chrono::milliseconds(50))) {
    std::lock_guard lk(mu_);
    MS_CHECK(!failed_, "engine failed: ", error_);
  }
}

EngineStats ParallelEngine::stats() {
  EngineStats total;
  for (int r = 0; r < runner_.num_local_ranks(); ++r) {
    if (runner_.groups(r).layout.attn_tp_rank != 0) continue;  // one replica per DP group
    const EngineStats s = engines_[size_t(r)]->stats();
    total.scheduler.extend_batches += s.scheduler.extend_batches;
    total.scheduler.decode_batches += s.scheduler.decode_batches;
    total.scheduler.retractions += s.scheduler.retractions;
    total.scheduler.extend_tokens += s.scheduler.extend_tokens;
    total.scheduler.cached_tokens += s.scheduler.cached_tokens;
    total.waiting += s.waiting, total.running += s.running;
    total.pool_capacity += s.pool_capacity, total.pool_used += s.pool_used, total.cached_slots += s.cached_slots;
    total.generated_tokens += s.generated_tokens;
    total.cuda_graph_replays += s.cuda_graph_replays;
    total.overlapped_steps += s.overlapped_steps;
    total.speculative = s.speculative;
    add_speculative(total.spec, s.spec);
  }
  return total;
}

}  // namespace ms
