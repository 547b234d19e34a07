// `moeserve logits`: one sequence through a checkpoint. `moeserve generate`: one prompt
// (--ids) or a file of requests (--input-file) through the batching engine.
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "demo_model.h"
#include "core/check.h"
#include "generate_input.h"
#include "parallel_args.h"
#include "runtime_args.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"
#include "runtime/engine.h"
#include "runtime/generator.h"
#include "runtime/parallel_engine.h"
#include "runtime/parallel_runner.h"
#include "speculative_args.h"

namespace ms::cli {

std::vector<int32_t> parse_ids(const std::string& text, const std::string& flag) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    int64_t v = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    MS_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size() && v >= 0 && v <= INT32_MAX, flag,
             ": \"", item, "\" is not a token id (expected comma-separated non-negative integers)");
    ids.push_back(int32_t(v));
    pos = comma + 1;
  }
  return ids;
}

namespace {

struct ModelArgs {
  std::string model_path, ids, dtype = "float32", device = "cpu";
  ParallelArgs parallel;
  CLI::Option* add(CLI::App* cmd) {
    parallel.add(cmd);
    cmd->add_option("--model-path", model_path, "Hugging Face checkpoint directory (generate: the demo model if omitted)");
    auto* ids_opt = cmd->add_option("--ids", ids, "prompt token ids, comma-separated (e.g. 5,17,3)");
    cmd->add_option("--dtype", dtype, "activation precision on the CPU (the GPU computes in bfloat16)")
        ->check(CLI::IsMember({"float32", "bfloat16"}));
    cmd->add_option("--device", device, "where the model runs")->check(CLI::IsMember({"cpu", "cuda"}));
    return ids_opt;
  }
  bool bf16() const { return dtype == "bfloat16" && device == "cpu"; }
  LoadOptions options() const {
    LoadOptions o;
    o.device = device == "cuda" ? Device::CUDA : Device::CPU;
    o.act_dtype = device == "cuda" ? DType::BF16 : DType::F32;
    o.parallel = parallel.resolved();
    return o;
  }
  std::unique_ptr<CausalLM> load() const {
    MS_CHECK(!parallel.multi_rank(), "this command runs on one rank (use --tp 1)");
    return load_model(model_path, options());
  }
  // Ranks as threads of this process (CPU: shared-memory collectives; CUDA: one GPU per rank,
  // NCCL); the prompt runs on DP group 0 and the other groups idle.
  std::unique_ptr<ParallelRunner> load_ranks() const {
    MS_CHECK(!bf16(), "--tp > 1 on the CPU computes in float32");
    LoadOptions o = options();
    return std::make_unique<ParallelRunner>(model_path, o.parallel, o);
  }
  static std::vector<std::vector<int32_t>> on_group_0(const ParallelRunner& r, std::vector<int32_t> ids) {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(r.dp_size()));
    prompts[0] = std::move(ids);
    return prompts;
  }
};

void add_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "write the logits at every prompt position to a safetensors file");
  auto args = std::make_shared<ModelArgs>();
  auto out = std::make_shared<std::string>();
  args->add(cmd)->required();
  cmd->add_option("--out", *out, "output .safetensors file (tensor `logits`, F32 [n, vocab])")->required();
  cmd->callback([args, out] {
    MS_CHECK(!args->model_path.empty(), "logits: --model-path is required");
    auto ids = parse_ids(args->ids, "--ids");
    Tensor logits;
    if (args->parallel.multi_rank()) {
      auto runner = args->load_ranks();
      logits = runner->prompt_logits(ModelArgs::on_group_0(*runner, ids))[0];
    } else {
      auto model = args->load();
      logits = Generator(*model, args->bf16()).prompt_logits(ids).to_f32();
    }
    if (args->parallel.config.node_rank == 0) write_safetensors(*out, {{"logits", logits}});
  });
}

// The checkpoint's tokenizer when it has one: "text" lines and stop strings need it.
std::unique_ptr<Tokenizer> load_tokenizer_if_present(const std::string& model_path) {
  if (!std::filesystem::exists(std::filesystem::path(model_path) / "tokenizer.json")) return nullptr;
  return std::make_unique<Tokenizer>(Tokenizer::load(model_path));
}

std::vector<InputLine> read_inputs(const ModelArgs& args, const SamplingParams& defaults, const std::string& input_file,
                                   const Tokenizer* tokenizer) {
  if (input_file.empty()) return {{{parse_ids(args.ids, "--ids"), defaults}, "--ids", false}};
  std::ifstream in(input_file);
  MS_CHECK(in, "--input-file: cannot open ", input_file);
  TextEncoder encode;
  if (tokenizer) encode = [tokenizer](const std::string& text) { return tokenizer->encode(text, true); };
  return read_generate_requests(in, input_file, defaults, encode);
}

