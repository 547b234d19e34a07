#include "server/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include "server/http_util.h"
#include "server/routes.h"

namespace ms::server {

HttpServer::HttpServer(ServerContext& ctx, const ServerOptions& options)
    : ctx_(ctx), options_(options), server_(std::make_unique<httplib::Server>()) {
  const size_t threads = size_t(std::max(options.http_threads, 4));
  server_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  server_->set_payload_max_length(options.max_body_bytes);
  server_->set_keep_alive_max_count(1000);
  server_->set_read_timeout(30);
  server_->set_write_timeout(30);
  server_->set_tcp_nodelay(true);
  // httplib's default options set SO_REUSEPORT, which lets a second server bind the same port and
  // silently take half the connections; SO_REUSEADDR only allows a restart over TIME_WAIT.
  server_->set_socket_options([this](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_socket_ = int(sock);
  });
  install_handlers();
  add_openai_routes(*server_, ctx_);
  add_native_routes(*server_, ctx_);
  add_info_routes(*server_, ctx_);
}

HttpServer::~HttpServer() = default;

void HttpServer::install_handlers() {
  // SGLang leaves /health and /metrics open so that probes and scrapers need no key.
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (options_.api_key.empty() || req.path.rfind("/health", 0) == 0 || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    if (req.get_header_value("Authorization") == "Bearer " + options_.api_key)
      return httplib::Server::HandlerResponse::Unhandled;
    ctx_.metrics.client_error();
    send_error(res, 401, "missing or wrong API key (Authorization: Bearer <key>)", "authentication_error");
    return httplib::Server::HandlerResponse::Handled;
  });
  // httplib's own refusals (404, 405, 413 for an oversized body, 400 for a bad request line)
  // arrive with an empty body: give them the OpenAI error shape too.
  server_->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message = res.status == 404   ? "no route for " + req.method + " " + req.path
                          : res.status == 413 ? std::string("the request body is too large")
                                              : "HTTP status " + std::to_string(res.status);
    send_error(res, res.status, message, res.status >= 500 ? "internal_server_error" : "invalid_request_error");
  });
  server_->set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, "internal error: " + what, "internal_server_error");
  });
}

int HttpServer::bind() {
  int port = options_.port;
  if (port == 0) port = server_->bind_to_any_port(options_.host);
  else if (!server_->bind_to_port(options_.host, port)) port = -1;
  MS_CHECK(port > 0, "cannot listen on ", options_.host, ":", options_.port, " (in use, or not an address of this host)");
  // Debian's httplib listens with a backlog of 5: a burst of clients overflows it and each
  // dropped SYN waits a second for its retransmit. Listening again only raises the backlog.
  MS_CHECK(::listen(listen_socket_, SOMAXCONN) == 0, "cannot raise the listen backlog on port ", port);
  return port;
}

void HttpServer::run() { server_->listen_after_bind(); }

void HttpServer::stop() {
  ctx_.stopping = true;
  server_->stop();
}

}  // namespace ms::server
