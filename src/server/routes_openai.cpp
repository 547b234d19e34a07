// POST /v1/completions, POST /v1/chat/completions, GET /v1/models.
#include "server/api_error.h"
#include "server/http_util.h"
#include "server/openai_response.h"
#include "server/routes.h"

namespace ms::server {
namespace {

using Json = nlohmann::json;

void run_completion(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, bool chat) {
  Json body = parse_json_body(req);
  auto job = std::make_shared<CompletionJob>();
  if (chat) {
    *job = parse_chat_request(body, nlohmann::ordered_json::parse(req.body), ctx.text, ctx.limits);
  } else {
    *job = parse_completion_request(body, ctx.text, ctx.limits);
    if (!ctx.text)
      throw ApiError(400, "/v1/completions returns text, and this model directory has no tokenizer.json; send "
                          "token ids to /generate (input_ids) instead", "invalid_request_error", "prompt");
  }
  auto group = std::make_shared<RequestGroup>(ctx.engine, ctx.metrics, ctx.stopping);
  group->submit(expand_choices(*job));
  auto writer = std::make_shared<CompletionWriter>(*job, *ctx.text, job->model.empty() ? ctx.model_name : job->model);
  if (!job->stream) {
    for (const ChoiceEvent& e : group->wait_all()) writer->apply(e);
    return send_json(res, writer->response());
  }
  // The writer refers to the job: both live as long as the stream's callbacks.
  auto on_events = [job, writer](const std::vector<ChoiceEvent>& events) {
    std::vector<std::string> out;
    for (const ChoiceEvent& e : events)
      for (const Json& c : writer->apply(e)) out.push_back(c.dump(-1, ' ', false, Json::error_handler_t::replace));
    return out;
  };
  auto on_end = [job, writer]() {
    std::vector<std::string> out;
    if (job->include_usage) out.push_back(writer->usage_chunk().dump());
    return out;
  };
  stream_sse(res, group, on_events, on_end);
}

}  // namespace

void add_openai_routes(httplib::Server& server, ServerContext& ctx) {
  server.Post("/v1/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(ctx, res, [&] { run_completion(ctx, req, res, false); });
  });
  server.Post("/v1/chat/completions", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(ctx, res, [&] { run_completion(ctx, req, res, true); });
  });
  server.Get("/v1/models", [&ctx](const httplib::Request&, httplib::Response& res) {
    const auto created = std::chrono::duration_cast<std::chrono::seconds>(ctx.started.time_since_epoch()).count();
    Json model = {{"id", ctx.model_name},      {"object", "model"},
                  {"created", created},        {"owned_by", "moeserve"},
                  {"root", ctx.model_name},    {"max_model_len", ctx.limits.max_sequence_len}};
    send_json(res, {{"object", "list"}, {"data", Json::array({model})}});
  });
}

}  // namespace ms::server
