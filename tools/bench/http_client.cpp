#include "http_client.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/check.h"

namespace ms::bench {
namespace {

std::chrono::microseconds micros(double seconds) {
  return std::chrono::microseconds(int64_t(seconds * 1e6));
}

std::unique_ptr<httplib::Client> make_client(const HttpTarget& t) {
  auto client = std::make_unique<httplib::Client>(t.origin);
  client->set_connection_timeout(micros(std::min(t.timeout_s, 30.0)));
  client->set_read_timeout(micros(t.timeout_s));
  client->set_write_timeout(micros(std::min(t.timeout_s, 300.0)));
  client->set_keep_alive(false);
  if (!t.api_key.empty()) client->set_bearer_token_auth(t.api_key);
  return client;
}

std::string transport_error(const std::string& what, const HttpTarget& t, httplib::Error e) {
  return fmt(what, " to ", t.origin, ": ", httplib::to_string(e), " error");
}

HttpReply from_result(const httplib::Result& r, const HttpTarget& t, const std::string& what) {
  HttpReply reply;
  if (!r) {
    reply.error = transport_error(what, t, r.error());
    return reply;
  }
  reply.status = r->status;
  reply.body = r->body;
  if (r->status != 200) reply.error = fmt(what, ": HTTP ", r->status, ": ", r->body.substr(0, 500));
  return reply;
}

}  // namespace

HttpTarget parse_base_url(const std::string& url) {
  HttpTarget t;
  const size_t scheme_end = url.find("://");
  MS_CHECK(scheme_end != std::string::npos && (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0),
           "--base-url ", url, ": expected http://host:port");
  const size_t path = url.find('/', scheme_end + 3);
  t.origin = url.substr(0, path);
  if (path != std::string::npos) t.path_prefix = url.substr(path);
  while (!t.path_prefix.empty() && t.path_prefix.back() == '/') t.path_prefix.pop_back();
  MS_CHECK(t.origin.size() > scheme_end + 3, "--base-url ", url, ": no host");
  return t;
}

HttpReply http_get(const HttpTarget& target, const std::string& path) {
  return from_result(make_client(target)->Get(target.path_prefix + path), target, "GET " + path);
}

HttpReply http_post_json(const HttpTarget& target, const std::string& path, const std::string& body) {
  return from_result(make_client(target)->Post(target.path_prefix + path, body, "application/json"), target, "POST " + path);
}

HttpReply http_post_sse(const HttpTarget& target, const std::string& path, const std::string& body,
                        const SseHandler& on_data) {
  auto client = make_client(target);
  HttpReply reply;
  SseParser parser(on_data);
  httplib::Request req;
  req.method = "POST";
  req.path = target.path_prefix + path;
  req.body = body;
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", "text/event-stream");
  req.response_handler = [&](const httplib::Response& res) {
    reply.status = res.status;
    return true;
  };
  // A refused request's body is its error message, not an event stream.
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (reply.status != 200) {
      reply.body.append(data, n);
      return true;
    }
    return parser.feed(std::string_view(data, n));
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = client->send(req, res, err);
  if (reply.status == 200) parser.finish();
  if (!sent && err != httplib::Error::Canceled) reply.error = transport_error("POST " + path, target, err);
  else if (reply.status != 200) reply.error = fmt("POST ", path, ": HTTP ", reply.status, ": ", reply.body.substr(0, 500));
  return reply;
}

bool SseParser::feed(std::string_view bytes) {
  pending_.append(bytes);
  size_t start = 0;
  bool go_on = true;
  for (size_t nl; go_on && (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1)
    go_on = line(std::string_view(pending_).substr(start, nl - start));
  pending_.erase(0, start);
  return go_on;
}

bool SseParser::finish() {
  std::string rest;
  rest.swap(pending_);
  return rest.empty() || line(rest);
}

bool SseParser::line(std::string_view text) {
  if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
  if (text.rfind("data:", 0) != 0) return true;  // blank separators, comments, other fields
  text.remove_prefix(5);
  if (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  return on_data_(text);
}

}  // namespace ms::bench
