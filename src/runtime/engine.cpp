#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/check.h"
#include "runtime/sampler.h"
#include "runtime/spec_mtp_draft.h"

namespace ms {
namespace {

// The draft pays its KV from the same budget: every slot holds the target's and the draft's.
int64_t slots_with_draft(const CausalLM& model, const EngineOptions& o, const DraftModel* draft) {
  KvBudget b;
  b.max_total_tokens = o.max_total_tokens;
  b.mem_fraction_static = o.mem_fraction_static > 0 ? o.mem_fraction_static : model.device == Device::CPU ? 0.3 : 0.88;
  b.max_running_requests = o.scheduler.max_running_requests;
  b.context_len = model.config.max_position_embeddings;
  const size_t per_slot = ModelRunner::bytes_per_slot(model) + (draft ? draft->kv_bytes_per_slot() : 0);
  return kv_pool_slots(b, per_slot, o.max_total_tokens > 0 ? MemoryInfo{} : device_memory_info(model.device));
}

uint64_t mix_seed(uint64_t seed, uint64_t id) {
  uint64_t x = seed ^ (id * 0x9E3779B97F4A7C15ull);
  x = (x ^ (x >> 31)) * 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 29);
}

// No decode batch is larger than the running requests: no graph beyond them is captured.
CudaGraphSettings graph_settings(const EngineOptions& o) {
  CudaGraphSettings g = o.cuda_graph;
  g.max_bs = std::min(g.max_bs, o.scheduler.max_running_requests);
  return g;
}

// With speculation the target's decode steps are verifies of the token and its drafts: its
// graphs are captured for those (a step with fewer drafts for some request runs op by op).
int verify_tokens(const EngineOptions& o) { return o.speculative.enabled() ? o.speculative.num_steps + 1 : 0; }

std::unique_ptr<DraftModel> make_draft(const CausalLM& model, const EngineOptions& o, std::unique_ptr<DraftModel> given) {
  o.speculative.validate();
  if (!o.speculative.enabled()) {
    MS_CHECK(!given, "a draft model was given but speculative decoding is off (set --speculative-algorithm)");
    return nullptr;
  }
  return given ? std::move(given) : std::make_unique<MtpDraft>(model, o.bf16_activations, graph_settings(o));
}

// A shard of a model (several ranks): its forwards join collectives that every rank must enter
// in the same order, so every rank's speculative step runs the same sequence of forwards.
bool in_lockstep(const CausalLM& model) { return model.groups && model.groups->world->size() > 1; }

bool overlaps(const EngineOptions& o) { return !o.disable_overlap_schedule && !o.speculative.enabled(); }

SchedulerOptions scheduler_options(const EngineOptions& o) {
  SchedulerOptions s = o.scheduler;
  s.speculative_num_steps = o.speculative.enabled() ? o.speculative.num_steps : 0;
  return s;
}

}  // namespace

Engine::Engine(const CausalLM& model, const EngineOptions& options, Detokenizer detokenizer,
               std::unique_ptr<DraftModel> draft)
    : model_(model),
      options_(options),
      detok_(std::move(detokenizer)),
      draft_(make_draft(model, options, std::move(draft))),
      runner_(model, slots_with_draft(model, options, draft_.get()), options.bf16_activations, graph_settings(options),
              verify_tokens(options), overlaps(options) ? options.scheduler.max_running_requests : 0),
      scheduler_(scheduler_options(options), runner_.num_slots(),
                 int(std::min<int64_t>(model.config.max_position_embeddings, runner_.num_slots()))),
      overlap_(overlaps(options)) {
  if (overlap_)
    for (auto& r : readbacks_) r = ops::make_host_readback(model.device, options.scheduler.max_running_requests);
  if (!draft_) return;
  draft_->attach(runner_.num_slots(), scheduler_.kv().table().rows());
  spec_ = std::make_unique<SpeculativeWorker>(runner_, *draft_, in_lockstep(model));
}

Engine::~Engine() { stop(); }

int64_t Engine::pool_slots(const CausalLM& model, const EngineOptions& options) {
  const std::unique_ptr<DraftModel> draft = make_draft(model, options, nullptr);
  return slots_with_draft(model, options, draft.get());
}

