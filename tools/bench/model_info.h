// What the benchmark tools need to know about the served model without loading it: its
// tokenizer (when the checkpoint has one) and its vocabulary size.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "http_client.h"
#include "io/tokenizer.h"

namespace ms::bench {

struct ModelVocab {
  std::string dir;                       // the checkpoint directory it came from
  std::unique_ptr<Tokenizer> tokenizer;  // null without a tokenizer.json
  int32_t vocab_size = 0;                // the tokenizer's, else config.json's
};

// Reads DIR/tokenizer.json and DIR/config.json; throws when DIR has neither.
ModelVocab load_model_vocab(const std::string& dir);

// The checkpoint directory the server reports (GET /get_model_info: tokenizer_path, else
// model_path) when it exists on this machine; empty otherwise.
std::string server_model_dir(const HttpTarget& target);

// The model name for OpenAI requests: the first of GET /v1/models, else "default".
std::string server_model_name(const HttpTarget& target);

}  // namespace ms::bench
