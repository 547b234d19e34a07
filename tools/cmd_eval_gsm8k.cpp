// `moeserve eval-gsm8k`: few-shot GSM8K accuracy of a served model (SGLang's
// benchmark/gsm8k): greedy answers, the last integer of each compared with the label.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/driver.h"
#include "bench/gsm8k.h"
#include "bench/model_info.h"
#include "commands.h"
#include "core/check.h"

namespace ms::cli {
namespace {
using namespace ms::bench;

struct Gsm8kArgs {
  std::string base_url = "http://127.0.0.1:30000", backend = "moeserve", data_path, tokenizer, model, output_file;
  int num_shots = 5, num_questions = 200, parallel = 64, max_new_tokens = 512;
  bool disable_tqdm = false;
};

// Text up to the first stop string: what the server cuts when it holds the tokenizer.
std::string cut_at_stop(std::string text) {
  for (const std::string& s : gsm8k_stop())
    if (size_t at = text.find(s); at != std::string::npos) text.resize(at);
  return text;
}

// A model's vocabulary may be larger than the tokenizer given here (padding rows, or another
// model's tokenizer on a test checkpoint); ids past the tokenizer's have no text.
std::string decode_known(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::vector<int32_t> known;
  for (int32_t id : ids)
    if (id >= 0 && id < tok.vocab_size()) known.push_back(id);
  return tok.decode(known, true);
}

// Prompts go as text, or as ids when the client tokenizes (--tokenizer): a server without a
// tokenizer takes ids only, and then cannot apply stop strings, so they are applied here.
std::vector<BenchPrompt> make_prompts(const Gsm8kArgs& a, const std::vector<Gsm8kItem>& items, const Tokenizer* tok) {
  const std::string shots = gsm8k_few_shot(items, a.num_shots);
  std::vector<BenchPrompt> prompts;
  for (size_t i = 0; i < items.size() && int(i) < a.num_questions; ++i) {
    BenchPrompt p;
    p.text = shots + gsm8k_example(items[i], false);
    if (tok) p.ids = tok->encode(p.text, true), p.text.clear();
    p.prompt_len = int(p.ids.size());
    p.output_len = a.max_new_tokens;
    prompts.push_back(std::move(p));
  }
  return prompts;
}

void run_eval(const Gsm8kArgs& a) {
  // cpp-httplib writes without MSG_NOSIGNAL: a server that closes mid-request must be an error
  // return on that request, not the end of the run.
  std::signal(SIGPIPE, SIG_IGN);
  HttpTarget target = parse_base_url(a.base_url);
  if (const char* key = std::getenv("OPENAI_API_KEY")) target.api_key = key;
  const std::vector<Gsm8kItem> items = read_gsm8k(a.data_path);
  std::unique_ptr<ModelVocab> vocab;
  if (!a.tokenizer.empty()) {
    vocab = std::make_unique<ModelVocab>(load_model_vocab(a.tokenizer));
    MS_CHECK(vocab->tokenizer, "--tokenizer ", a.tokenizer, ": no tokenizer.json");
  }
  const Tokenizer* tok = vocab ? vocab->tokenizer.get() : nullptr;
  const std::vector<BenchPrompt> prompts = make_prompts(a, items, tok);
  RequestSpec spec;
  spec.api = api_for_backend(a.backend);
  spec.ignore_eos = false;
  if (!tok) spec.stop = gsm8k_stop();
  if (spec.api == Api::Completions) spec.model = a.model.empty() ? server_model_name(target) : a.model;
  DriverOptions o{std::numeric_limits<double>::infinity(), a.parallel, 0, !a.disable_tqdm, "gsm8k"};
  DriverRun run = drive_requests(int(prompts.size()),
                                 [&](int i) { return send_streaming(target, spec, prompts[size_t(i)]); }, o);
  std::vector<std::string> generations;
  int64_t output_tokens = 0;
  int failed = 0;
  for (const RequestOutcome& r : run.outcomes) {
    if (!r.success && failed++ == 0) std::fprintf(stderr, "first failed request: %s\n", r.error.c_str());
    std::string text = r.generated_text.empty() && tok ? decode_known(*tok, r.output_ids) : r.generated_text;
    generations.push_back(tok ? cut_at_stop(std::move(text)) : std::move(text));
    output_tokens += r.success ? r.output_len : 0;
  }
  const Gsm8kScore s = score_gsm8k(items, generations);
  const double throughput = run.duration_s > 0 ? double(output_tokens) / run.duration_s : 0.0;
  std::printf("Accuracy: %.3f\nInvalid: %.3f\nLatency: %.3f s\nOutput throughput: %.3f token/s\n", s.accuracy(),
              s.invalid_rate(), run.duration_s, throughput);
  if (failed) std::printf("Failed requests: %d\n", failed);
  if (a.output_file.empty()) return;
  std::ofstream file(a.output_file, std::ios::app);
  MS_CHECK(file, "--output-file: cannot open ", a.output_file);
  nlohmann::json rec = {{"task", "gsm8k"},           {"backend", a.backend},      {"num_shots", a.num_shots},
                        {"num_questions", s.questions}, {"parallel", a.parallel}, {"accuracy", s.accuracy()},
                        {"invalid", s.invalid_rate()}, {"correct", s.correct},    {"failed", failed},
                        {"latency", run.duration_s},    {"output_tokens", output_tokens},
                        {"output_throughput", throughput}};
  file << rec.dump() << "\n";
}

}  // namespace

void add_eval_gsm8k(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval-gsm8k", "few-shot GSM8K accuracy of a served model");
  auto a = std::make_shared<Gsm8kArgs>();
  cmd->add_option("--base-url", a->base_url, "server URL");
  cmd->add_option("--backend", a->backend, "moeserve/sglang: POST /generate; vllm/openai: POST /v1/completions")
      ->check(CLI::IsMember({"moeserve", "sglang", "vllm", "openai"}));
  cmd->add_option("--model", a->model, "model name of OpenAI requests (default: the server's first)");
  cmd->add_option("--data-path", a->data_path, "GSM8K JSONL: {\"question\", \"answer\"} per line")->required();
  cmd->add_option("--num-shots", a->num_shots, "solved examples before each question (the file's first)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--num-questions", a->num_questions, "questions asked (the file's first)")->check(CLI::PositiveNumber);
  cmd->add_option("--parallel", a->parallel, "requests in flight")->check(CLI::PositiveNumber);
  cmd->add_option("--max-new-tokens", a->max_new_tokens, "longest answer")->check(CLI::PositiveNumber);
  cmd->add_option("--tokenizer", a->tokenizer, "tokenize here and send ids (for a server without a tokenizer)");
  cmd->add_option("--output-file", a->output_file, "append the result as one JSON line");
  cmd->add_flag("--disable-tqdm", a->disable_tqdm, "no progress bar");
  cmd->callback([a] { run_eval(*a); });
}

}  // namespace ms::cli