void Engine::validate(const GenerateRequest& g) const {
  const int vocab = model_.config.vocab_size;
  MS_CHECK(!g.input_ids.empty(), "input_ids is empty");
  for (int32_t id : g.input_ids)
    MS_CHECK(id >= 0 && id < vocab, "input_ids: token id ", id, " is out of range (vocab_size ", vocab, ")");
  g.sampling.validate(vocab);
  const int64_t need = int64_t(g.input_ids.size()) + g.sampling.max_new_tokens;
  MS_CHECK(need <= model_.config.max_position_embeddings, "prompt (", g.input_ids.size(), " tokens) + max_new_tokens (",
           g.sampling.max_new_tokens, ") exceeds the context length ", model_.config.max_position_embeddings);
  MS_CHECK(need <= kv_slots(), "prompt + max_new_tokens needs ", need, " KV slots but the pool has ", kv_slots(),
           "; raise --max-total-tokens");
  MS_CHECK(g.sampling.stop.empty() || detok_, "stop strings need a tokenizer; use stop_token_ids");
}

RequestId Engine::submit(GenerateRequest g, StreamCallback on_output) {
  validate(g);
  auto r = std::make_unique<Request>();
  r->input_ids = std::move(g.input_ids);
  r->sampling = std::move(g.sampling);
  RequestId id;
  {
    std::lock_guard lk(inbox_mu_);
    id = r->id = r->arrival = next_id_++;
    r->rng_seed = r->sampling.seed.value_or(mix_seed(options_.random_seed, id));
    inbox_.push_back({std::move(r), std::move(on_output)});
  }
  inbox_cv_.notify_all();
  return id;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard lk(inbox_mu_);
    aborts_.push_back(id);
  }
  inbox_cv_.notify_all();
}

// Hands the tokens r produced since its last report to its callback (or to poll()).
void Engine::report(Request& r) {
  StreamOutput o;
  o.id = r.id;
  o.new_ids.assign(r.output_ids.begin() + r.streamed, r.output_ids.end());
  if (!r.output_logprobs.empty())
    o.new_logprobs.assign(r.output_logprobs.begin() + r.streamed, r.output_logprobs.end());
  r.streamed = int(r.output_ids.size());
  o.finished = r.finished();
  o.finish_reason = r.finish;
  o.matched_stop = r.matched_stop;
  o.prompt_tokens = int(r.input_ids.size());
  o.completion_tokens = int(r.output_ids.size());
  o.cached_tokens = r.cached_tokens;
  if (o.new_ids.empty() && !o.finished) return;
  auto it = callbacks_.find(r.id);
  if (it != callbacks_.end()) {
    StreamCallback cb = it->second;
    if (o.finished) callbacks_.erase(it);
    cb(o);
    return;
  }
  std::lock_guard lk(inbox_mu_);
  polled_.push_back(std::move(o));
}

void Engine::drain_inbox() {
  std::deque<Pending> arrivals;
  std::vector<RequestId> aborts;
  {
    std::lock_guard lk(inbox_mu_);
    arrivals.swap(inbox_);
    aborts.swap(aborts_);
  }
  if (!aborts.empty() && in_flight_) complete_in_flight();  // an aborted request has nothing in flight
  for (Pending& p : arrivals) {
    if (p.callback) callbacks_[p.request->id] = std::move(p.callback);
    if (p.request->sampling.max_new_tokens == 0) {  // nothing to compute
      p.request->finish = FinishReason::Length;
      report(*p.request);
      continue;
    }
    scheduler_.add(std::move(p.request));
  }
  for (RequestId id : aborts)
    if (auto r = scheduler_.abort(id)) report(*r);
}

