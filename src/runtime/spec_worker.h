// The engine's step when speculative decoding is on. An extend (prefill) batch runs the target,
// samples each finished prompt's first token, and lets the draft model observe the chunk. A
// decode batch comes from the scheduler with 1 + k slots per request (k drafts, chosen by the
// scheduler under the memory budget): the draft proposes k tokens, one target forward verifies
// all of them, the accepted ones and the target's next token are appended, and the draft
// observes the kept positions. The scheduler's finish_step then frees the rejected slots.
//
// In lockstep with other ranks (a shard of the model: the target's and the MTP layer's MoE and
// TP collectives span the ranks) every step runs the same sequence of forwards on every rank:
// the draft's chain forwards (as many as the rank that verifies the most drafts needs), one
// target forward, one draft observe — IDLE ones (no tokens) where this rank's batch is an
// extend, is empty, or wants fewer drafts.
#pragma once
#include <functional>

#include "runtime/model_runner.h"
#include "runtime/scheduler.h"
#include "runtime/spec_draft.h"
#include "runtime/spec_verify.h"

namespace ms {

// Appends a chosen token to a request and checks whether it finished; false once it has (the
// tokens after it are dropped).
using AppendToken = std::function<bool(Request&, SampleResult)>;

class SpeculativeWorker {
 public:
  // lockstep: this rank's forwards join collectives with peers that step with it.
  SpeculativeWorker(ModelRunner& runner, DraftModel& draft, bool lockstep = false);

  void run_extend(const ScheduleBatch& batch, const ReqToTokenTable& table, const AppendToken& append);
  void run_verify(const ScheduleBatch& batch, const ReqToTokenTable& table, const AppendToken& append);
  // A step with nothing to compute: the target's IDLE forward (and the draft's, in lockstep).
  void run_idle(const ReqToTokenTable& table);

  SpeculativeStats stats() const;

 private:
  // The verify forward's batch: each request's last token then its drafts, at positions
  // [start, start + k], in the slots the scheduler allocated.
  static ForwardBatch verify_batch(const ScheduleBatch& batch, const std::vector<std::vector<int32_t>>& drafts,
                                   const ReqToTokenTable& table);
  // Each request's verdict on its drafts from the verify forward's logits [T, vocab] (device).
  static std::vector<VerifyResult> verify(const ScheduleBatch& batch, const ForwardBatch& fb, const Tensor& logits,
                                          const std::vector<std::vector<int32_t>>& drafts);
  void record(int drafted, int accepted, int emitted);

  ModelRunner& runner_;
  DraftModel& draft_;
  bool lockstep_;
  SpeculativeStats stats_;
};

}  // namespace ms
