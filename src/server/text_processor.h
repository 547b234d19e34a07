// The server's text side: prompts to token ids (tokenizer, chat template) and generated ids back
// to text, incrementally for streams. It runs on the HTTP threads, never on the scheduler's.
// A model directory without tokenizer.json has no TextProcessor: the server then takes and
// returns token ids only.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/chat_template.h"
#include "io/tokenizer.h"

namespace ms::server {

class TextProcessor {
 public:
  // Null when `model_dir` has no tokenizer.json.
  static std::unique_ptr<TextProcessor> load_if_present(const std::string& model_dir);
  explicit TextProcessor(Tokenizer tokenizer, std::optional<ChatTemplate> chat_template);

  const Tokenizer& tokenizer() const { return tokenizer_; }
  // A prompt's ids, with the special tokens the model adds around a text (as HF's default).
  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const;
  // What one token reads as on its own (logprob listings).
  std::string token_text(int32_t id) const;
  bool has_chat_template() const { return chat_template_.has_value(); }
  // The prompt text of a conversation; `messages` already checked by the protocol layer.
  std::string render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                          const nlohmann::ordered_json& template_kwargs, bool add_generation_prompt) const;

 private:
  Tokenizer tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  mutable std::mutex template_mu_;  // rendering keeps evaluation state in the template
};

// One choice's generated text as tokens arrive: complete characters only, and held back while
// its end could be the start of a stop string, so that no stream ever shows a stop string (or
// part of one) that OpenAI semantics cut away.
class ChoiceText {
 public:
  ChoiceText(const TextProcessor& text, bool skip_special_tokens, std::vector<std::string> stop);
  // Text that is now safe to show after `ids`.
  std::string push(std::span<const int32_t> ids);
  // The rest, at the end of the request, with its last `ids`; `stop_string` is the stop string
  // that ended it (cut from the text with all that follows), or empty.
  std::string finish(std::span<const int32_t> ids, const std::string& stop_string);
  const std::string& shown() const { return shown_; }  // everything returned so far

 private:
  size_t held_suffix() const;  // bytes at the end of pending_ that could begin a stop string
  IncrementalDecoder decoder_;
  std::vector<std::string> stop_;
  std::string pending_, shown_;
};

}  // namespace ms::server
