// GET /health, /get_model_info, /get_server_info, /metrics; POST|GET /flush_cache.
#include "server/api_error.h"
#include "server/http_util.h"
#include "server/routes.h"

namespace ms::server {
namespace {

using Json = nlohmann::json;

// The engine's load: requests and KV slots. `kv_used_tokens` counts the slots requests hold,
// not the radix cache's (which is reusable), so it is zero whenever no request is in flight.
Json load_json(ServerContext& ctx) {
  EngineStats s = ctx.engine.stats();
  return {{"num_running_reqs", s.running},
          {"num_waiting_reqs", s.waiting},
          {"max_total_num_tokens", s.pool_capacity},
          {"kv_used_tokens", s.pool_used - s.cached_slots},
          {"kv_cached_tokens", s.cached_slots},
          {"kv_pool_used_slots", s.pool_used},
          {"generated_tokens", s.generated_tokens},
          {"gen_throughput", ctx.metrics.generation_throughput()}};
}

Json server_info(ServerContext& ctx, const httplib::Request& req) {
  const EngineOptions& o = ctx.engine_options;
  const SchedulerOptions& s = o.scheduler;
  return {{"model_path", ctx.model_path},
          {"served_model_name", ctx.model_name},
          {"tokenizer_path", ctx.text ? Json(ctx.model_path) : Json()},
          {"skip_tokenizer_init", ctx.text == nullptr},
          {"context_length", ctx.config.max_position_embeddings},
          {"max_running_requests", s.max_running_requests},
          {"max_prefill_tokens", s.max_prefill_tokens},
          {"chunked_prefill_size", s.chunked_prefill_size},
          {"schedule_policy", s.policy == SchedulePolicy::Lpm ? "lpm" : "fcfs"},
          {"schedule_conservativeness", s.conservativeness},
          {"disable_radix_cache", !s.enable_radix_cache},
          {"random_seed", o.random_seed},
          {"version", "moeserve"},
          {"internal_states", Json::array({load_json(ctx)})}};
}

void flush_cache(ServerContext& ctx, httplib::Response& res) {
  try {
    ctx.engine.flush_cache();
  } catch (const Error& e) {
    throw ApiError(400, fmt("cache not flushed: ", e.what()), "invalid_request_error");
  }
  res.set_content("Cache flushed.\n", "text/plain");
}

}  // namespace

void add_info_routes(httplib::Server& server, ServerContext& ctx) {
  auto health = [&ctx](const httplib::Request&, httplib::Response& res) {
    if (ctx.stopping) return send_error(res, 503, "the server is shutting down", "service_unavailable");
    res.set_content("", "text/plain");
  };
  server.Get("/health", health);
  server.Get("/health_generate", health);
  server.Get("/get_model_info", [&ctx](const httplib::Request&, httplib::Response& res) {
    send_json(res, {{"model_path", ctx.model_path},
                    {"tokenizer_path", ctx.text ? Json(ctx.model_path) : Json()},
                    {"is_generation", true},
                    {"architecture", ctx.config.architecture},
                    {"model_type", ctx.config.model_type},
                    {"vocab_size", ctx.config.vocab_size},
                    {"context_length", ctx.config.max_position_embeddings}});
  });
  server.Get("/get_server_info", [&ctx](const httplib::Request& req, httplib::Response& res) {
    guarded(ctx, res, [&] { send_json(res, server_info(ctx, req)); });
  });
  auto flush = [&ctx](const httplib::Request&, httplib::Response& res) { guarded(ctx, res, [&] { flush_cache(ctx, res); }); };
  server.Post("/flush_cache", flush);
  server.Get("/flush_cache", flush);
  server.Get("/metrics", [&ctx](const httplib::Request&, httplib::Response& res) {
    guarded(ctx, res, [&] {
      res.set_content(ctx.metrics.render(ctx.engine.stats(), ctx.model_name), "text/plain; version=0.0.4");
    });
  });
}

}  // namespace ms::server
