// A small blocking HTTP client for the benchmark tools: JSON requests and server-sent-event
// streams ("data: ..." lines) against a base URL such as http://127.0.0.1:30000. One
// connection per call, so calls from many threads never share a socket.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ms::bench {

struct HttpTarget {
  std::string origin;       // "http://host:port"
  std::string path_prefix;  // "" or "/api" when the base URL has a path
  std::string api_key;      // sent as "Authorization: Bearer <key>" when set
  double timeout_s = 6 * 3600;
};

// "http://host:port[/prefix]" -> target; throws naming the URL when it is not http(s).
HttpTarget parse_base_url(const std::string& url);

struct HttpReply {
  int status = 0;     // 0: no response (the connection failed; see error)
  std::string body;   // the body of a non-streamed reply, or of a refused stream
  std::string error;  // transport error, or "HTTP <status>: <body>"
  bool ok() const { return status == 200 && error.empty(); }
};

HttpReply http_get(const HttpTarget& target, const std::string& path);
HttpReply http_post_json(const HttpTarget& target, const std::string& path, const std::string& body);

// POSTs `body` and hands every SSE "data:" payload to `on_data` as it arrives (without the
// "data:" prefix; "[DONE]" included). `on_data` returning false closes the stream.
using SseHandler = std::function<bool(std::string_view data)>;
HttpReply http_post_sse(const HttpTarget& target, const std::string& path, const std::string& body,
                        const SseHandler& on_data);

// Splits a byte stream into SSE data payloads; bytes may arrive cut anywhere.
class SseParser {
 public:
  explicit SseParser(SseHandler on_data) : on_data_(std::move(on_data)) {}
  bool feed(std::string_view bytes);  // false once the handler asked to stop
  bool finish();                      // a last line without its newline

 private:
  bool line(std::string_view text);
  SseHandler on_data_;
  std::string pending_;
};

}  // namespace ms::bench
