// Serving over the ranks of a --tp / --dp --enable-dp-attention / --ep-size configuration in
// this process: one Engine per rank (its shard of the weights, its KV pool, its scheduler),
// stepped in lockstep by the rank threads of a ParallelRunner.
//
// A request goes to one DP group (the one with the fewest unfinished requests). Every rank of
// that group receives it in the same step, so the group's replicas (its attention-TP ranks)
// schedule, sample and cache identically, and only the group's first rank reports tokens.
// In every step every rank runs exactly one forward — an IDLE one when its group has nothing to
// do — so that the MoE and TP collectives of all ranks line up, as SGLang's DP-attention
// schedulers do. With speculative decoding (the MTP draft) a step is the same sequence of
// forwards on every rank instead: the draft's chain, the target, the draft's observe, IDLE
// ones where the rank's group has less to do (spec_worker.h). When no rank has work the rank
// threads sleep until a request arrives.
#pragma once
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "runtime/engine.h"
#include "runtime/parallel_runner.h"

namespace ms {

class ParallelEngine final : public EngineApi {
 public:
  // CUDA graphs are not used across ranks (turned off). Speculative decoding drafts with each
  // rank's shard of the MTP layer.
  ParallelEngine(ParallelRunner& runner, const EngineOptions& options, Detokenizer detokenizer = {});
  ~ParallelEngine() override;

  // on_output is required (outputs are not kept for polling); it runs on a rank thread.
  RequestId submit(GenerateRequest request, StreamCallback on_output = {}) override;
  void validate(const GenerateRequest& request) const override;
  void abort(RequestId id) override;
  void start() override;
  void stop() override;
  void flush_cache() override;  // applied by every rank at the start of the next step
  EngineStats stats() override;  // summed over the DP groups (speculative counters too)
  int64_t kv_slots() const override { return kv_slots_; }  // per DP group

 protected:
  void run_until(const FinishedWait& finished) override;

 private:
  struct Arrival {
    RequestId id;
    int group;
    GenerateRequest request;
  };
  // What every rank applies at the start of one step (published by local rank 0).
  struct StepInputs {
    uint64_t step = 0;
    std::vector<Arrival> arrivals;
    std::vector<RequestId> aborts;
    bool flush = false, stop = false;
  };
  struct Outstanding {
    int group;
    StreamCallback callback;
  };

  void rank_loop(int r);
  bool any_busy(bool mine);                  // whether any rank has work this step
  void publish(uint64_t step);               // local rank 0: the inbox becomes step's inputs
  StepInputs inputs_of(uint64_t step);       // blocks until step's inputs are published
  void deliver(RequestId id, StreamOutput o);  // a group leader's report, to the caller
  void fail_outstanding(const std::string& why);

  ParallelRunner& runner_;
  EngineOptions options_;
  std::vector<std::unique_ptr<Engine>> engines_;  // per local rank
  // Per local rank, touched only by its thread: this DP group's requests, front id -> engine id.
  std::vector<std::unordered_map<RequestId, RequestId>> local_ids_;
  int64_t kv_slots_ = 0;

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  std::deque<Arrival> inbox_;
  std::vector<RequestId> aborts_;
  bool flush_ = false, stopping_ = false, failed_ = false;
  std::string error_;
  StepInputs published_;
  bool has_published_ = false;
  std::map<RequestId, Outstanding> outstanding_;
  int vote_arrived_ = 0;  // any_busy: ranks in the current round, their OR, the last result
  bool vote_any_ = false, vote_result_ = false;
  uint64_t vote_round_ = 0;
  std::vector<int> group_load_;  // unfinished requests per DP group
  RequestId next_id_ = 1;
  std::thread thread_;  // runs the rank threads (ParallelRunner::on_all_ranks)
};

}  // namespace ms
