// Helpers every route uses: JSON bodies in and out, OpenAI-style errors, and Server-Sent Events
// fed by a RequestGroup (a client that goes away aborts the group's requests).
#pragma once
#include <functional>
#include <httplib.h>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/request_group.h"
#include "server/server_context.h"

namespace ms::server {

// The body as JSON; 400 when it is not.
nlohmann::json parse_json_body(const httplib::Request& req);
void send_json(httplib::Response& res, const nlohmann::json& body, int status = 200);
void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& param = {});

// Runs a route body, turning an ApiError into its status and JSON error, and any other
// exception into a 500 that names it. The server keeps serving either way.
void guarded(ServerContext& ctx, httplib::Response& res, const std::function<void()>& body);

// Streams `group` as SSE: each batch of outputs becomes the `data:` payloads `on_events`
// returns; when every request finished, `on_end`'s payloads follow, then `data: [DONE]`.
// The callbacks run on this connection's thread and may keep state in their captures.
using EventRenderer = std::function<std::vector<std::string>(const std::vector<ChoiceEvent>&)>;
using EndRenderer = std::function<std::vector<std::string>()>;
void stream_sse(httplib::Response& res, std::shared_ptr<RequestGroup> group, EventRenderer on_events,
                EndRenderer on_end);

}  // namespace ms::server
