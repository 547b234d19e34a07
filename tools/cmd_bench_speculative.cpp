// `moeserve bench-speculative`: decode speed with speculative decoding against without, for one
// batch of random prompts through the engine, at set acceptance rates. The draft is a
// ReplayDraft that replays the plain run's own greedy continuation with each token wrong with
// probability e (so acceptance is what e makes it, whatever the weights), and optionally the
// checkpoint's MTP layer. Decode time is a run's time minus that of a prefill-only run.
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "core/check.h"
#include "runtime/engine.h"
#include "runtime/spec_replay_draft.h"

namespace ms::cli {
namespace {

struct SpecBenchArgs {
  std::string model_path, device = "cpu", result_file;
  int batch_size = 8, input_len = 128, output_len = 64, num_steps = 3;
  std::vector<double> error_rates = {0.0, 0.25, 0.5, 1.0};
  bool mtp = false;
  uint64_t seed = 1;
  CudaGraphSettings graphs;
};

struct Timed {
  double seconds = 0;
  int same_as_plain = 0;  // requests whose output equals the plain run's
  EngineStats stats;
  std::vector<GenerateResult> results;
};

class SpecBench {
 public:
  explicit SpecBench(const SpecBenchArgs& a) : a_(a) {
    LoadOptions o;
    o.device = a.device == "cuda" ? Device::CUDA : Device::CPU;
    o.act_dtype = a.device == "cuda" ? DType::BF16 : DType::F32;
    o.load_mtp = a.mtp;
    model_ = load_model(a.model_path, o);
    std::mt19937_64 rng(a.seed);
    std::uniform_int_distribution<int32_t> token(2, model_->config.vocab_size - 1);
    for (int b = 0; b < a.batch_size; ++b) {
      GenerateRequest g;
      for (int i = 0; i < a.input_len; ++i) g.input_ids.push_back(token(rng));
      g.sampling.temperature = 0.0f;
      g.sampling.max_new_tokens = a.output_len;
      g.sampling.ignore_eos = true;
      requests_.push_back(std::move(g));
    }
  }

  void run(std::ostream& out) {
    run_engine({}, nullptr, a_.output_len);  // warm-up (allocators, GPU clocks)
    const double prefill = run_engine({}, nullptr, 1).seconds;
    const Timed plain = run_engine({}, nullptr, a_.output_len);
    const double plain_decode = plain.seconds - prefill;
    std::map<std::vector<int32_t>, std::vector<int32_t>> continuations;
    for (size_t i = 0; i < requests_.size(); ++i) continuations[requests_[i].input_ids] = plain.results[i].output_ids;
    report(out, "none", 0, plain, plain_decode, plain_decode);
    SpeculativeOptions spec;
    spec.algorithm = "EAGLE";
    spec.num_steps = a_.num_steps;
    for (double e : a_.error_rates) {
      auto draft = std::make_unique<ReplayDraft>(continuations, e, a_.seed, model_->config.vocab_size);
      Timed t = run_engine(spec, std::move(draft), a_.output_len);
      check_lossless(t, plain, "replay");
      report(out, "replay", e, t, t.seconds - prefill, plain_decode);
    }
    if (!a_.mtp) return;
    Timed t = run_engine(spec, nullptr, a_.output_len);
    check_lossless(t, plain, "mtp");
    report(out, "mtp", -1, t, t.seconds - prefill, plain_decode);
  }

 private:
  Timed run_engine(const SpeculativeOptions& spec, std::unique_ptr<DraftModel> draft, int output_len) {
    EngineOptions o;
    o.scheduler.enable_radix_cache = false;  // every run computes its prompts
    o.scheduler.max_running_requests = a_.batch_size;
    o.max_total_tokens = int64_t(a_.batch_size) * (a_.input_len + a_.output_len + a_.num_steps + 1);
    o.speculative = spec;
    o.cuda_graph = a_.graphs;  // captured here, before the clock starts
    std::vector<GenerateRequest> reqs = requests_;
    for (auto& r : reqs) r.sampling.max_new_tokens = output_len;
    Engine engine(*model_, o, {}, std::move(draft));
    const auto t0 = std::chrono::steady_clock::now();
    Timed t;
    t.results = engine.generate(reqs);
    t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.stats = engine.stats();
    return t;
  }

