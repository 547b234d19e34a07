// `moeserve bench-offline`: SGLang's bench_offline_throughput: a dataset of prompts through
// the in-process engine at once (no HTTP), reporting request and token throughput.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "bench/dataset.h"
#include "bench/metrics.h"
#include "bench/progress.h"
#include "commands.h"
#include "core/check.h"
#include "models/causal_lm.h"
#include "runtime/engine.h"
#include "runtime_args.h"

namespace ms::cli {
namespace {
using namespace ms::bench;

struct OfflineArgs {
  std::string model_path, device = "cpu", dtype = "float32", dataset_name = "random", dataset_path, result_file;
  int num_prompts = 1000, input_len = 1024, output_len = 1024;
  double range_ratio = 0.0;
  float temperature = 0.0f, top_p = 1.0f;
  uint64_t seed = 1;
  bool skip_warmup = false, disable_tqdm = false, disable_ignore_eos = false;
  RuntimeArgs runtime;
};

struct OfflineResult {
  int requests = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double seconds = 0;
};

// Submits every prompt at once and steps the engine until all have finished.
OfflineResult run_once(Engine& engine, const std::vector<BenchPrompt>& prompts, const OfflineArgs& a, bool ignore_eos,
                       bool progress) {
  OfflineResult r;
  ProgressBar bar("bench-offline", int(prompts.size()), progress);
  int64_t generated = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const BenchPrompt& p : prompts) {
    GenerateRequest req;
    req.input_ids = p.ids;
    req.sampling.temperature = a.temperature;
    req.sampling.top_p = a.top_p;
    req.sampling.seed = a.seed + uint64_t(r.requests++);
    req.sampling.max_new_tokens = p.output_len;
    req.sampling.ignore_eos = ignore_eos;
    // Callbacks run on this thread, the one that steps, so plain counters are safe.
    engine.submit(std::move(req), [&](const StreamOutput& out) {
      generated += int64_t(out.new_ids.size());
      if (out.finished) bar.advance();
    });
    r.input_tokens += p.prompt_len;
  }
  engine.run_until_idle();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.output_tokens = generated;
  return r;
}

std::vector<BenchPrompt> make_prompts(const OfflineArgs& a, int32_t vocab_size, int num, int in, int out) {
  std::unique_ptr<Tokenizer> tok;
  if (std::filesystem::exists(std::filesystem::path(a.model_path) / "tokenizer.json"))
    tok = std::make_unique<Tokenizer>(Tokenizer::load(a.model_path));
  if (a.dataset_name == "sharegpt") {
    MS_CHECK(tok, "--dataset-name sharegpt needs the checkpoint's tokenizer.json in ", a.model_path);
    MS_CHECK(!a.dataset_path.empty(), "--dataset-name sharegpt needs --dataset-path");
    auto prompts = sharegpt_dataset(read_sharegpt(a.dataset_path, a.seed), num, *tok, 0, 0);
    for (auto& p : prompts) {  // the engine takes ids: encode as the server would, BOS included
      p.ids = tok->encode(p.text, true);
      p.text.clear();
      p.prompt_len = int(p.ids.size());
    }
    return prompts;
  }
  std::vector<std::string> texts;
  if (!a.dataset_path.empty())
    for (auto& [prompt, reply] : read_sharegpt(a.dataset_path, a.seed)) texts.push_back(std::move(prompt));
  return random_dataset({num, in, out, a.range_ratio, a.seed, vocab_size}, tok.get(), texts);
}

void print_result(const OfflineResult& r) {
  std::string out = "\n" + rule_line(" Offline Throughput Benchmark Result ", '=');
  out += value_line("Backend:", "engine");
  out += value_line("Successful requests:", std::to_string(r.requests));
  out += value_line("Benchmark duration (s):", r.seconds);
  out += value_line("Total input tokens:", std::to_string(r.input_tokens));
  out += value_line("Total generated tokens:", std::to_string(r.output_tokens));
  out += value_line("Request throughput (req/s):", r.requests / r.seconds);
  out += value_line("Input token throughput (tok/s):", double(r.input_tokens) / r.seconds);
  out += value_line("Output token throughput (tok/s):", double(r.output_tokens) / r.seconds);
  out += value_line("Total token throughput (tok/s):", double(r.input_tokens + r.output_tokens) / r.seconds);
  std::printf("%s%s\n", out.c_str(), std::string(50, '=').c_str());
}

void run_bench_offline(const OfflineArgs& a) {
  LoadOptions lo;
  lo.device = a.device == "cuda" ? Device::CUDA : Device::CPU;
  lo.act_dtype = a.device == "cuda" ? DType::BF16 : DType::F32;
  lo.load_mtp = false;
  auto model = load_model(a.model_path, lo);
  Engine engine(*model, a.runtime.options(a.dtype == "bfloat16" && a.device == "cpu"));
  const int32_t vocab = model->config.vocab_size;
  if (!a.skip_warmup) {  // SGLang's warmup: up to 16 prompts of 256 tokens, 16 new tokens each
    run_once(engine, make_prompts(a, vocab, std::min(a.num_prompts, 16), 256, 16), a, true, false);
    engine.flush_cache();
  }
  const auto prompts = make_prompts(a, vocab, a.num_prompts, a.input_len, a.output_len);
  const OfflineResult r = run_once(engine, prompts, a, !a.disable_ignore_eos, !a.disable_tqdm);
  print_result(r);
  if (a.result_file.empty()) return;
  std::ofstream file(a.result_file, std::ios::app);
  MS_CHECK(file, "--result-filename: cannot open ", a.result_file);
  file << nlohmann::json{{"backend", "engine"}, {"successful_requests", r.requests}, {"total_latency", r.seconds},
                         {"total_input_tokens", r.input_tokens}, {"total_output_tokens", r.output_tokens},
                         {"request_throughput", r.requests / r.seconds},
                         {"input_throughput", double(r.input_tokens) / r.seconds},
                         {"output_throughput", double(r.output_tokens) / r.seconds},
                         {"total_throughput", double(r.input_tokens + r.output_tokens) / r.seconds},
                         {"cuda_graph_replays", engine.stats().cuda_graph_replays},
                         {"overlapped_steps", engine.stats().overlapped_steps}, {"temperature", a.temperature},
                         {"top_p", a.top_p}}
              .dump()
       << "\n";
}

}  // namespace

