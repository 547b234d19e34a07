// Speculative decoding, EAGLE style with a chain (top-k 1) draft: a draft model proposes the
// next few tokens of every running request, the target verifies all of them in one forward and
// keeps the longest prefix it agrees with plus its own next token. A DraftModel is pluggable:
// DeepSeek's MTP layer (spec_mtp_draft.h) in production, a replay of known continuations with a
// set error rate (spec_replay_draft.h) to test and benchmark acceptance.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/kv_pool.h"
#include "runtime/request.h"

namespace ms {

// The flags, with SGLang's names. NEXTN and EAGLE are the same algorithm here.
struct SpeculativeOptions {
  std::string algorithm;     // "" (off), "NEXTN" or "EAGLE"
  int num_steps = 3;         // draft tokens per verify (a chain: one draft forward each)
  int eagle_topk = 1;        // branching of the draft tree; only 1 (a chain) is supported
  int num_draft_tokens = 0;  // tokens per verify, the verified one included; 0: num_steps + 1

  bool enabled() const { return !algorithm.empty(); }
  // Throws naming the flag when the combination is not supported.
  void validate() const;
};

// Counters since the engine started; means are computed from them, never kept.
struct SpeculativeStats {
  int64_t verify_forwards = 0;   // target forwards that verified drafts (one per step)
  int64_t verified_seqs = 0;     // request-verifies: one request in one verify forward
  int64_t drafted_tokens = 0;    // draft tokens proposed for verification
  int64_t accepted_tokens = 0;   // of those, accepted
  int64_t emitted_tokens = 0;    // tokens verifies appended: accepted drafts plus the target's own
  int64_t draft_forwards = 0;    // forwards of the draft model (extend and chain steps)
  double draft_seconds = 0;      // time in the draft model (proposing and observing)
  double target_seconds = 0;     // time in target forwards of extend and verify steps
  std::vector<int64_t> accept_histogram;  // [k]: request-verifies that accepted k drafts

  // Tokens a request gains per verify (1 = no speed-up); SGLang's "accept length".
  double mean_accept_length() const { return verified_seqs ? double(emitted_tokens) / double(verified_seqs) : 0.0; }
  double acceptance_rate() const { return drafted_tokens ? double(accepted_tokens) / double(drafted_tokens) : 0.0; }
  // Share of model time spent drafting.
  double draft_overhead() const {
    const double total = draft_seconds + target_seconds;
    return total > 0 ? draft_seconds / total : 0.0;
  }
};

// One sequence of a step as the draft sees it.
struct DraftSeq {
  Request* req;
  int start;  // observe: first position kept; propose: position of the request's last token
  int count;  // observe: positions [start, start + count) kept; propose: draft tokens wanted
};

class DraftModel {
 public:
  virtual ~DraftModel() = default;
  // KV bytes the draft keeps per target KV slot: the pool budget pays for both.
  virtual size_t kv_bytes_per_slot() const { return 0; }
  // Called once the pool is sized: `num_slots` target slots, `rows` req_to_token rows.
  virtual void attach(int64_t num_slots, int rows) {}
  // After a target forward, for each sequence the positions [start, start + count) whose target
  // KV is kept (a prefill chunk, or a verify's accepted tokens; the token after each of them is
  // known: req->fill_at(position + 1)). `hidden` holds the target's final hidden states of those
  // positions [sum of counts, H], sequence after sequence; `table` their KV slots.
  virtual void observe(std::span<const DraftSeq> seqs, const Tensor& hidden, const ReqToTokenTable& table) = 0;
  // Exactly seq.count tokens to follow each request's last token (position seq.start). The
  // table already holds slots for positions [start, start + count] (the verify's), which a
  // draft may use as scratch: the verify overwrites the target's and observe the draft's.
  virtual std::vector<std::vector<int32_t>> propose(std::span<const DraftSeq> seqs, const ReqToTokenTable& table) = 0;
  // For a rank stepped in lockstep with peers whose forwards share collectives with its own
  // (a shard of the model under --tp/--dp/--ep). From then on propose() is called on every rank
  // in every step (with no sequences where the rank has none to draft for) and runs as many
  // forwards as the rank that needs the most, IDLE ones (no tokens) for the rest; observe()
  // runs exactly one forward, IDLE when it has nothing to observe. A draft whose forwards join
  // no collective ignores it.
  virtual void enter_lockstep() {}
  // Draft-model forwards so far (the overhead the stats report; IDLE padding not counted).
  virtual int64_t forward_passes() const { return 0; }
  // Of those, the ones replayed from CUDA graphs.
  virtual int64_t graph_replays() const { return 0; }
};

}  // namespace ms
