// The scheduler without a model: a fake "model" appends a token that depends only on the
// request and its step, so a lost or duplicated step shows in the outputs. Checked after every
// step: the budgets, and that every slot is owned exactly once (free, cached, or held).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "runtime/scheduler.h"

namespace ms {
namespace {

int32_t fake_token(RequestId id, size_t step) { return int32_t(2 + (id * 31 + step * 7) % 97); }

class Driver {
 public:
  Driver(const SchedulerOptions& o, int64_t slots, int context = 4096) : sched_(o, slots, context) {}

  Request* add(int prompt_len, int max_new, int first_token = 0) {
    auto r = std::make_unique<Request>();
    r->id = r->arrival = next_id_++;
    for (int i = 0; i < prompt_len; ++i) r->input_ids.push_back(int32_t(first_token + i % 50));
    r->sampling.max_new_tokens = max_new;
    r->sampling.ignore_eos = true;
    Request* raw = r.get();
    live_.insert(raw);
    sched_.add(std::move(r));
    return raw;
  }

  // One step; returns the batch it ran (its seqs' pointers stay valid: finished requests are
  // kept in done_).
  ScheduleBatch step() {
    ScheduleBatch b = sched_.next_batch();
    for (const ScheduledSeq& s : b.seqs) {
      if (s.req->admitted_once && !first_admission_.count(s.req->id)) first_admission_[s.req->id] = steps_;
      if (!s.sample) continue;
      s.req->output_ids.push_back(fake_token(s.req->id, s.req->output_ids.size()));
      check_finish(*s.req, eos_, {});
    }
    for (auto& r : sched_.finish_step(b)) {
      live_.erase(r.get());
      done_.push_back(std::move(r));
    }
    ++steps_;
    check_slot_ownership();
    return b;
  }

  // Every slot is free, in the radix tree, or held by exactly one live request.
  void check_slot_ownership() const {
    const KvManager& kv = sched_.kv();
    int64_t held = 0;
    std::set<int32_t> seen;
    for (const Request* r : live_) {
      if (r->row < 0) continue;
      const int32_t* row = kv.table().row(r->row);
      for (int i = r->prefix_len; i < r->kv_len; ++i) {
        ASSERT_TRUE(seen.insert(row[i]).second) << "slot " << row[i] << " held twice";
        ++held;
      }
    }
    const int64_t cached = kv.radix() ? kv.radix()->total_size() : 0;
    // Slots allocated for a step that has not run are in no request's kv_len yet; step()
    // always finishes its batch, so none exist between steps.
    ASSERT_EQ(kv.pool().used(), held + cached);
  }

  void run(int max_steps = 100000) {
    for (int i = 0; i < max_steps && !sched_.idle(); ++i) step();
    ASSERT_TRUE(sched_.idle()) << "requests left after " << max_steps << " steps";
  }

