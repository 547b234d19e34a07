#include "server/text_processor.h"

#include <filesystem>
#include <fstream>

namespace ms::server {

std::unique_ptr<TextProcessor> TextProcessor::load_if_present(const std::string& model_dir) {
  namespace fs = std::filesystem;
  if (!fs::exists(fs::path(model_dir) / "tokenizer.json")) return nullptr;
  Tokenizer tokenizer = Tokenizer::load(model_dir);
  std::optional<ChatTemplate> chat;
  // A tokenizer without a chat template still serves /v1/completions; chat requests get a 400.
  const bool has_template = fs::exists(fs::path(model_dir) / "chat_template.jinja") ||
                            (fs::exists(fs::path(model_dir) / "tokenizer_config.json") &&
                             nlohmann::json::parse(std::ifstream(fs::path(model_dir) / "tokenizer_config.json"),
                                                   nullptr, false)
                                 .contains("chat_template"));
  if (has_template) chat.emplace(ChatTemplate::load(model_dir));
  return std::make_unique<TextProcessor>(std::move(tokenizer), std::move(chat));
}

TextProcessor::TextProcessor(Tokenizer tokenizer, std::optional<ChatTemplate> chat_template)
    : tokenizer_(std::move(tokenizer)), chat_template_(std::move(chat_template)) {}

std::vector<int32_t> TextProcessor::encode(const std::string& text) const { return tokenizer_.encode(text, true); }

std::string TextProcessor::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  return tokenizer_.decode(ids, skip_special_tokens);
}

std::string TextProcessor::token_text(int32_t id) const { return tokenizer_.decode(std::span<const int32_t>(&id, 1)); }

std::string TextProcessor::render_chat(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                                       const nlohmann::ordered_json& template_kwargs, bool add_generation_prompt) const {
  ChatTemplate::Inputs in;
  in.messages = messages;
  in.tools = tools;
  in.add_generation_prompt = add_generation_prompt;
  if (template_kwargs.is_object()) in.extra = template_kwargs;
  std::lock_guard lk(template_mu_);
  return chat_template_->render(in);
}

ChoiceText::ChoiceText(const TextProcessor& text, bool skip_special_tokens, std::vector<std::string> stop)
    : decoder_(text.tokenizer(), skip_special_tokens), stop_(std::move(stop)) {}

size_t ChoiceText::held_suffix() const {
  size_t held = 0;
  for (const std::string& s : stop_)
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > held; --len)
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        held = len;
        break;
      }
  return held;
}

std::string ChoiceText::push(std::span<const int32_t> ids) {
  for (int32_t id : ids) pending_ += decoder_.push(id);
  const size_t keep = held_suffix();
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, out.size());
  shown_ += out;
  return out;
}

std::string ChoiceText::finish(std::span<const int32_t> ids, const std::string& stop_string) {
  for (int32_t id : ids) pending_ += decoder_.push(id);
  pending_ += decoder_.finish();
  if (!stop_string.empty()) {
    // The stop string starts inside pending_: every suffix that could begin one was held.
    const size_t at = pending_.find(stop_string);
    if (at != std::string::npos) pending_.resize(at);
  }
  std::string out = std::move(pending_);
  pending_.clear();
  shown_ += out;
  return out;
}

}  // namespace ms::server
