// The server's routes, one file per family; each adds its handlers to the httplib server.
#pragma once
#include <httplib.h>

#include "server/server_context.h"

namespace ms::server {

void add_openai_routes(httplib::Server& server, ServerContext& ctx);  // /v1/completions, /v1/chat/completions, /v1/models
void add_native_routes(httplib::Server& server, ServerContext& ctx);  // /generate
void add_info_routes(httplib::Server& server, ServerContext& ctx);    // health, model/server info, flush_cache, metrics

}  // namespace ms::server