bool Engine::step(bool forward_when_idle) {
  // A busy loop would retake step_mu_ at once and starve stats() (/metrics) for a whole run.
  while (stats_waiters_.load() > 0) std::this_thread::yield();
  std::lock_guard lk(step_mu_);
  drain_inbox();
  ScheduleBatch batch = scheduler_.next_batch();
  if (batch.needs_pending) {
    complete_in_flight();
    batch = scheduler_.next_batch();
  }
  if (batch.empty()) {
    const bool completed = in_flight_.has_value();
    complete_in_flight();
    // A rank of a group still runs its one forward of the step: its peers' collectives wait on it.
    if (forward_when_idle && spec_) spec_->run_idle(scheduler_.kv().table());
    else if (forward_when_idle) runner_.idle_forward();
    return completed;
  }
  if (spec_) {
    const ReqToTokenTable& table = scheduler_.kv().table();
    auto append = [this](Request& r, SampleResult s) { return append_token(r, std::move(s)); };
    if (batch.mode == ForwardMode::Extend) spec_->run_extend(batch, table, append);
    else spec_->run_verify(batch, table, append);
    std::vector<std::unique_ptr<Request>> done = scheduler_.finish_step(batch);
    for (const ScheduledSeq& s : batch.seqs)
      if (s.sample && !s.req->finished()) report(*s.req);
    for (auto& r : done) report(*r);
    return true;
  }
  Launched step = launch(std::move(batch));
  complete_in_flight();  // the previous step's tokens, read while this one runs
  if (step.readback) {
    in_flight_ = std::move(step);
    ++overlapped_;
  } else {
    complete(step);
  }
  return true;
}

// With overlap, rows the device can pick (device_sampleable: greedy or drawn, no penalty nor
// logprobs) stay there: the next step reads them as placeholders and the host collects them later.
// Otherwise the step is sampled now.
Engine::Launched Engine::launch(ScheduleBatch batch) {
  Launched step{std::move(batch)};
  const Tensor logits = runner_.forward(step.batch, scheduler_.kv().table());
  std::vector<const Request*> sampled;
  bool on_device = overlap_, argmax = true;
  for (const ScheduledSeq& s : step.batch.seqs) {
    sampled.push_back(s.sample ? s.req : nullptr);
    if (!s.sample) continue;
    on_device = on_device && s.req->sampling.device_sampleable();
    argmax = argmax && s.req->sampling.argmax_only();
  }
  if (on_device) {
    Tensor ids = runner_.sampled_ids(logits.size(0));
    if (argmax) {
      ops::argmax_rows_into(logits, ids);
    } else {
      // A row draws its request's next token; the previous step's are still in flight.
      std::vector<ops::RowSampling> rows(sampled.size(), ops::RowSampling{.temperature = 0.0f});
      for (size_t i = 0; i < sampled.size(); ++i)
        if (const Request* r = sampled[i]) rows[i] = next_row_sampling(*r);
      ops::sample_rows_into(logits, rows, ids);
    }
    step.readback = readbacks_[next_readback_++ % 2].get();
    step.readback->start(ids);
  } else {
    step.sampled = sample_rows(logits, sampled);
  }
  scheduler_.launch_step(step.batch);
  return step;
}

void Engine::complete(Launched& step) {
  std::span<const int32_t> ids;
  if (step.readback) ids = step.readback->wait();
  const auto& seqs = step.batch.seqs;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (!seqs[i].sample) continue;
    Request& r = *seqs[i].req;
    MS_ASSERT(!r.pending_ids.empty() && r.pending_ids.front() == -int32_t(i) - 1);
    r.pending_ids.erase(r.pending_ids.begin());
    if (r.finished()) continue;  // it ended at the step before: this token is not its
    append_token(r, step.readback ? SampleResult{ids[i]} : std::move(step.sampled[i]));
  }
  std::vector<std::unique_ptr<Request>> done = scheduler_.complete_step(step.batch);
  for (const ScheduledSeq& s : seqs)
    if (s.sample && !s.req->finished()) report(*s.req);
  for (auto& r : done) report(*r);
}

void Engine::complete_in_flight() {
  if (!in_flight_) return;
  Launched step = std::move(*in_flight_);
  in_flight_.reset();
  complete(step);
}

bool Engine::append_token(Request& r, SampleResult s) {
  r.output_ids.push_back(s.token);
  if (r.sampling.return_logprob || r.sampling.top_logprobs_num > 0) r.output_logprobs.push_back(std::move(s));
  check_finish(r, model_.config.eos_token_ids, detok_);
  ++generated_;
  return !r.finished();
}

