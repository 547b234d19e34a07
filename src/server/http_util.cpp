#include "server/http_util.h"

#include <iostream>

#include "server/api_error.h"

namespace ms::server {

using Json = nlohmann::json;

Json parse_json_body(const httplib::Request& req) {
  try {
    return Json::parse(req.body);
  } catch (const Json::exception& e) {
    throw ApiError(400, fmt("the request body is not valid JSON: ", e.what()), "invalid_request_error");
  }
}

void send_json(httplib::Response& res, const Json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& type,
                const std::string& param) {
  send_json(res, error_body(status, message, type, param), status);
}

void guarded(ServerContext& ctx, httplib::Response& res, const std::function<void()>& body) {
  try {
    body();
  } catch (const ApiError& e) {
    ctx.metrics.client_error();
    send_error(res, e.status(), e.what(), e.type(), e.param());
  } catch (const std::exception& e) {
    std::cerr << "request failed: " << e.what() << std::endl;
    send_error(res, 500, fmt("internal error: ", e.what()), "internal_server_error");
  }
}

void stream_sse(httplib::Response& res, std::shared_ptr<RequestGroup> group, EventRenderer on_events,
                EndRenderer on_end) {
  auto provider = [group, on_events = std::move(on_events), on_end = std::move(on_end)](size_t,
                                                                                         httplib::DataSink& sink) {
    auto send = [&](const std::string& payload) {
      const std::string frame = "data: " + payload + "\n\n";
      return sink.write(frame.data(), frame.size());
    };
    std::vector<std::string> payloads = on_events(group->wait(std::chrono::milliseconds(100)));
    const bool done = group->done();
    if (done) {
      for (std::string& p : on_end()) payloads.push_back(std::move(p));
      payloads.push_back("[DONE]");
    }
    for (const std::string& p : payloads)
      if (!send(p)) {  // the client went away: free its requests now, not at max_tokens
        group->abort();
        return false;
      }
    if (done) sink.done();
    return true;
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The releaser runs when the response ends, however it ends.
  res.set_chunked_content_provider("text/event-stream", std::move(provider), [group](bool) { group->abort(); });
}

}  // namespace ms::server
