// The offline engine: submit requests, receive their tokens as they are produced (a callback,
// or poll()), abort them. It runs the scheduler loop step by step in the caller's thread
// (step(), run_until_idle()) or on its own thread (start()). submit, abort and poll may be
// called from any thread; callbacks run on the thread that steps.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/model_runner.h"
#include "runtime/request.h"
#include "runtime/scheduler.h"
#include "runtime/spec_draft.h"
#include "runtime/spec_worker.h"

namespace ms {

struct EngineOptions {
  SchedulerOptions scheduler;
  int64_t max_total_tokens = 0;     // KV slots; 0: from mem_fraction_static
  double mem_fraction_static = 0;   // 0: the device's default (0.88 on GPUs, 0.3 of host RAM)
  bool bf16_activations = false;    // CPU: round activations as bf16 storage would
  uint64_t random_seed = 0;         // seeds requests that bring no seed of their own
  SpeculativeOptions speculative;   // draft-then-verify decoding (off unless an algorithm is set)
  CudaGraphSettings cuda_graph;     // decode steps replayed on the GPU (not the MTP draft's)
  // --disable-overlap-schedule. Overlap: while step N runs on the device, the host schedules
  // and issues step N+1 (whose inputs name N's tokens still on the device), then reads N's
  // tokens and reports them. Steps of requests sampled on the host and speculative decoding run
  // one step at a time.
  bool disable_overlap_schedule = false;
};

struct GenerateRequest {
  std::vector<int32_t> input_ids;
  SamplingParams sampling;
};

// What a request produced since its previous report; the last report has finished set.
struct StreamOutput {
  RequestId id = 0;
  std::vector<int32_t> new_ids;
  std::vector<SampleResult> new_logprobs;  // when the request asked for logprobs
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::string matched_stop;
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
using StreamCallback = std::function<void(const StreamOutput&)>;

// A whole request's outcome (Engine::generate).
struct GenerateResult {
  std::vector<int32_t> output_ids;
  std::vector<SampleResult> logprobs;
  FinishReason finish_reason = FinishReason::None;
  std::string matched_stop;
  int prompt_tokens = 0, cached_tokens = 0;
};

struct EngineStats {
  SchedulerStats scheduler;
  int waiting = 0, running = 0;
  int64_t pool_capacity = 0, pool_used = 0, cached_slots = 0;
  int64_t generated_tokens = 0;
  int64_t cuda_graph_replays = 0;  // decode steps (target's or draft's) replayed from CUDA graphs
  int64_t overlapped_steps = 0;    // steps whose tokens were read while the next step ran
  bool speculative = false;  // speculative decoding is on; `spec` counts its work
  SpeculativeStats spec;
};

// What a front end (the HTTP server) needs of an engine: Engine on one rank, ParallelEngine
// over the ranks of a --tp/--dp/--ep configuration.
class EngineApi {
 public:
  virtual ~EngineApi() = default;
  // Validates and queues a request; throws ms::Error naming the bad field. Without a callback
  // its outputs are kept for poll().
  virtual RequestId submit(GenerateRequest request, StreamCallback on_output = {}) = 0;
  // The checks submit makes: ids in the vocabulary, parameters in range, prompt plus
  // max_new_tokens within the context and the KV pool.
  virtual void validate(const GenerateRequest& request) const = 0;
  // Ends a waiting or running request; it reports finish_reason abort. Unknown ids are ignored.
  virtual void abort(RequestId id) = 0;
  virtual void start() = 0;  // background thread(s) step whenever there is work
  virtual void stop() = 0;
  virtual void flush_cache() = 0;  // empties the radix cache; only while no request is in flight
  virtual EngineStats stats() = 0;
  virtual int64_t kv_slots() const = 0;

  // Submits all, waits until all have finished, and returns their results in order.
  std::vector<GenerateResult> generate(const std::vector<GenerateRequest>& requests);