bool Engine::has_work() {
  {
    std::lock_guard lk(inbox_mu_);
    if (!inbox_.empty() || !aborts_.empty()) return true;
  }
  std::lock_guard lk(step_mu_);
  return !scheduler_.idle();
}

void Engine::run_until_idle() {
  while (step()) {
  }
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock lk(inbox_mu_);
      inbox_cv_.wait(lk, [&] { return stopping_ || !inbox_.empty() || !aborts_.empty() || busy_; });
      if (stopping_) return;
    }
    try {
      step();
    } catch (const std::exception& e) {
      std::lock_guard lk(inbox_mu_);
      error_ = e.what();
      stopping_ = true;
      inbox_cv_.notify_all();
      return;
    }
    bool busy;
    {
      std::lock_guard lk(step_mu_);
      busy = !scheduler_.idle();
    }
    std::lock_guard lk(inbox_mu_);
    busy_ = busy;
  }
}

void Engine::start() {
  std::lock_guard lk(inbox_mu_);
  if (thread_.joinable()) return;
  stopping_ = false;
  busy_ = true;
  thread_ = std::thread([this] { loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lk(inbox_mu_);
    stopping_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::vector<StreamOutput> Engine::poll() {
  std::lock_guard lk(inbox_mu_);
  return std::exchange(polled_, {});
}

std::vector<GenerateResult> EngineApi::generate(const std::vector<GenerateRequest>& requests) {
  for (size_t i = 0; i < requests.size(); ++i) {  // all or none: no half-submitted list
    try {
      validate(requests[i]);
    } catch (const Error& e) {
      fail("request ", i + 1, ": ", e.what());
    }
  }
  std::vector<GenerateResult> results(requests.size());
  std::mutex mu;
  std::condition_variable cv;
  size_t remaining = requests.size();
  for (size_t i = 0; i < requests.size(); ++i)
    submit(requests[i], [&, i](const StreamOutput& o) {
      GenerateResult& g = results[i];
      g.output_ids.insert(g.output_ids.end(), o.new_ids.begin(), o.new_ids.end());
      g.logprobs.insert(g.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
      g.prompt_tokens = o.prompt_tokens;
      g.cached_tokens = o.cached_tokens;
      if (!o.finished) return;
      g.finish_reason = o.finish_reason;
      g.matched_stop = o.matched_stop;
      std::lock_guard lk(mu);
      if (--remaining == 0) cv.notify_all();
    });
  run_until([&](std::chrono::milliseconds wait) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, wait, [&] { return remaining == 0; });
  });
  return results;
}

void Engine::run_until(const FinishedWait& finished) {
  if (!thread_.joinable()) {
    while (step()) {
    }
    MS_CHECK(finished(std::chrono::milliseconds(0)), "engine went idle with requests unfinished");
    return;
  }
  while (!finished(std::chrono::milliseconds(50))) {
    std::lock_guard ek(inbox_mu_);
    MS_CHECK(error_.empty(), "engine failed: ", error_);
  }
}

void Engine::flush_cache() {
  std::lock_guard lk(step_mu_);
  drain_inbox();
  scheduler_.flush_cache();
}

EngineStats Engine::stats() {
  ++stats_waiters_;
  std::lock_guard lk(step_mu_);
  --stats_waiters_;
  EngineStats s;
  s.scheduler = scheduler_.stats();
  s.waiting = scheduler_.num_waiting();
  s.running = scheduler_.num_running();
  s.pool_capacity = scheduler_.kv().capacity();
  s.pool_used = scheduler_.kv().pool().used();
  s.cached_slots = scheduler_.kv().radix() ? scheduler_.kv().radix()->total_size() : 0;
  s.generated_tokens = generated_;
  s.cuda_graph_replays = runner_.graph_replays() + (draft_ ? draft_->graph_replays() : 0);
  s.overlapped_steps = overlapped_;
  s.speculative = spec_ != nullptr;
  if (spec_) s.spec = spec_->stats();
  return s;
}

}  // namespace ms
