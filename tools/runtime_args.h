// The engine's flags with SGLang's names, for the commands that run the batching engine.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "runtime/engine.h"
#include "speculative_args.h"

namespace ms::cli {

struct RuntimeArgs {
  EngineOptions engine;
  std::string policy = "fcfs";
  bool disable_radix_cache = false;
  void add(CLI::App* cmd) {
    SchedulerOptions& s = engine.scheduler;
    cmd->add_option("--max-total-tokens", engine.max_total_tokens, "KV pool size in tokens (default: from memory)");
    cmd->add_option("--mem-fraction-static", engine.mem_fraction_static,
                    "share of device memory for weights and KV when --max-total-tokens is not given");
    cmd->add_option("--chunked-prefill-size", s.chunked_prefill_size, "largest prefill chunk in tokens (<= 0: off)");
    cmd->add_option("--max-running-requests", s.max_running_requests, "requests decoded together")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--max-prefill-tokens", s.max_prefill_tokens, "tokens of one prefill batch")
        ->check(CLI::PositiveNumber);
    cmd->add_option("--schedule-policy", policy, "order of waiting requests")->check(CLI::IsMember({"fcfs", "lpm"}));
    cmd->add_option("--schedule-conservativeness", s.conservativeness,
                    "how much decode memory to keep free when admitting requests (lower: more retraction)");
    cmd->add_flag("--disable-radix-cache", disable_radix_cache, "no prefix reuse across requests");
    cmd->add_option("--random-seed", engine.random_seed, "seed for requests without their own seed");
    add_speculative_flags(cmd, engine.speculative);
    cmd->add_option("--cuda-graph-max-bs", engine.cuda_graph.max_bs,
                    "largest decode batch replayed from a CUDA graph (--device cuda)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_flag("--disable-cuda-graph", engine.cuda_graph.disable, "run every decode step op by op");
    cmd->add_flag("--disable-overlap-schedule", engine.disable_overlap_schedule,
                  "schedule and issue each step only after the previous step's tokens are read");
  }
  EngineOptions options(bool bf16) const {
    EngineOptions o = engine;
    o.scheduler.policy = policy == "lpm" ? SchedulePolicy::Lpm : SchedulePolicy::Fcfs;
    o.scheduler.enable_radix_cache = !disable_radix_cache;
    o.bf16_activations = bf16;
    return o;
  }
};

}  // namespace ms::cli