 protected:
  // Returns once finished holds (stepping in the caller's thread where nothing runs in the
  // background); throws if the engine failed meanwhile. finished(wait) blocks up to `wait` for
  // the outcome (woken by the callbacks) and says whether everything finished.
  using FinishedWait = std::function<bool(std::chrono::milliseconds)>;
  virtual void run_until(const FinishedWait& finished) = 0;
};

class Engine final : public EngineApi {
 public:
  // With options.speculative set, `draft` proposes the tokens to verify (null: the model's own
  // MTP layer); a draft without options.speculative is an error.
  Engine(const CausalLM& model, const EngineOptions& options, Detokenizer detokenizer = {},
         std::unique_ptr<DraftModel> draft = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  RequestId submit(GenerateRequest request, StreamCallback on_output = {}) override;
  void validate(const GenerateRequest& request) const override;
  void abort(RequestId id) override;
  void start() override;
  void stop() override;
  void flush_cache() override;
  EngineStats stats() override;
  int64_t kv_slots() const override { return runner_.num_slots(); }

  // One scheduler step; false when there was nothing to do. With forward_when_idle a step with
  // nothing to do still runs an IDLE forward (no tokens), so that a rank of a parallel group
  // joins its peers' collectives. On such a rank (a model with groups) a speculative step runs
  // the same sequence of forwards as its peers' — the draft's chain, the target, the draft's
  // observe — padded with IDLE ones (spec_worker.h); alone, a step runs only what it needs.
  bool step(bool forward_when_idle = false);
  void run_until_idle();
  bool has_work();  // requests queued, waiting or running
  std::vector<StreamOutput> poll();  // reports of callback-less requests since the last poll

  // The KV pool size Engine(model, options) would take with the model's own draft (MTP) when
  // speculation is on.
  static int64_t pool_slots(const CausalLM& model, const EngineOptions& options);

 protected:
  void run_until(const FinishedWait& finished) override;

 private:
  struct Pending {
    std::unique_ptr<Request> request;
    StreamCallback callback;
  };
  // A plain step whose forward and sampling were issued: its tokens are on the host already
  // (`sampled`), or still on their way there (`readback`).
  struct Launched {
    ScheduleBatch batch;
    std::vector<SampleResult> sampled;
    ops::HostReadback* readback = nullptr;
  };
  void drain_inbox();
  void report(Request& r);
  bool append_token(Request& r, SampleResult s);  // false once r finished
  Launched launch(ScheduleBatch batch);
  void complete(Launched& step);  // its tokens to their requests, reports, finished requests out
  void complete_in_flight();
  void loop();

  const CausalLM& model_;
  EngineOptions options_;
  Detokenizer detok_;
  std::unique_ptr<DraftModel> draft_;  // null without speculative decoding
  ModelRunner runner_;
  Scheduler scheduler_;
  std::unique_ptr<SpeculativeWorker> spec_;
  bool overlap_ = false;
  std::unique_ptr<ops::HostReadback> readbacks_[2];  // a step in flight and the one being issued
  int next_readback_ = 0;
  std::optional<Launched> in_flight_;
  int64_t overlapped_ = 0;

  std::mutex step_mu_;  // one step at a time; guards scheduler_, callbacks_, counters
  std::atomic<int> stats_waiters_{0};  // stats() calls waiting for step_mu_: steps let them in first
  std::unordered_map<RequestId, StreamCallback> callbacks_;
  int64_t generated_ = 0;

  std::mutex inbox_mu_;  // guards everything below
  std::condition_variable inbox_cv_;
  std::deque<Pending> inbox_;
  std::vector<RequestId> aborts_;
  std::vector<StreamOutput> polled_;
  RequestId next_id_ = 1;
  bool stopping_ = false;
  bool busy_ = false;    // the scheduler has requests in flight
  std::string error_;    // what ended the background thread
  std::thread thread_;
};

}  // namespace ms
