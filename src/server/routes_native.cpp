// SGLang's native POST /generate: `text` or `input_ids` (one prompt or a list), a
// `sampling_params` object, `stream`, `return_logprob` / `top_logprobs_num`. The response has
// `text` (with a tokenizer), `output_ids` and `meta_info`. A model without a tokenizer serves
// input_ids -> output_ids only (SGLang's --skip-tokenizer-init).
#include <optional>

#include "server/api_error.h"
#include "server/http_util.h"
#include "server/json_fields.h"
#include "server/openai_response.h"
#include "server/routes.h"

namespace ms::server {
namespace {

using Json = nlohmann::json;

struct NativeJob {
  std::vector<std::vector<int32_t>> prompts;
  SamplingParams sampling;
  bool batch = false, stream = false, skip_special_tokens = true;
  int top_logprobs = 0;
};

SamplingParams read_sampling_params(const Json& body) {
  SamplingParams p;
  if (!has_field(body, "sampling_params")) return p;
  const Json& s = body["sampling_params"];
  if (!s.is_object()) bad_request("sampling_params", "'sampling_params' must be an object");
  reject_unknown_fields(s,
                        {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                         "presence_penalty", "repetition_penalty", "stop", "stop_token_ids", "ignore_eos",
                         "skip_special_tokens", "n", "seed"},
                        "sampling_params");
  read_int(s, "max_new_tokens", p.max_new_tokens, 1, INT32_MAX);
  read_common_sampling(s, p);
  int n = 1;
  read_int(s, "n", n, 1, 1);
  return p;
}

NativeJob parse_generate(const Json& body, const TextProcessor* text) {
  if (!body.is_object()) bad_request("", "the request body must be a JSON object");
  reject_unknown_fields(body,
                        {"text", "input_ids", "sampling_params", "stream", "return_logprob", "top_logprobs_num",
                         "logprob_start_len", "return_text_in_logprobs", "rid"},
                        "request");
  NativeJob job;
  if (has_field(body, "text") == has_field(body, "input_ids"))
    bad_request("text", "give exactly one of 'text' and 'input_ids'");
  if (has_field(body, "text")) {
    if (!text)
      bad_request("text", "this model directory has no tokenizer.json, so it takes token ids only: send 'input_ids'");
    const Json& t = body["text"];
    job.batch = t.is_array();
    for (const Json& s : job.batch ? t : Json::array({t})) {
      if (!s.is_string() || s.get_ref<const std::string&>().empty())
        bad_request("text", "'text' must be a non-empty string or a list of them");
      job.prompts.push_back(text->encode(s.get<std::string>()));
    }
  } else {
    const Json& ids = body["input_ids"];
    job.batch = ids.is_array() && !ids.empty() && ids[0].is_array();
    for (const Json& one : job.batch ? ids : Json::array({ids})) job.prompts.push_back(to_token_ids(one, "input_ids"));
  }
  if (job.prompts.empty() || job.prompts.size() > 1024) bad_request("text", "give 1 to 1024 prompts");
  job.sampling = read_sampling_params(body);
  if (has_field(body, "sampling_params")) read_bool(body["sampling_params"], "skip_special_tokens", job.skip_special_tokens);
  read_bool(body, "stream", job.stream);
  if (job.stream && job.batch) bad_request("stream", "streaming takes one prompt");
  read_bool(body, "return_logprob", job.sampling.return_logprob);
  read_int(body, "top_logprobs_num", job.top_logprobs, 0, 20);
  if (job.sampling.return_logprob) job.sampling.top_logprobs_num = job.top_logprobs;
  return job;
}

// One prompt's state: its ids so far and its text (with a tokenizer).
struct NativeChoice {
  std::vector<int32_t> ids;
  std::vector<SampleResult> logprobs;
  std::optional<ChoiceText> text;
  StreamOutput last;
  std::string rid = random_id("");
};

Json logprob_triples(const std::vector<SampleResult>& lps, bool top) {
  Json out = Json::array();
  for (const SampleResult& r : lps) {
    if (!top) {
      out.push_back({r.logprob, r.token, nullptr});
      continue;
    }
    Json step = Json::array();
    for (const TopLogprob& t : r.top) step.push_back({t.logprob, t.token, nullptr});
    out.push_back(std::move(step));
  }
  return out;
}

Json finish_json(const StreamOutput& o) {
  switch (o.finish_reason) {
    case FinishReason::Length: return {{"type", "length"}, {"length", o.completion_tokens}};
    case FinishReason::Stop: return {{"type", "stop"}, {"matched", o.matched_stop}};
    case FinishReason::Abort: return {{"type", "abort"}, {"message", "aborted"}};
    case FinishReason::None: break;
  }
  return nullptr;
}

Json choice_json(const NativeChoice& c, const NativeJob& job, double latency) {
  const StreamOutput& o = c.last;
  Json meta = {{"id", c.rid},          {"finish_reason", finish_json(o)},
               {"prompt_tokens", o.prompt_tokens},    {"completion_tokens", o.completion_tokens},
               {"cached_tokens", o.cached_tokens},    {"e2e_latency", latency}};
  if (job.sampling.return_logprob) {
    meta["output_token_logprobs"] = logprob_triples(c.logprobs, false);
    if (job.top_logprobs > 0) meta["output_top_logprobs"] = logprob_triples(c.logprobs, true);
  }
  Json j = {{"output_ids", c.ids}, {"meta_info", std::move(meta)}};
  if (c.text) j["text"] = c.text->shown();
  return j;
}

void apply(NativeChoice& c, const NativeJob& job, const StreamOutput& o) {
  c.ids.insert(c.ids.end(), o.new_ids.begin(), o.new_ids.end());
  c.logprobs.insert(c.logprobs.end(), o.new_logprobs.begin(), o.new_logprobs.end());
  c.last = o;
  if (!c.text) return;
  if (!o.finished) return (void)c.text->push(o.new_ids);
  const auto& stops = job.sampling.stop;
  const bool string_stop = o.finish_reason == FinishReason::Stop &&
                           std::find(stops.begin(), stops.end(), o.matched_stop) != stops.end() &&
                           !(o.new_ids.size() && std::to_string(o.new_ids.back()) == o.matched_stop);
  c.text->finish(o.new_ids, string_stop ? o.matched_stop : std::string());
}

void run_generate(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  auto job = std::make_shared<NativeJob>(parse_generate(parse_json_body(req), ctx.text));
  auto group = std::make_shared<RequestGroup>(ctx.engine, ctx.metrics, ctx.stopping);
  std::vector<GenerateRequest> requests;
  for (const auto& p : job->prompts) requests.push_back({p, job->sampling});
  group->submit(std::move(requests));
  auto choices = std::make_shared<std::vector<NativeChoice>>(job->prompts.size());
  for (NativeChoice& c : *choices)
    if (ctx.text) c.text.emplace(*ctx.text, job->skip_special_tokens, job->sampling.stop);
  const auto start = std::chrono::steady_clock::now();
  auto latency = [start] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  if (!job->stream) {
    for (const ChoiceEvent& e : group->wait_all()) apply((*choices)[e.index], *job, e.output);
    Json out = Json::array();
    for (size_t i = 0; i < choices->size(); ++i) out.push_back(choice_json((*choices)[i], *job, latency()));
    return send_json(res, job->batch ? out : out[0]);
  }
  auto on_events = [job, choices, latency](const std::vector<ChoiceEvent>& events) {
    std::vector<std::string> out;
    for (const ChoiceEvent& e : events) {
      apply((*choices)[e.index], *job, e.output);
      out.push_back(choice_json((*choices)[e.index], *job, latency()).dump());
    }
    return out;
  };
  stream_sse(res, group, on_events, [] { return std::vector<std::string>(); });
}

}  // namespace

void add_native_routes(httplib::Server& server, ServerContext& ctx) {
  server.Post("/generate", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(ctx, res, [&] { run_generate(ctx, req, res); });
  });
}

}  // namespace ms::server
