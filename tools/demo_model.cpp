#include "demo_model.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <unistd.h>

#include "bpe_trainer.h"
#include "core/check.h"
#include "model_shapes.h"
#include "random_checkpoint.h"

namespace ms::cli {
namespace {

namespace fs = std::filesystem;
using OJson = nlohmann::ordered_json;

// The tokenizer's training text. Any English text would do; this one describes the project.
constexpr const char* kCorpus = R"(moeserve is a serving engine for mixture of experts language models. It loads a model,
keeps the keys and values of every request in a pool of cache slots, and answers requests over HTTP.
A request arrives with a prompt. The server turns the prompt into tokens, the scheduler puts the
request into a batch, and the model computes the next token for every request in the batch at once.
The first step of a request is the prefill: all of its prompt tokens go through the model together.
Every later step is a decode step: one new token for each running request. When a long prompt
arrives, the scheduler cuts its prefill into chunks so that the other requests keep decoding.
The radix cache remembers the prompts it has seen. When a new request starts with the same text as
an old one, the cache gives it the old keys and values, and only the new part of the prompt is
computed. This makes chat fast: each turn of a conversation starts with all the turns before it.
In a mixture of experts model, each layer has many small feed forward networks, the experts, and a
router that chooses a few of them for each token. Only the chosen experts run, so the model can be
large while each token costs little. The router gives each expert a weight, and the output of the
layer is the weighted sum of the outputs of the chosen experts.
The server speaks the protocol of the OpenAI API. A client sends a list of messages, the server
applies the chat template of the model to them, and the reply comes back as one message or as a
stream of small pieces, each sent as soon as its tokens are ready. The client can ask for several
choices, for the probabilities of the tokens, for a maximum number of tokens, and for stop strings.
When the client goes away in the middle of a stream, the server stops the request and frees its
cache slots for the others. When a request asks for something the server cannot do, the answer is
an error that says what was wrong, and the server goes on serving everyone else.
The numbers that matter are the time to the first token, the time between tokens, and the number of
requests and tokens the server finishes every second. The metrics page shows them all, together with
the number of running and waiting requests and the share of the cache in use.
This demo model has random weights. Its text is noise: the words it writes mean nothing. It exists
so that you can see the server work, the tokens stream, and the tools run, before you download a
real model. Point the server at a real checkpoint with the model path flag to get real answers.
Hello! How are you today? I am fine, thank you. What is the weather like? It is sunny and warm.
The quick brown fox jumps over the lazy dog. One, two, three, four, five, six, seven, eight, nine, ten.
0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 "quoted" (parenthesised) [bracketed] {braced} a-b a_b a/b
)";

constexpr const char* kChatMl =
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";

void write_json(const fs::path& path, const OJson& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  MS_CHECK(out.good(), "cannot write ", path.string());
}

}  // namespace

void make_demo_model(const std::string& dir) {
  const std::vector<std::string> specials = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  OJson tokenizer = train_byte_level_bpe(kCorpus, 1200, specials);
  const int vocab = int(tokenizer["model"]["vocab"].size() + specials.size());
  const int endoftext = vocab - 3, im_end = vocab - 1;
  nlohmann::json cfg = shape_config("qwen3-moe-small", 4, false);
  cfg["vocab_size"] = vocab, cfg["hidden_size"] = 256, cfg["intermediate_size"] = 512;
  cfg["moe_intermediate_size"] = 128, cfg["num_attention_heads"] = 8, cfg["num_key_value_heads"] = 2;
  cfg["head_dim"] = 32, cfg["num_experts"] = 16, cfg["num_experts_per_tok"] = 4;
  cfg["max_position_embeddings"] = 4096, cfg["bos_token_id"] = endoftext, cfg["eos_token_id"] = im_end;
  write_random_checkpoint(cfg, 2024, dir, "moeserve demo model (Qwen3-MoE shape, random weights)");
  write_json(fs::path(dir) / "tokenizer.json", tokenizer);
  OJson decoder = OJson::object();
  for (size_t i = 0; i < specials.size(); ++i)
    decoder[std::to_string(vocab - 3 + int(i))] = {{"content", specials[i]}, {"lstrip", false}, {"normalized", false},
                                                   {"rstrip", false}, {"single_word", false}, {"special", true}};
  write_json(fs::path(dir) / "tokenizer_config.json",
             {{"add_bos_token", false}, {"add_prefix_space", false}, {"added_tokens_decoder", decoder},
              {"bos_token", nullptr}, {"chat_template", kChatMl}, {"clean_up_tokenization_spaces", false},
              {"eos_token", "<|im_end|>"}, {"errors", "replace"}, {"model_max_length", 4096},
              {"pad_token", "<|endoftext|>"}, {"tokenizer_class", "Qwen2Tokenizer"}, {"unk_token", nullptr}});
  std::ofstream(fs::path(dir) / "README.md")
      << "moeserve demo model: random weights in a small Qwen3-MoE shape, a byte-level BPE tokenizer of " << vocab
      << " tokens trained on a built-in text, and a ChatML template. Its text is noise.\n";
}

std::string default_demo_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home && *home ? home : "/tmp") / ".cache";
  return (base / "moeserve" / "demo-v1").string();
}

std::string ensure_demo_model() {
  const fs::path dir = default_demo_dir();
  if (fs::exists(dir / "tokenizer_config.json")) return dir.string();
  std::cerr << "no --model-path: creating the demo model (random weights, its text is noise) in " << dir.string()
            << "\n";
  // Written aside and renamed into place, so that a concurrent first use never sees half a model.
  const fs::path tmp = dir.string() + ".tmp-" + std::to_string(getpid());
  fs::create_directories(tmp);
  make_demo_model(tmp.string());
  std::error_code ec;
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp);
    MS_CHECK(fs::exists(dir / "tokenizer_config.json"), "cannot create the demo model in ", dir.string(), ": ",
             ec.message());
  }
  return dir.string();
}

void add_make_demo_model(CLI::App& app) {
  auto* cmd = app.add_subcommand("make-demo-model",
                                 "write the demo model: random weights (its text is noise), a real byte-level BPE "
                                 "tokenizer and a chat template");
  auto dir = std::make_shared<std::string>();
  cmd->add_option("dir", *dir, "output directory")->required();
  cmd->callback([dir] { make_demo_model(*dir); });
}

}  // namespace ms::cli
