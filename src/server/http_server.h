// The HTTP front end: routes (OpenAI, native, info), bearer-token authentication, a body size
// limit, JSON error bodies for every 4xx/5xx, one pooled thread per open connection.
#pragma once
#include <memory>

#include "server/server_context.h"

namespace httplib {
class Server;
}

namespace ms::server {

class HttpServer {
 public:
  HttpServer(ServerContext& ctx, const ServerOptions& options);
  ~HttpServer();
  // Binds options.host:port (port 0: a free one) and returns the port; throws naming the address.
  int bind();
  void run();   // serves until stop()
  // Graceful: marks the server stopping (waiting requests are aborted, streams end), stops
  // accepting, and lets run() return once the open connections are done.
  void stop();

 private:
  void install_handlers();
  ServerContext& ctx_;
  ServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  int listen_socket_ = -1;  // the bound socket, seen through httplib's socket-options hook
};

}  // namespace ms::server
