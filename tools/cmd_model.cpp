// `moeserve logits` and `moeserve generate`: one sequence through a checkpoint on the CPU.
#include <charconv>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/check.h"
#include "io/safetensors.h"
#include "runtime/generator.h"

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
  void add(CLI::App* cmd) {
    cmd->add_option("--model-path", model_path, "Hugging Face checkpoint directory")->required();
    cmd->add_option("--ids", ids, "prompt token ids, comma-separated (e.g. 5,17,3)")->required();
    cmd->add_option("--dtype", dtype, "activation precision on the CPU (the GPU computes in bfloat16)")
        ->check(CLI::IsMember({"float32", "bfloat16"}));
    cmd->add_option("--device", device, "where the model runs")->check(CLI::IsMember({"cpu", "cuda"}));
  }
  bool bf16() const { return dtype == "bfloat16" && device == "cpu"; }
  std::unique_ptr<CausalLM> load() const {
    LoadOptions o;
    o.device = device == "cuda" ? Device::CUDA : Device::CPU;
    o.act_dtype = device == "cuda" ? DType::BF16 : DType::F32;
    return load_model(model_path, o);
  }
};

void add_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "write the logits at every prompt position to a safetensors file");
  auto args = std::make_shared<ModelArgs>();
  auto out = std::make_shared<std::string>();
  args->add(cmd);
  cmd->add_option("--out", *out, "output .safetensors file (tensor `logits`, F32 [n, vocab])")->required();
  cmd->callback([args, out] {
    auto ids = parse_ids(args->ids, "--ids");
    auto model = args->load();
    Generator gen(*model, args->bf16());
    Tensor logits = gen.prompt_logits(ids).to_f32();
    write_safetensors(*out, {{"logits", logits}});
  });
}

void add_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "generate tokens after a prompt; prints {\"output_ids\": [...]}");
  auto args = std::make_shared<ModelArgs>();
  auto opt = std::make_shared<GenerateOptions>();
  args->add(cmd);
  cmd->add_option("--max-new-tokens", opt->max_new_tokens, "tokens to generate")->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", opt->temperature, "0 for greedy")->check(CLI::NonNegativeNumber);
  cmd->add_option("--seed", opt->seed, "sampling seed");
  cmd->add_flag("--ignore-eos", opt->ignore_eos, "keep going past the end-of-sequence token");
  cmd->callback([args, opt] {
    auto ids = parse_ids(args->ids, "--ids");
    auto model = args->load();
    Generator gen(*model, args->bf16());
    auto out = gen.generate(ids, *opt);
    std::cout << nlohmann::json{{"output_ids", out}}.dump() << std::endl;
  });
}

}  // namespace

void add_model_commands(CLI::App& app) {
  add_logits(app);
  add_generate(app);
}

}  // namespace ms::cli
