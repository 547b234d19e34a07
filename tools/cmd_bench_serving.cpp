// `moeserve bench-serving`: SGLang's bench_serving against any server with SGLang's native
// /generate or OpenAI's /v1/completions. Every request streams; the "Serving Benchmark Result"
// block goes to stdout and one JSON record is appended to --output-file.
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>

#include "bench/driver.h"
#include "bench/metrics.h"
#include "bench/model_info.h"
#include "commands.h"
#include "core/check.h"

namespace ms::cli {
namespace {
using namespace ms::bench;

struct ServingArgs {
  std::string base_url = "http://127.0.0.1:30000", backend = "moeserve", dataset_name = "random";
  std::string dataset_path, output_file, tokenizer, model, request_rate = "inf";
  int num_prompts = 1000, input_len = 1024, output_len = 1024, max_concurrency = 0, warmup = 1;
  int sharegpt_output_len = 0, sharegpt_context_len = 0;
  double range_ratio = 0.0;
  uint64_t seed = 1;
  bool disable_tqdm = false, output_details = false, disable_ignore_eos = false;
};

double parse_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double rate = std::strtod(text.c_str(), &end);
  MS_CHECK(end && *end == '\0' && rate > 0, "--request-rate ", text, ": expected a positive number or inf");
  return rate;
}

ModelVocab resolve_vocab(const ServingArgs& a, const HttpTarget& target) {
  std::string dir = a.tokenizer.empty() ? server_model_dir(target) : a.tokenizer;
  MS_CHECK(!dir.empty(), "bench-serving: no tokenizer: give --tokenizer DIR (the served checkpoint) so prompts use "
           "its vocabulary");
  return load_model_vocab(dir);
}

std::vector<BenchPrompt> make_prompts(const ServingArgs& a, const ModelVocab& vocab) {
  if (a.dataset_name == "sharegpt") {
    MS_CHECK(vocab.tokenizer, "--dataset-name sharegpt measures prompts with the model's tokenizer: ", vocab.dir,
             " has no tokenizer.json");
    MS_CHECK(!a.dataset_path.empty(), "--dataset-name sharegpt needs --dataset-path");
    return sharegpt_dataset(read_sharegpt(a.dataset_path, a.seed), a.num_prompts, *vocab.tokenizer,
                            a.sharegpt_output_len, a.sharegpt_context_len);
  }
  std::vector<std::string> texts;
  if (!a.dataset_path.empty())
    for (auto& [prompt, reply] : read_sharegpt(a.dataset_path, a.seed)) texts.push_back(std::move(prompt));
  RandomDatasetOptions o{a.num_prompts, a.input_len, a.output_len, a.range_ratio, a.seed, vocab.vocab_size};
  return random_dataset(o, vocab.tokenizer.get(), texts);
}

// Like SGLang: W copies of the first prompt (at most 32 new tokens) at once; one must succeed.
void warm_up(const ServingArgs& a, const HttpTarget& target, const RequestSpec& spec, BenchPrompt first) {
  if (a.warmup <= 0) return;
  std::printf("Starting warmup with %d sequences...\n", a.warmup);
  first.output_len = std::min(first.output_len, 32);
  DriverOptions o{std::numeric_limits<double>::infinity(), 0, a.seed, false, ""};
  DriverRun run = drive_requests(a.warmup, [&](int) { return send_streaming(target, spec, first); }, o);
  bool any = false;
  for (const auto& out : run.outcomes) any = any || out.success;
  MS_CHECK(any, "warmup failed; check the benchmark arguments: ", run.outcomes[0].error);
  std::printf("Warmup completed with %d sequences. Starting main benchmark run...\n", a.warmup);
}

int64_t retokenized(const std::vector<RequestOutcome>& outcomes, const Tokenizer* tokenizer) {
  if (!tokenizer) return -1;
  int64_t n = 0;
  bool any_text = false;
  for (const auto& o : outcomes) {
    if (!o.success || o.generated_text.empty()) continue;
    any_text = true;
    n += int64_t(tokenizer->encode(o.generated_text).size());
  }
  return any_text ? n : -1;  // an ids-only server sends no text to count
}

nlohmann::json record(const ServingArgs& a, double rate, const ServingMetrics& m, const DriverRun& run) {
  using nlohmann::json;
  json r = {{"backend", a.backend},
            {"dataset_name", a.dataset_name},
            {"num_prompts", a.num_prompts},
            {"request_rate", std::isinf(rate) ? json("inf") : json(rate)},
            {"max_concurrency", a.max_concurrency > 0 ? json(a.max_concurrency) : json()},
            {"random_input_len", a.input_len},
            {"random_output_len", a.output_len},
            {"random_range_ratio", a.range_ratio},
            {"seed", a.seed}};
  r.update(metrics_json(m));
  if (a.output_details) r.update(details_json(run.outcomes));
  return r;
}

void run_bench_serving(const ServingArgs& a) {
  // cpp-httplib writes without MSG_NOSIGNAL: a server that closes mid-request must be an error
  // return on that request, not the end of the run.
  std::signal(SIGPIPE, SIG_IGN);
  HttpTarget target = parse_base_url(a.base_url);
  if (const char* key = std::getenv("OPENAI_API_KEY")) target.api_key = key;
  const double rate = parse_rate(a.request_rate);
  RequestSpec spec;
  spec.api = api_for_backend(a.backend);
  spec.ignore_eos = !a.disable_ignore_eos;
  if (spec.api == Api::Completions) spec.model = a.model.empty() ? server_model_name(target) : a.model;
  const ModelVocab vocab = resolve_vocab(a, target);
  const std::vector<BenchPrompt> prompts = make_prompts(a, vocab);
  int64_t in = 0, out = 0;
  for (const auto& p : prompts) in += p.prompt_len, out += p.output_len;
  std::printf("#Input tokens: %lld\n#Output tokens: %lld\n", (long long)in, (long long)out);
  warm_up(a, target, spec, prompts[0]);
  DriverOptions o{rate, a.max_concurrency, a.seed, !a.disable_tqdm, ""};
  DriverRun run = drive_requests(int(prompts.size()),
                                 [&](int i) { return send_streaming(target, spec, prompts[size_t(i)]); }, o);
  ServingMetrics m = compute_metrics(run.outcomes, run.duration_s);
  m.total_output_retokenized = retokenized(run.outcomes, vocab.tokenizer.get());
  for (const auto& r : run.outcomes)
    if (!r.success) {
      std::fprintf(stderr, "first failed request: %s\n", r.error.c_str());
      break;
    }
  std::cout << "\n" << format_result(m, {a.backend, rate, a.max_concurrency}) << std::flush;
  if (a.output_file.empty()) return;
  std::ofstream file(a.output_file, std::ios::app);
  MS_CHECK(file, "--output-file: cannot open ", a.output_file);
  file << record(a, rate, m, run).dump() << "\n";
}

}  // namespace

