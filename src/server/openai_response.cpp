#include "server/openai_response.h"

#include <algorithm>
#include <chrono>
#include <random>

namespace ms::server {

using Json = nlohmann::json;

struct CompletionWriter::Choice {
  ChoiceText text;
  std::vector<SampleResult> logprobs;  // all so far (non-stream bodies list them all)
  size_t text_offset = 0;              // bytes of text before the next token (completions logprobs)
  bool started = false;                // a chat stream's first chunk carries the role
  StreamOutput last;                   // the latest output: counts, finish reason
  std::string finish_text;             // text of the final output (non-stream)
  Choice(const TextProcessor& t, bool skip, std::vector<std::string> stop) : text(t, skip, std::move(stop)) {}
};

std::string random_id(const std::string& prefix) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", (unsigned long long)rng(), (unsigned long long)rng());
  return prefix + buf;
}

CompletionWriter::CompletionWriter(const CompletionJob& job, const TextProcessor& text, std::string model_name)
    : job_(job),
      text_(text),
      model_(std::move(model_name)),
      id_(random_id(job.chat ? "chatcmpl-" : "cmpl-")),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()) {
  for (size_t i = 0; i < job.prompts.size() * size_t(job.n); ++i) {
    choices_.push_back(std::make_unique<Choice>(text, job.skip_special_tokens, job.sampling.stop));
    if (job.echo) choices_.back()->finish_text = job.prompt_texts.empty()
                                                     ? text.decode(job.prompts[i / size_t(job.n)], false)
                                                     : job.prompt_texts[i / size_t(job.n)];
  }
}

CompletionWriter::~CompletionWriter() = default;

// The stop string that ended a choice, to cut from its text; empty for a stop token.
std::string CompletionWriter::stop_string_of(const StreamOutput& o, size_t index) const {
  if (o.finish_reason != FinishReason::Stop || o.matched_stop.empty()) return {};
  const auto& stops = job_.sampling.stop;
  if (std::find(stops.begin(), stops.end(), o.matched_stop) == stops.end()) return {};
  (void)index;
  const bool token_stop = !o.new_ids.empty() && std::to_string(o.new_ids.back()) == o.matched_stop;
  return token_stop ? std::string() : o.matched_stop;
}

Json CompletionWriter::logprobs_json(const Choice& c, const std::vector<SampleResult>& lps, size_t offset) const {
  if (job_.chat) {
    Json content = Json::array();
    auto entry = [&](int32_t token, float lp) {
      std::string s = text_.token_text(token);
      return Json{{"token", s}, {"logprob", lp}, {"bytes", std::vector<uint8_t>(s.begin(), s.end())}};
    };
    for (const SampleResult& r : lps) {
      Json e = entry(r.token, r.logprob);
      e["top_logprobs"] = Json::array();
      for (const TopLogprob& t : r.top) e["top_logprobs"].push_back(entry(t.token, t.logprob));
      content.push_back(std::move(e));
    }
    return {{"content", std::move(content)}};
  }
  Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(), offsets = Json::array();
  for (const SampleResult& r : lps) {
    std::string s = text_.token_text(r.token);
    tokens.push_back(s), token_lps.push_back(r.logprob), offsets.push_back(offset);
    offset += s.size();
    Json top = Json::object();
    for (const TopLogprob& t : r.top) top[text_.token_text(t.token)] = t.logprob;
    tops.push_back(job_.logprobs > 0 ? std::move(top) : Json());
  }
  return {{"tokens", tokens}, {"token_logprobs", token_lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

Json CompletionWriter::chunk(Json choice) const {
  Json j = {{"id", id_},
            {"object", job_.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created_},
            {"model", model_},
            {"choices", Json::array({std::move(choice)})}};
  if (job_.include_usage) j["usage"] = job_.continuous_usage_stats ? usage() : Json();
  return j;
}

std::vector<Json> CompletionWriter::apply(const ChoiceEvent& e) {
  Choice& c = *choices_[e.index];
  const StreamOutput& o = e.output;
  std::string text = o.finished ? c.text.finish(o.new_ids, stop_string_of(o, e.index)) : c.text.push(o.new_ids);
  c.last = o;
  c.logprobs.insert(c.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
  const size_t offset = c.text_offset;
  for (const SampleResult& r : o.new_logprobs) c.text_offset += text_.token_text(r.token).size();
  std::vector<Json> out;
  Json lp = job_.logprobs >= 0 && !o.new_logprobs.empty() ? logprobs_json(c, o.new_logprobs, offset) : Json();
  Json finish = o.finished ? Json(finish_reason_name(o.finish_reason)) : Json();
  if (job_.chat) {
    if (!c.started) {
      out.push_back(chunk({{"index", e.index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"logprobs", nullptr}, {"finish_reason", nullptr}}));
      c.started = true;
    }
    if (!text.empty() || !lp.is_null())
      out.push_back(chunk({{"index", e.index}, {"delta", {{"content", text}}}, {"logprobs", lp}, {"finish_reason", nullptr}}));
    if (o.finished)
      out.push_back(chunk({{"index", e.index}, {"delta", Json::object()}, {"logprobs", nullptr}, {"finish_reason", finish}}));
    return out;
  }
  if (job_.echo && !c.started) text = c.finish_text + text;
  c.started = true;
  if (!text.empty() || !lp.is_null() || o.finished)
    out.push_back(chunk({{"index", e.index}, {"text", text}, {"logprobs", lp}, {"finish_reason", finish}}));
  return out;
}

Json CompletionWriter::usage() const {
  // SGLang's accounting: each prompt once, every choice's completion and cached tokens.
  int64_t prompt = 0, completion = 0, cached = 0;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const StreamOutput& o = choices_[i]->last;
    if (i % size_t(job_.n) == 0) prompt += o.prompt_tokens;
    completion += o.completion_tokens, cached += o.cached_tokens;
  }
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

Json CompletionWriter::usage_chunk() const {
  return {{"id", id_}, {"object", job_.chat ? "chat.completion.chunk" : "text_completion"}, {"created", created_},
          {"model", model_}, {"choices", Json::array()}, {"usage", usage()}};
}

Json CompletionWriter::response() const {
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = *choices_[i];
    Json lp = job_.logprobs >= 0 ? logprobs_json(c, c.logprobs, 0) : Json();
    Json choice = {{"index", i}, {"logprobs", lp}, {"finish_reason", finish_reason_name(c.last.finish_reason)}};
    const std::string text = (job_.echo ? c.finish_text : std::string()) + c.text.shown();
    if (job_.chat) choice["message"] = {{"role", "assistant"}, {"content", text}, {"tool_calls", nullptr}};
    else choice["text"] = text;
    if (!c.last.matched_stop.empty()) choice["matched_stop"] = c.last.matched_stop;
    choices.push_back(std::move(choice));
  }
  return {{"id", id_}, {"object", job_.chat ? "chat.completion" : "text_completion"}, {"created", created_},
          {"model", model_}, {"choices", std::move(choices)}, {"usage", usage()}};
}

}  // namespace ms::server