  Scheduler sched_;
  std::set<Request*> live_;
  std::vector<std::unique_ptr<Request>> done_;
  std::map<RequestId, int> first_admission_;
  std::vector<int> eos_;
  RequestId next_id_ = 1;
  int steps_ = 0;
};

void expect_complete(const Request& r) {
  ASSERT_EQ(int(r.output_ids.size()), r.sampling.max_new_tokens) << "request " << r.id;
  for (size_t s = 0; s < r.output_ids.size(); ++s)
    ASSERT_EQ(r.output_ids[s], fake_token(r.id, s)) << "request " << r.id << " step " << s;
  EXPECT_EQ(r.finish, FinishReason::Length);
}

TEST(Scheduler, BudgetsAreRespected) {
  SchedulerOptions o;
  o.max_running_requests = 5;
  o.max_prefill_tokens = 48;
  o.chunked_prefill_size = 32;
  Driver d(o, 600);
  std::mt19937 rng(7);
  for (int i = 0; i < 30; ++i) d.add(std::uniform_int_distribution<int>(1, 90)(rng), std::uniform_int_distribution<int>(1, 12)(rng));
  int extend = 0, decode = 0, chunked = 0;
  while (!d.sched_.idle()) {
    ScheduleBatch b = d.step();
    ASSERT_FALSE(b.empty());
    ASSERT_LE(d.sched_.num_running(), o.max_running_requests);
    ASSERT_LE(int(b.seqs.size()), o.max_running_requests);
    if (b.mode == ForwardMode::Extend) {
      ++extend;
      ASSERT_LE(b.num_tokens(), o.chunked_prefill_size);
      ASSERT_LE(b.num_tokens(), o.max_prefill_tokens);
      for (const ScheduledSeq& s : b.seqs) chunked += !s.sample;
    } else {
      ++decode;
      ASSERT_EQ(b.num_tokens(), int(b.seqs.size()));
    }
  }
  EXPECT_GT(extend, 0);
  EXPECT_GT(decode, 0);
  EXPECT_GT(chunked, 0) << "prompts over 32 tokens must have been chunked";
  for (const auto& r : d.done_) expect_complete(*r);
  EXPECT_EQ(d.done_.size(), 30u);
  EXPECT_EQ(d.sched_.kv().pool().used(), d.sched_.kv().radix()->total_size());
}

TEST(Scheduler, PrefillBudgetWithoutChunking) {
  SchedulerOptions o;
  o.max_prefill_tokens = 20;
  o.chunked_prefill_size = 0;
  Driver d(o, 1000);
  for (int len : {8, 8, 8, 50, 3}) d.add(len, 2);
  ScheduleBatch first = d.step();
  EXPECT_EQ(first.seqs.size(), 2u);  // 8 + 8 fits in 20 tokens, a third 8 does not
  while (!d.sched_.idle()) {
    ScheduleBatch b = d.step();
    // A lone prompt longer than the budget still runs, alone.
    if (b.mode == ForwardMode::Extend && b.num_tokens() > o.max_prefill_tokens) EXPECT_EQ(b.seqs.size(), 1u);
  }
  for (const auto& r : d.done_) expect_complete(*r);
}

// Under fcfs a request is admitted no later than any request that arrived after it, even when
// long requests keep the running batch full.
TEST(Scheduler, FcfsAdmitsInArrivalOrderWithoutStarvation) {
  SchedulerOptions o;
  o.max_running_requests = 3;
  o.policy = SchedulePolicy::Fcfs;
  Driver d(o, 2000);
  std::mt19937 rng(3);
  for (int wave = 0; wave < 6; ++wave) {
    for (int i = 0; i < 5; ++i) d.add(std::uniform_int_distribution<int>(1, 40)(rng), std::uniform_int_distribution<int>(1, 30)(rng));
    for (int s = 0; s < 15 && !d.sched_.idle(); ++s) d.step();
  }
  d.run();
  ASSERT_EQ(d.done_.size(), 30u);
  for (RequestId id = 2; id <= 30; ++id) EXPECT_LE(d.first_admission_.at(id - 1), d.first_admission_.at(id)) << id;
  for (const auto& r : d.done_) expect_complete(*r);
}

TEST(Scheduler, LpmPrefersTheLongestCachedPrefix) {
  SchedulerOptions o;
  o.max_running_requests = 1;
  o.policy = SchedulePolicy::Lpm;
  Driver d(o, 2000);
  Request* warm = d.add(40, 1, /*first_token=*/100);
  d.run();
  EXPECT_EQ(warm->cached_tokens, 0);
  Request* cold = d.add(40, 1, /*first_token=*/300);
  Request* hot = d.add(40, 1, /*first_token=*/100);  // same prompt as `warm`: cached
  ScheduleBatch b = d.step();
  ASSERT_EQ(b.seqs.size(), 1u);
  EXPECT_EQ(b.seqs[0].req, hot) << "lpm must pick the cached prompt although it arrived later";
  d.run();
  EXPECT_EQ(hot->cached_tokens, 39);
  EXPECT_EQ(cold->cached_tokens, 0);
}

TEST(Scheduler, RetractionRecomputesAndReturnsEverySlot) {
  for (bool radix : {false, true}) {
    SchedulerOptions o;
    o.max_running_requests = 16;
    o.enable_radix_cache = radix;
    o.conservativeness = 0.0;  // admit optimistically, so decode runs out of slots
    Driver d(o, 260);
    for (int i = 0; i < 12; ++i) d.add(10 + i * 3, 40);
    while (!d.sched_.idle()) {
      std::set<Request*> was_running;
      for (Request* r : d.live_)
        if (r->state == RequestState::Running) was_running.insert(r);
      d.step();
      // Retraction takes the newest: every request sent back arrived after every one kept.
      RequestId newest_kept = 0, oldest_retracted = ~RequestId(0);
      for (Request* r : was_running) {
        if (r->state == RequestState::Waiting) oldest_retracted = std::min(oldest_retracted, r->arrival);
        if (r->state == RequestState::Running) newest_kept = std::max(newest_kept, r->arrival);
      }
      ASSERT_LT(newest_kept, oldest_retracted);
    }
    EXPECT_GT(d.sched_.stats().retractions, 0) << "radix " << radix;
    ASSERT_EQ(d.done_.size(), 12u);
    std::set<RequestId> ids;
    for (const auto& r : d.done_) {
      expect_complete(*r);
      EXPECT_TRUE(ids.insert(r->id).second) << "request " << r->id << " finished twice";
    }
    const KvManager& kv = d.sched_.kv();
    EXPECT_EQ(kv.pool().used(), radix ? kv.radix()->total_size() : 0);
    EXPECT_EQ(kv.free_rows(), o.max_running_requests);
    d.sched_.flush_cache();
    EXPECT_EQ(kv.pool().used(), 0) << "radix " << radix;
  }
}

TEST(Scheduler, AbortFreesWaitingRunningAndChunkedRequests) {
  SchedulerOptions o;
  o.chunked_prefill_size = 8;
  o.max_running_requests = 2;
  Driver d(o, 500);
  Request* running = d.add(5, 50);
  Request* chunked = d.add(30, 5);
  Request* waiting = d.add(5, 5);
  d.step();  // prefill: `running` whole, `chunked` its first 3 tokens
  d.step();
  ASSERT_EQ(running->state, RequestState::Running);
  ASSERT_GT(chunked->kv_len, 0);
  ASSERT_LT(chunked->kv_len, 30);
  ASSERT_EQ(waiting->state, RequestState::Waiting);
  for (Request* r : {running, chunked, waiting}) {
    std::unique_ptr<Request> out = d.sched_.abort(r->id);
    ASSERT_NE(out, nullptr);
    EXPECT_EQ(out->finish, FinishReason::Abort);
    EXPECT_EQ(out->row, -1);
    d.live_.erase(r);
    d.check_slot_ownership();
  }
  EXPECT_EQ(d.sched_.abort(12345), nullptr);
  EXPECT_TRUE(d.sched_.idle());
  d.sched_.flush_cache();
  EXPECT_EQ(d.sched_.kv().pool().used(), 0);
  EXPECT_TRUE(d.sched_.next_batch().empty());
}

TEST(Scheduler, StopTokenEndsARequestEarly) {
  SchedulerOptions o;
  Driver d(o, 100);
  Request* r = d.add(4, 20);
  r->sampling.ignore_eos = false;
  d.eos_ = {fake_token(r->id, 3)};
  d.run();
  EXPECT_EQ(r->output_ids.size(), 4u);
  EXPECT_EQ(r->finish, FinishReason::Stop);
}

}  // namespace
}  // namespace ms
