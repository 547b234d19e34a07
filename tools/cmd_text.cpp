// `moeserve tokenize`, `detokenize`, `chat-template` and `bench-tokenizer`: the text side of a
// checkpoint (tokenizer.json, tokenizer_config.json) without loading any weights.
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/check.h"
#include "io/chat_template.h"
#include "io/text_file.h"
#include "io/tokenizer.h"

namespace ms::cli {
namespace {

// JSON output keeps non-ASCII text as UTF-8; invalid bytes cannot occur (decode replaces them).
std::string dump(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict); }

struct TextInput {
  std::string text, text_file;
  bool text_given = false;
  void add(CLI::App* cmd) {
    cmd->add_option("--text", text, "the text")->each([this](const std::string&) { text_given = true; });
    cmd->add_option("--text-file", text_file, "read the text from a file (bytes as they are)");
  }
  std::string get() const {
    MS_CHECK(text_given != !text_file.empty(), "give exactly one of --text and --text-file");
    return text_given ? text : read_text_file(text_file);
  }
};

void add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "text -> token ids; prints {\"ids\": [...]}");
  auto dir = std::make_shared<std::string>();
  auto input = std::make_shared<TextInput>();
  auto special = std::make_shared<bool>(false);
  cmd->add_option("--model-path", *dir, "directory with tokenizer.json and tokenizer_config.json")->required();
  input->add(cmd);
  cmd->add_flag("--add-special-tokens", *special, "add what the model puts around a text (DeepSeek-V3: BOS)");
  cmd->callback([dir, input, special] {
    auto tok = Tokenizer::load(*dir);
    std::cout << dump({{"ids", tok.encode(input->get(), *special)}}) << std::endl;
  });
}

void add_detokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("detokenize", "token ids -> text; prints {\"text\": \"...\"}");
  auto dir = std::make_shared<std::string>();
  auto ids = std::make_shared<std::string>();
  auto skip = std::make_shared<bool>(false);
  cmd->add_option("--model-path", *dir, "directory with tokenizer.json and tokenizer_config.json")->required();
  cmd->add_option("--ids", *ids, "token ids, comma-separated (e.g. 5,17,3)")->required();
  cmd->add_flag("--skip-special-tokens", *skip, "leave special tokens out of the text");
  cmd->callback([dir, ids, skip] {
    auto parsed = parse_ids(*ids, "--ids");
    auto tok = Tokenizer::load(*dir);
    std::cout << dump({{"text", tok.decode(parsed, *skip)}}) << std::endl;
  });
}

// "--var name=value": the value is JSON when it parses as JSON (false, 3, "x", [..]), else a string.
nlohmann::ordered_json parse_vars(const std::vector<std::string>& vars) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (const auto& v : vars) {
    auto eq = v.find('=');
    MS_CHECK(eq != std::string::npos && eq > 0, "--var \"", v, "\": expected name=value");
    std::string value = v.substr(eq + 1);
    auto parsed = nlohmann::ordered_json::parse(value, nullptr, false);
    out[v.substr(0, eq)] = parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
  }
  return out;
}

void add_chat_template(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat-template", "render the model's chat template; prints the prompt exactly");
  struct Args {
    std::string dir, messages_file, tools_file;
    bool generation_prompt = false;
    std::vector<std::string> vars;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--model-path", a->dir, "directory with tokenizer_config.json")->required();
  cmd->add_option("--messages-file", a->messages_file,
                  "JSON file: a list of messages, or {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_option("--tools-file", a->tools_file, "JSON file with the list of tools");
  cmd->add_flag("--add-generation-prompt", a->generation_prompt, "end with the assistant's turn header");
  cmd->add_option("--var", a->vars, "extra template variable name=value (value parsed as JSON if it can be)");
  cmd->callback([a] {
    auto tmpl = ChatTemplate::load(a->dir);
    auto doc = nlohmann::ordered_json::parse(read_text_file(a->messages_file));
    ChatTemplate::Inputs in;
    in.messages = doc.is_object() ? doc.at("messages") : doc;
    if (doc.is_object() && doc.contains("tools")) in.tools = doc["tools"];
    if (!a->tools_file.empty()) in.tools = nlohmann::ordered_json::parse(read_text_file(a->tools_file));
    in.add_generation_prompt = a->generation_prompt;
    in.extra = parse_vars(a->vars);
    std::cout << tmpl.render(in) << std::flush;
  });
}

// Single-thread encoding throughput over a text file, in MB (1e6 bytes) per second.
void add_bench_tokenizer(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench-tokenizer", "measure encode throughput (single thread, MB/s)");
  auto dir = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto repeat = std::make_shared<int>(5);
  cmd->add_option("--model-path", *dir, "directory with tokenizer.json")->required();
  cmd->add_option("--text-file", *file, "text to encode")->required();
  cmd->add_option("--repeat", *repeat, "timed passes (the best is reported)")->check(CLI::PositiveNumber);
  cmd->callback([dir, file, repeat] {
    auto tok = Tokenizer::load(*dir);
    std::string text = read_text_file(*file);
    size_t n_ids = tok.encode(text).size();  // warm-up pass, also fills the word cache
    double best = 1e30;
    for (int r = 0; r < *repeat; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      n_ids = tok.encode(text).size();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::cout << dump({{"bytes", text.size()}, {"tokens", n_ids}, {"seconds", best},
                       {"mb_per_s", double(text.size()) / 1e6 / best}})
              << std::endl;
  });
}

}  // namespace

void add_text_commands(CLI::App& app) {
  add_tokenize(app);
  add_detokenize(app);
  add_chat_template(app);
  add_bench_tokenizer(app);
}

}  // namespace ms::cli
