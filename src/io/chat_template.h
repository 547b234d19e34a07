// A model's chat template (tokenizer_config.json "chat_template", or chat_template.jinja next
// to it) rendered with the variables transformers' apply_chat_template passes: messages,
// tools, add_generation_prompt, the special tokens (bos_token, eos_token, ...) and extras
// such as Qwen3's enable_thinking.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace ms {

namespace jinja {
class Template;
}

class ChatTemplate {
 public:
  struct Inputs {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    nlohmann::ordered_json tools;  // null: no tools (the template sees `tools` as none)
    bool add_generation_prompt = false;
    nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more variables
  };

  static ChatTemplate load(const std::string& model_dir);
  // `special_tokens` maps bos_token/eos_token/... to their text; `name` appears in errors.
  ChatTemplate(const std::string& source, nlohmann::ordered_json special_tokens, std::string name);
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;
  ~ChatTemplate();

  std::string render(const Inputs& inputs) const;

 private:
  std::unique_ptr<jinja::Template> template_;
  nlohmann::ordered_json special_tokens_;
};

}  // namespace ms
