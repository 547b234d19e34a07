#include "io/chat_template.h"

#include "core/check.h"
#include "io/jinja.h"
#include "io/text_file.h"

namespace ms {
using ojson = nlohmann::ordered_json;

namespace {

// transformers passes every special token of special_tokens_map that is set.
ojson special_tokens_of(const ojson& config) {
  ojson out = ojson::object();
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    auto it = config.find(key);
    if (it == config.end() || it->is_null()) continue;
    if (it->is_string()) out[key] = *it;
    else if (it->is_object() && it->contains("content")) out[key] = (*it)["content"];
  }
  if (config.contains("additional_special_tokens")) out["additional_special_tokens"] = config["additional_special_tokens"];
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::load(const std::string& model_dir) {
  std::string config_path = model_dir + "/tokenizer_config.json";
  ojson config;
  try {
    config = ojson::parse(read_text_file(config_path));
  } catch (const ojson::exception& e) {
    fail(config_path, ": invalid JSON: ", e.what());
  }
  // Newer checkpoints keep the template in its own file.
  if (auto jinja = read_text_file_if_exists(model_dir + "/chat_template.jinja"))
    return ChatTemplate(*jinja, special_tokens_of(config), model_dir + "/chat_template.jinja");
  auto it = config.find("chat_template");
  MS_CHECK(it != config.end() && !it->is_null(), config_path, ": no chat_template");
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else {  // [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
    MS_CHECK(it->is_array(), config_path, ": chat_template is neither a string nor a list of named templates");
    for (const auto& t : *it)
      if (t.value("name", "") == "default") source = t.value("template", "");
    MS_CHECK(!source.empty(), config_path, ": chat_template has no \"default\" template");
  }
  return ChatTemplate(source, special_tokens_of(config), config_path);
}

ChatTemplate::ChatTemplate(const std::string& source, ojson special_tokens, std::string name)
    : template_(std::make_unique<jinja::Template>(source, std::move(name))),
      special_tokens_(std::move(special_tokens)) {}

ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const Inputs& inputs) const {
  MS_CHECK(inputs.messages.is_array(), "chat template: messages must be a list");
  MS_CHECK(inputs.extra.is_object(), "chat template: extra variables must be a dict");
  ojson ctx = special_tokens_;
  ctx["messages"] = inputs.messages;
  ctx["tools"] = inputs.tools;
  ctx["add_generation_prompt"] = inputs.add_generation_prompt;
  for (const auto& [k, v] : inputs.extra.items()) ctx[k] = v;
  return template_->render(jinja::Value::from_json(ctx));
}

}  // namespace ms
