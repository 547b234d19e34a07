#include "server/openai_protocol.h"

#include <algorithm>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace ms::server {
namespace {

using OJson = nlohmann::ordered_json;

const TextProcessor& need_text(const TextProcessor* text, const char* param) {
  if (!text)
    throw ApiError(400, fmt("'", param, "' needs a tokenizer, and this model directory has no tokenizer.json; send "
                            "token ids to /generate (input_ids)"),
                   "invalid_request_error", param);
  return *text;
}

// prompt: a string, a list of strings, a list of token ids, or a list of token-id lists.
void read_prompts(const Json& body, const TextProcessor* text, CompletionJob& job) {
  if (!has_field(body, "prompt")) bad_request("prompt", "'prompt' is required");
  const Json& p = body["prompt"];
  auto add_text = [&](const Json& s) {
    if (s.get_ref<const std::string&>().empty()) bad_request("prompt", "'prompt' must not be empty");
    job.prompt_texts.push_back(s.get<std::string>());
    job.prompts.push_back(need_text(text, "prompt").encode(job.prompt_texts.back()));
  };
  if (p.is_string()) return add_text(p);
  if (!p.is_array() || p.empty())
    bad_request("prompt", "'prompt' must be a string, a list of strings, a list of token ids or a list of such lists");
  if (p[0].is_number_integer()) {
    job.prompts.push_back(to_token_ids(p, "prompt"));
    return;
  }
  for (const Json& item : p) {
    if (item.is_string()) add_text(item);
    else if (item.is_array() && !item.empty()) job.prompts.push_back(to_token_ids(item, "prompt"));
    else bad_request("prompt", "'prompt' list items must be non-empty strings or non-empty lists of token ids");
  }
  if (job.prompt_texts.size() != 0 && job.prompt_texts.size() != job.prompts.size())
    bad_request("prompt", "'prompt' mixes strings and token-id lists");
}

// Fields both endpoints share; max_tokens is read by the caller (chat also takes
// max_completion_tokens).
void read_shared(const Json& body, const ProtocolLimits& lim, CompletionJob& job) {
  read_string(body, "model", job.model);
  read_common_sampling(body, job.sampling);
  read_int(body, "n", job.n, 1, lim.max_n);
  read_bool(body, "stream", job.stream);
  read_bool(body, "skip_special_tokens", job.skip_special_tokens);
  if (has_field(body, "stream_options")) {
    const Json& so = body["stream_options"];
    if (!so.is_object()) bad_request("stream_options", "'stream_options' must be an object");
    if (!job.stream) bad_request("stream_options", "'stream_options' is only allowed when 'stream' is true");
    reject_unknown_fields(so, {"include_usage", "continuous_usage_stats"}, "stream_options");
    read_bool(so, "include_usage", job.include_usage);
    read_bool(so, "continuous_usage_stats", job.continuous_usage_stats);
  }
  if (has_field(body, "logit_bias") && !(body["logit_bias"].is_object() && body["logit_bias"].empty()))
    bad_request("logit_bias", "'logit_bias' is not supported");
}

// max_tokens: at least 1; default: `dflt`, or what is left of the context when dflt is 0.
void read_max_tokens(const Json& body, const char* key, const ProtocolLimits& lim, int dflt, CompletionJob& job) {
  size_t longest = 0;
  for (const auto& p : job.prompts) longest = std::max(longest, p.size());
  const int room = lim.max_sequence_len - int(longest);
  if (room < 1)
    bad_request("prompt", "the prompt has ", longest, " tokens, which leaves no room to generate in this model's ",
                lim.max_sequence_len, "-token context");
  job.sampling.max_new_tokens = dflt > 0 ? std::min(dflt, room) : room;
  read_int(body, key, job.sampling.max_new_tokens, 1, INT32_MAX);
  if (job.sampling.max_new_tokens > room)
    bad_request(key, "the prompt (", longest, " tokens) plus '", key, "' (", job.sampling.max_new_tokens,
                ") is longer than this model's context of ", lim.max_sequence_len, " tokens");
}

void check_choice_count(const CompletionJob& job, const ProtocolLimits& lim) {
  if (job.prompts.size() * size_t(job.n) > size_t(lim.max_choices))
    bad_request("n", job.prompts.size(), " prompts x n=", job.n, " is more than ", lim.max_choices,
                " sequences per request");
}

}  // namespace

