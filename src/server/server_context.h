// What every route shares: the engine, the model's facts, the text side, the metrics, and the
// shutdown flag. Built by `moeserve serve`, outliving the HTTP server that borrows it.
#pragma once
#include <atomic>
#include <chrono>
#include <string>

#include "io/model_config.h"
#include "runtime/engine.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/text_processor.h"

namespace ms::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 30000;      // 0: any free port (tests)
  std::string api_key;   // empty: no authentication
  std::string served_model_name;
  int http_threads = 512;  // each open stream holds one
  size_t max_body_bytes = size_t(32) << 20;
};

struct ServerContext {
  EngineApi& engine;  // one rank's Engine, or a ParallelEngine over several
  const ModelConfig& config;
  const TextProcessor* text;  // null: the model directory has no tokenizer (token ids only)
  std::string model_path, model_name;
  EngineOptions engine_options;
  ProtocolLimits limits;
  Metrics metrics;
  std::atomic<bool> stopping{false};
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();
};

}  // namespace ms::server