  // On the CPU (f32) the outputs must be equal. On the GPU the verify forward (several tokens
  // per request) and the plain decode step (one, often a replayed graph) round differently in
  // bf16, so a near-tied greedy choice may flip; the report counts the requests that kept the
  // plain output instead.
  void check_lossless(Timed& t, const Timed& plain, const char* draft) const {
    for (size_t i = 0; i < t.results.size(); ++i) {
      const bool same = t.results[i].output_ids == plain.results[i].output_ids;
      MS_CHECK(same || a_.device != "cpu", "bench-speculative: the ", draft, " run changed the greedy output of request ", i);
      t.same_as_plain += same ? 1 : 0;
    }
  }

  void report(std::ostream& out, const char* draft, double e, const Timed& t, double decode, double plain_decode) {
    const double tokens = double(a_.batch_size) * (a_.output_len - 1);
    nlohmann::json j{{"draft", draft},
                     {"num_steps", std::string(draft) == "none" ? 0 : a_.num_steps},
                     {"batch_size", a_.batch_size},
                     {"input_len", a_.input_len},
                     {"output_len", a_.output_len},
                     {"decode_seconds", decode},
                     {"decode_tokens_per_s", tokens / decode},
                     {"speedup", plain_decode / decode},
                     {"decode_batches", t.stats.scheduler.decode_batches},
                     {"cuda_graph_replays", t.stats.cuda_graph_replays}};
    if (e >= 0 && std::string(draft) == "replay") j["error_rate"] = e;
    if (t.stats.speculative) {
      j["same_output_as_plain"] = t.same_as_plain;
      j["accept_length"] = t.stats.spec.mean_accept_length();
      j["acceptance_rate"] = t.stats.spec.acceptance_rate();
      j["draft_overhead"] = t.stats.spec.draft_overhead();
    }
    out << j.dump() << std::endl;
    if (!a_.result_file.empty()) std::ofstream(a_.result_file, std::ios::app) << j.dump() << "\n";
  }

  SpecBenchArgs a_;
  std::unique_ptr<CausalLM> model_;
  std::vector<GenerateRequest> requests_;
};

}  // namespace

void add_bench_speculative(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-speculative",
                                 "decode speed with speculative decoding vs without, at set acceptance rates "
                                 "(a draft that replays the plain run's output with errors), one JSON line each");
  auto a = std::make_shared<SpecBenchArgs>();
  cmd->add_option("--model-path", a->model_path, "Hugging Face checkpoint directory")->required();
  cmd->add_option("--device", a->device, "where the model runs")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--batch-size", a->batch_size, "requests decoded together")->check(CLI::PositiveNumber);
  cmd->add_option("--input-len", a->input_len, "prompt tokens")->check(CLI::PositiveNumber);
  cmd->add_option("--output-len", a->output_len, "generated tokens per request")->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--speculative-num-steps", a->num_steps, "draft tokens per verify")->check(CLI::PositiveNumber);
  cmd->add_option("--error-rates", a->error_rates, "replay-draft error rates to measure (0: every draft right)")
      ->delimiter(',');
  cmd->add_flag("--mtp", a->mtp, "also measure the checkpoint's MTP layer as the draft");
  cmd->add_option("--seed", a->seed, "prompts and draft errors");
  cmd->add_option("--result-file", a->result_file, "append the JSON lines here too");
  cmd->add_option("--cuda-graph-max-bs", a->graphs.max_bs, "largest decode batch replayed from a CUDA graph")
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--disable-cuda-graph", a->graphs.disable, "run every decode and draft step op by op");
  cmd->callback([a] { SpecBench(*a).run(std::cout); });
}

}  // namespace ms::cli