// Greedy decoding of one prompt over several ranks.
void run_generate_ranks(const ModelArgs& args, const SamplingParams& p) {
  MS_CHECK(p.temperature == 0.0f, "--tp > 1 with generate decodes greedily (--temperature 0)");
  auto runner = args.load_ranks();
  auto out = runner->generate(ModelArgs::on_group_0(*runner, parse_ids(args.ids, "--ids")), p.max_new_tokens, p.ignore_eos);
  if (args.parallel.config.node_rank == 0)  // DP group 0 lives on node 0; the other nodes only serve ranks
    std::cout << nlohmann::json{{"output_ids", out[0]}}.dump() << std::endl;
}

void run_generate(const ModelArgs& args, const RuntimeArgs& runtime, const SamplingParams& defaults,
                  const std::string& input_file) {
  MS_CHECK(args.ids.empty() != input_file.empty(), "generate: give exactly one of --ids and --input-file");
  // One prompt over several ranks takes the simple lockstep runner, unless it speculates: the
  // draft-then-verify loop lives in the batching engine.
  if (args.parallel.multi_rank() && input_file.empty() && !runtime.engine.speculative.enabled())
    return run_generate_ranks(args, defaults);
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer_if_present(args.model_path);
  std::vector<InputLine> inputs = read_inputs(args, defaults, input_file, tokenizer.get());
  Detokenizer detok;
  if (tokenizer) detok = [t = tokenizer.get()](std::span<const int32_t> ids) { return t->decode(ids); };
  // Several ranks: one engine per rank in lockstep, requests spread over the DP groups.
  std::unique_ptr<ParallelRunner> runner;
  std::unique_ptr<CausalLM> model;
  std::unique_ptr<EngineApi> engine;
  if (args.parallel.multi_rank()) {
    runner = args.load_ranks();
    engine = std::make_unique<ParallelEngine>(*runner, runtime.options(false), detok);
  } else {
    model = args.load();
    engine = std::make_unique<Engine>(*model, runtime.options(args.bf16()), detok);
  }
  std::vector<GenerateRequest> requests;
  for (const InputLine& line : inputs) {
    try {
      engine->validate(line.request);
    } catch (const Error& e) {
      fail(line.where, ": ", e.what());
    }
    requests.push_back(line.request);
  }
  std::vector<GenerateResult> results = engine->generate(requests);
  for (size_t i = 0; i < results.size(); ++i) {
    if (input_file.empty()) {
      std::cout << nlohmann::json{{"output_ids", results[i].output_ids}}.dump() << "\n";
      continue;
    }
    std::string text;
    if (inputs[i].text) text = tokenizer->decode(results[i].output_ids);
    std::cout << result_json(results[i], requests[i].sampling, inputs[i].text ? &text : nullptr) << "\n";
  }
  std::cout << std::flush;
  if (runtime.engine.speculative.enabled()) print_speculative_stats(std::cerr, engine->stats().spec);
}

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate",
                                 "generate after one prompt (--ids; prints {\"output_ids\": [...]}) or after every "
                                 "request of a JSON-lines file (--input-file; one result line per request, in order)");
  auto args = std::make_shared<ModelArgs>();
  auto runtime = std::make_shared<RuntimeArgs>();
  auto opt = std::make_shared<SamplingParams>();
  auto input_file = std::make_shared<std::string>();
  opt->temperature = 0.0f;  // greedy unless asked
  args->add(cmd);
  cmd->add_option("--input-file", *input_file,
                  "JSON lines: {\"input_ids\": [...] or \"text\": \"...\" (with a tokenizer.json), \"max_new_tokens\": N, "
                  "\"temperature\": T, \"stop\": [...], ...}; the flags below are the defaults of fields a line leaves out");
  cmd->add_option("--max-new-tokens", opt->max_new_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", opt->temperature, "0 for greedy")->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", opt->top_p, "nucleus sampling threshold");
  cmd->add_option("--top-k", opt->top_k, "sample among the k most likely tokens (<= 0: all)");
  cmd->add_option_function<uint64_t>("--seed", [opt](const uint64_t& seed) { opt->seed = seed; }, "sampling seed");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "keep going past the end-of-sequence token");
  runtime->add(cmd);
  cmd->callback([args, runtime, opt, input_file] {
    if (args->model_path.empty()) args->model_path = ensure_demo_model();  // random weights: noise
    run_generate(*args, *runtime, *opt, *input_file);
  });
}

}  // namespace

void add_model_commands(CLI::App& app) {
  add_logits(app);
  add_generate(app);
}

}  // namespace ms::cli