void add_bench_offline(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-offline", "offline throughput through the in-process engine "
                                                  "(SGLang's bench_offline_throughput)");
  auto a = std::make_shared<OfflineArgs>();
  cmd->add_option("--model-path", a->model_path, "checkpoint directory")->required();
  cmd->add_option("--device", a->device, "where the model runs")->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dataset-name", a->dataset_name, "prompt source")->check(CLI::IsMember({"random", "sharegpt"}));
  cmd->add_option("--dataset-path", a->dataset_path, "ShareGPT JSON (sharegpt; for random: texts to cut prompts from)");
  cmd->add_option("--num-prompts", a->num_prompts, "requests")->check(CLI::PositiveNumber);
  cmd->add_option("--random-input-len", a->input_len, "longest random prompt")->check(CLI::PositiveNumber);
  cmd->add_option("--random-output-len", a->output_len, "most tokens to generate")->check(CLI::PositiveNumber);
  cmd->add_option("--random-range-ratio", a->range_ratio, "lengths are uniform in [len * ratio, len]")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", a->seed, "seed of the dataset (and of request i's sampling: seed + i)");
  cmd->add_option("--temperature", a->temperature, "sampling temperature of every request (0: greedy)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", a->top_p, "nucleus sampling bound of every request")->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--result-filename,--output-file", a->result_file, "append the result as one JSON line");
  cmd->add_flag("--skip-warmup", a->skip_warmup, "no warmup batch");
  cmd->add_flag("--disable-ignore-eos", a->disable_ignore_eos, "let requests stop at the end-of-sequence token");
  cmd->add_flag("--disable-tqdm", a->disable_tqdm, "no progress bar");
  cmd->add_option("--dtype", a->dtype, "activation precision on the CPU (the GPU computes in bfloat16)")
      ->check(CLI::IsMember({"float32", "bfloat16"}));
  a->runtime.add(cmd);
  cmd->callback([a] { run_bench_offline(*a); });
}

}  // namespace ms::cli