void add_bench_serving(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-serving", "online serving benchmark against an HTTP server (SGLang's bench_serving)");
  auto a = std::make_shared<ServingArgs>();
  cmd->add_option("--base-url", a->base_url, "server URL");
  cmd->add_option("--backend", a->backend, "moeserve/sglang: POST /generate; vllm/openai: POST /v1/completions")
      ->check(CLI::IsMember({"moeserve", "sglang", "vllm", "openai"}));
  cmd->add_option("--model", a->model, "model name of OpenAI requests (default: the server's first)");
  cmd->add_option("--tokenizer", a->tokenizer, "checkpoint directory of the served model (default: the server's, "
                                               "when it is on this machine)");
  cmd->add_option("--dataset-name", a->dataset_name, "prompt source")->check(CLI::IsMember({"random", "sharegpt"}));
  cmd->add_option("--dataset-path", a->dataset_path, "ShareGPT JSON (sharegpt; for random: texts to cut prompts from)");
  cmd->add_option("--num-prompts", a->num_prompts, "requests to send")->check(CLI::PositiveNumber);
  cmd->add_option("--random-input-len", a->input_len, "longest random prompt")->check(CLI::PositiveNumber);
  cmd->add_option("--random-output-len", a->output_len, "most tokens to generate")->check(CLI::PositiveNumber);
  cmd->add_option("--random-range-ratio", a->range_ratio, "lengths are uniform in [len * ratio, len]")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--sharegpt-output-len", a->sharegpt_output_len, "fixed output length for ShareGPT prompts");
  cmd->add_option("--sharegpt-context-len", a->sharegpt_context_len, "skip ShareGPT pairs longer than this");
  cmd->add_option("--request-rate", a->request_rate, "Poisson arrivals per second, or inf");
  cmd->add_option("--max-concurrency", a->max_concurrency, "most requests in flight")->check(CLI::PositiveNumber);
  cmd->add_option("--seed", a->seed, "seed of the dataset and the arrivals");
  cmd->add_option("--warmup-requests", a->warmup, "requests sent before the measurement")->check(CLI::NonNegativeNumber);
  cmd->add_option("--output-file", a->output_file, "append the result as one JSON line");
  cmd->add_flag("--output-details", a->output_details, "add per-request lengths, times and errors to the record");
  cmd->add_flag("--disable-ignore-eos", a->disable_ignore_eos, "let requests stop at the end-of-sequence token");
  cmd->add_flag("--disable-tqdm", a->disable_tqdm, "no progress bar");
  cmd->callback([a] { run_bench_serving(*a); });
}

}  // namespace ms::cli
