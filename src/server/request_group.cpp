#include "server/request_group.h"

#include "server/api_error.h"

namespace ms::server {

using Clock = std::chrono::steady_clock;

struct RequestGroup::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ChoiceEvent> events;
  size_t unfinished = 0;
  struct Timing {
    Clock::time_point submitted, last;
    bool started = false;
  };
  std::vector<Timing> timing;
};

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

RequestGroup::RequestGroup(EngineApi& engine, Metrics& metrics, const std::atomic<bool>& stopping)
    : engine_(engine), metrics_(metrics), stopping_(stopping), state_(std::make_shared<State>()) {}

RequestGroup::~RequestGroup() { abort(); }

void RequestGroup::submit(std::vector<GenerateRequest> requests) {
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      engine_.validate(requests[i]);
    } catch (const Error& e) {
      throw ApiError(400, e.what(), "invalid_request_error");
    }
  }
  {
    std::lock_guard lk(state_->mu);
    state_->unfinished = requests.size();
    state_->timing.assign(requests.size(), {Clock::now(), Clock::now(), false});
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    metrics_.request_received();
    auto callback = [state = state_, metrics = &metrics_, i](const StreamOutput& o) {
      const auto now = Clock::now();
      std::lock_guard lk(state->mu);
      State::Timing& t = state->timing[i];
      int tokens = int(o.new_ids.size());
      if (!t.started && tokens > 0) {
        metrics->first_token(seconds(now - t.submitted));
        t.started = true, --tokens;
      }
      metrics->tokens_arrived(seconds(now - t.last), tokens);
      t.last = now;
      if (o.finished) {
        metrics->request_finished(seconds(now - t.submitted), o.prompt_tokens, o.completion_tokens, o.cached_tokens,
                                  o.finish_reason == FinishReason::Abort);
        --state->unfinished;
      }
      state->events.push_back({i, o});
      state->cv.notify_all();
    };
    ids_.push_back(engine_.submit(std::move(requests[i]), std::move(callback)));
  }
}

std::vector<ChoiceEvent> RequestGroup::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lk(state_->mu);
  state_->cv.wait_for(lk, timeout, [&] { return !state_->events.empty() || stopping_.load(); });
  std::vector<ChoiceEvent> out(std::make_move_iterator(state_->events.begin()),
                               std::make_move_iterator(state_->events.end()));
  state_->events.clear();
  const bool stop = stopping_.load() && state_->unfinished > 0;
  lk.unlock();
  if (stop) abort();  // the outputs of the abort arrive at the next wait
  return out;
}

std::vector<ChoiceEvent> RequestGroup::wait_all() {
  std::vector<ChoiceEvent> all;
  while (!done()) {
    auto some = wait(std::chrono::milliseconds(100));
    all.insert(all.end(), std::make_move_iterator(some.begin()), std::make_move_iterator(some.end()));
  }
  return all;
}

bool RequestGroup::done() const {
  std::lock_guard lk(state_->mu);
  return state_->unfinished == 0 && state_->events.empty();
}

void RequestGroup::abort() {
  {
    std::lock_guard lk(state_->mu);
    if (state_->unfinished == 0) return;
  }
  for (RequestId id : ids_) engine_.abort(id);  // finished ids are ignored by the engine
}

}  // namespace ms::server