CompletionJob parse_completion_request(const Json& body, const TextProcessor* text, const ProtocolLimits& lim) {
  if (!body.is_object()) bad_request("", "the request body must be a JSON object");
  reject_unknown_fields(body,
                        {"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
                         "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix",
                         "temperature", "top_p", "user", "top_k", "min_p", "repetition_penalty", "stop_token_ids",
                         "ignore_eos", "skip_special_tokens"},
                        "request");
  CompletionJob job;
  read_prompts(body, text, job);
  read_shared(body, lim, job);
  read_max_tokens(body, "max_tokens", lim, 16, job);
  int best_of = job.n;
  read_int(body, "best_of", best_of, 1, lim.max_n);
  if (best_of != job.n) bad_request("best_of", "'best_of' other than n is not supported");
  if (has_field(body, "suffix")) bad_request("suffix", "'suffix' is not supported");
  read_int(body, "logprobs", job.logprobs, 0, 20);
  read_bool(body, "echo", job.echo);
  if (job.echo && job.logprobs >= 0) bad_request("echo", "'echo' with 'logprobs' (prompt logprobs) is not supported");
  if (job.echo && job.prompt_texts.empty()) need_text(text, "echo");
  if (!job.sampling.stop.empty()) need_text(text, "stop");
  check_choice_count(job, lim);
  return job;
}

namespace {

// Message content: a string, or a list of text parts (joined), or null for an assistant turn.
OJson message_content(const OJson& m, size_t i) {
  const std::string param = fmt("messages[", i, "].content");
  auto it = m.find("content");
  if (it == m.end() || it->is_null()) return "";
  if (it->is_string()) return *it;
  if (!it->is_array()) bad_request(param, "'", param, "' must be a string or a list of content parts");
  std::string text;
  for (const OJson& part : *it) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
      bad_request(param, "'", param, "': only {\"type\": \"text\", \"text\": ...} parts are supported");
    text += part["text"].get<std::string>();
  }
  return text;
}

OJson read_messages(const OJson& body) {
  auto it = body.find("messages");
  if (it == body.end() || !it->is_array() || it->empty())
    bad_request("messages", "'messages' must be a non-empty list of messages");
  OJson out = OJson::array();
  for (size_t i = 0; i < it->size(); ++i) {
    const OJson& m = (*it)[i];
    if (!m.is_object()) bad_request("messages", "messages[", i, "] must be an object");
    auto role = m.find("role");
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (role == m.end() || !role->is_string() ||
        std::find(std::begin(kRoles), std::end(kRoles), role->get<std::string>()) == std::end(kRoles))
      bad_request("messages", "messages[", i, "].role must be one of system, developer, user, assistant, tool");
    OJson msg = m;
    msg["content"] = message_content(m, i);
    out.push_back(std::move(msg));
  }
  return out;
}

}  // namespace

CompletionJob parse_chat_request(const Json& body, const OJson& ordered, const TextProcessor* text,
                                 const ProtocolLimits& lim) {
  if (!body.is_object()) bad_request("", "the request body must be a JSON object");
  reject_unknown_fields(body,
                        {"model", "messages", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
                         "max_tokens", "max_completion_tokens", "n", "presence_penalty", "response_format", "seed",
                         "stop", "stream", "stream_options", "temperature", "top_p", "tools", "tool_choice",
                         "parallel_tool_calls", "user", "top_k", "min_p", "repetition_penalty", "stop_token_ids",
                         "ignore_eos", "skip_special_tokens", "chat_template_kwargs"},
                        "request");
  CompletionJob job;
  job.chat = true;
  OJson messages = read_messages(ordered);
  const TextProcessor& tp = need_text(text, "messages");
  if (!tp.has_chat_template())
    throw ApiError(400, "this model has no chat template (tokenizer_config.json chat_template); use /v1/completions",
                   "invalid_request_error", "messages");
  if (has_field(body, "response_format") && body["response_format"] != Json{{"type", "text"}})
    bad_request("response_format", "only {\"type\": \"text\"} is supported");
  OJson tools = ordered.contains("tools") ? ordered["tools"] : OJson();
  if (!tools.is_null() && !tools.is_array()) bad_request("tools", "'tools' must be a list");
  OJson kwargs = ordered.contains("chat_template_kwargs") ? ordered["chat_template_kwargs"] : OJson::object();
  if (!kwargs.is_object() && !kwargs.is_null()) bad_request("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  std::string prompt = tp.render_chat(messages, tools, kwargs, true);
  job.prompts.push_back(tp.encode(prompt));
  read_shared(body, lim, job);
  const char* max_key = has_field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  read_max_tokens(body, max_key, lim, 0, job);
  bool logprobs = false;
  read_bool(body, "logprobs", logprobs);
  int top = 0;
  read_int(body, "top_logprobs", top, 0, 20);
  if (has_field(body, "top_logprobs") && !logprobs)
    bad_request("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  if (logprobs) job.logprobs = top;
  check_choice_count(job, lim);
  return job;
}

std::vector<GenerateRequest> expand_choices(const CompletionJob& job) {
  std::vector<GenerateRequest> out;
  for (const auto& prompt : job.prompts)
    for (int c = 0; c < job.n; ++c) {
      GenerateRequest g{prompt, job.sampling};
      if (job.sampling.seed) g.sampling.seed = *job.sampling.seed + uint64_t(c);
      g.sampling.return_logprob = job.logprobs >= 0;
      g.sampling.top_logprobs_num = std::max(job.logprobs, 0);
      out.push_back(std::move(g));
    }
  return out;
}

}  // namespace ms::server
