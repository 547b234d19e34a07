// The speculative-decoding flags (SGLang's names) and the stats line, shared by the commands
// that run the batching engine.
#pragma once
#include <CLI/CLI.hpp>
#include <ostream>

#include "runtime/spec_draft.h"

namespace ms::cli {

inline void add_speculative_flags(CLI::App* cmd, SpeculativeOptions& spec) {
  cmd->add_option("--speculative-algorithm", spec.algorithm,
                  "draft with the checkpoint's MTP layer and verify in one forward (NEXTN and EAGLE are the same here)")
      ->check(CLI::IsMember({"NEXTN", "EAGLE"}));
  cmd->add_option("--speculative-num-steps", spec.num_steps, "draft tokens per verify (a chain)");
  cmd->add_option("--speculative-eagle-topk", spec.eagle_topk, "draft branching; only 1 (a chain)");
  cmd->add_option("--speculative-num-draft-tokens", spec.num_draft_tokens,
                  "tokens per verify, the verified one included (num-steps + 1 with a chain)");
}

// One line, e.g. on stderr so that stdout stays one JSON result per request.
inline void print_speculative_stats(std::ostream& out, const SpeculativeStats& s) {
  out << "speculative: verify_forwards=" << s.verify_forwards << " accept_length=" << s.mean_accept_length()
      << " acceptance_rate=" << s.acceptance_rate() << " drafted=" << s.drafted_tokens
      << " accepted=" << s.accepted_tokens << " draft_forwards=" << s.draft_forwards
      << " draft_overhead=" << s.draft_overhead() << std::endl;
}

}  // namespace ms::cli
