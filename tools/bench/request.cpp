#include "request.h"

#include <nlohmann/json.hpp>

#include "core/check.h"

namespace ms::bench {

using nlohmann::json;

Api api_for_backend(const std::string& backend) {
  if (backend == "moeserve" || backend == "sglang") return Api::Native;
  if (backend == "vllm" || backend == "openai") return Api::Completions;
  fail("--backend ", backend, ": expected moeserve, sglang, vllm or openai");
}

const char* api_path(Api api) { return api == Api::Native ? "/generate" : "/v1/completions"; }

std::string request_body(const RequestSpec& spec, const BenchPrompt& prompt, bool stream) {
  json body;
  if (spec.api == Api::Native) {
    if (prompt.is_text()) body["text"] = prompt.text;
    else body["input_ids"] = prompt.ids;
    json sampling = {{"temperature", spec.temperature}, {"max_new_tokens", prompt.output_len},
                     {"ignore_eos", spec.ignore_eos}};
    if (!spec.stop.empty()) sampling["stop"] = spec.stop;
    body["sampling_params"] = std::move(sampling);
    body["stream"] = stream;
    return body.dump();
  }
  body["model"] = spec.model;
  if (prompt.is_text()) body["prompt"] = prompt.text;
  else body["prompt"] = prompt.ids;  // OpenAI's completions take a prompt of token ids as well
  body["temperature"] = spec.temperature;
  body["max_tokens"] = prompt.output_len;
  if (spec.ignore_eos) body["ignore_eos"] = true;  // an extension: OpenAI's own API refuses it
  if (!spec.stop.empty()) body["stop"] = spec.stop;
  body["stream"] = stream;
  if (stream) body["stream_options"] = {{"include_usage", true}};
  return body.dump();
}

void StreamAccumulator::tokens(int total, double t) {
  const int added = total - count_;
  if (added <= 0) return;
  if (!first_) {
    first_ = true;
    ttft_ = t;
  } else {
    itl_.insert(itl_.end(), size_t(added), (t - last_t_) / added);
  }
  last_t_ = t;
  count_ = total;
}

// SGLang's native stream: every event carries the text so far, the ids (so far, or the new
// ones), and meta_info.completion_tokens, the count so far.
void StreamAccumulator::native_event(const json& event, double t) {
  int total = count_;
  const auto meta = event.find("meta_info");
  const bool counted = meta != event.end() && meta->contains("completion_tokens");
  if (counted) total = (*meta)["completion_tokens"].get<int>();
  if (auto ids = event.find("output_ids"); ids != event.end() && ids->is_array()) {
    auto v = ids->get<std::vector<int32_t>>();
    const bool cumulative = counted ? int(v.size()) == total : true;
    if (cumulative) ids_ = std::move(v);
    else ids_.insert(ids_.end(), v.begin(), v.end());
    if (!counted) total = int(ids_.size());
  }
  if (auto text = event.find("text"); text != event.end() && text->is_string()) {
    std::string now = text->get<std::string>();
    if (!counted && now.size() > text_.size()) total = std::max(total, count_ + 1);
    text_ = std::move(now);
  }
  tokens(total, t);
}

// OpenAI's stream: one text delta per event; a last event may carry only the usage.
void StreamAccumulator::completions_event(const json& event, double t) {
  if (auto usage = event.find("usage"); usage != event.end() && usage->is_object() &&
                                        usage->contains("completion_tokens")) {
    usage_seen_ = true;
    usage_tokens_ = (*usage)["completion_tokens"].get<int>();
  }
  const auto choices = event.find("choices");
  if (choices == event.end() || !choices->is_array() || choices->empty()) return;
  const auto& choice = (*choices)[0];
  const auto text = choice.find("text");
  if (text == choice.end() || !text->is_string() || text->get_ref<const std::string&>().empty()) return;
  text_ += text->get_ref<const std::string&>();
  tokens(count_ + 1, t);
}

bool StreamAccumulator::feed(std::string_view data, double t) {
  if (data == "[DONE]") return true;
  try {
    json event = json::parse(data);
    if (auto err = event.find("error"); err != event.end() && !err->is_null()) {
      error_ = err->is_object() && err->contains("message") ? (*err)["message"].get<std::string>() : err->dump();
      return false;
    }
    if (api_ == Api::Native) native_event(event, t);
    else completions_event(event, t);
  } catch (const std::exception& e) {
    error_ = fmt("bad stream event: ", e.what(), ": ", std::string(data.substr(0, 200)));
    return false;
  }
  return true;
}

void StreamAccumulator::finish(RequestOutcome& out, double t) const {
  out.success = error_.empty();
  out.error = error_;
  out.ttft_s = ttft_;
  out.latency_s = t;
  out.itl_s = itl_;
  out.output_len = usage_seen_ ? usage_tokens_ : count_;
  out.generated_text = text_;
  out.output_ids = ids_;
}

RequestOutcome send_streaming(const HttpTarget& target, const RequestSpec& spec, const BenchPrompt& prompt) {
  RequestOutcome out;
  out.prompt_len = prompt.prompt_len;
  StreamAccumulator acc(spec.api);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto since = [t0] { return std::chrono::duration<double>(clock::now() - t0).count(); };
  HttpReply reply;
  try {
    const std::string body = request_body(spec, prompt, true);
    reply = http_post_sse(target, api_path(spec.api), body,
                          [&](std::string_view data) { return acc.feed(data, since()); });
  } catch (const std::exception& e) {
    reply.error = e.what();
  }
  acc.finish(out, since());
  if (!reply.error.empty() && out.error.empty()) out.error = reply.error;
  out.success = out.error.empty();
  return out;
}

}  // namespace ms::bench
