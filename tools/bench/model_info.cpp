#include "model_info.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace ms::bench {

ModelVocab load_model_vocab(const std::string& dir) {
  namespace fs = std::filesystem;
  ModelVocab v;
  v.dir = dir;
  if (fs::exists(fs::path(dir) / "tokenizer.json")) {
    v.tokenizer = std::make_unique<Tokenizer>(Tokenizer::load(dir));
    v.vocab_size = v.tokenizer->vocab_size();
  }
  const fs::path config = fs::path(dir) / "config.json";
  if (v.vocab_size == 0 && fs::exists(config)) {
    std::ifstream in(config);
    try {
      v.vocab_size = nlohmann::json::parse(in).at("vocab_size").get<int32_t>();
    } catch (const std::exception& e) {
      fail(config.string(), ": no vocab_size: ", e.what());
    }
  }
  MS_CHECK(v.vocab_size > 0, "--tokenizer ", dir, ": neither tokenizer.json nor config.json with a vocab_size");
  return v;
}

std::string server_model_dir(const HttpTarget& target) {
  HttpReply r = http_get(target, "/get_model_info");
  if (!r.ok()) return "";
  try {
    auto info = nlohmann::json::parse(r.body);
    for (const char* key : {"tokenizer_path", "model_path"}) {
      if (!info.contains(key) || !info[key].is_string()) continue;
      const std::string dir = info[key].get<std::string>();
      if (std::filesystem::is_directory(dir)) return dir;
    }
  } catch (const std::exception&) {
    // Not our server's reply: the caller asks for --tokenizer instead.
  }
  return "";
}

std::string server_model_name(const HttpTarget& target) {
  HttpReply r = http_get(target, "/v1/models");
  if (!r.ok()) return "default";
  try {
    auto models = nlohmann::json::parse(r.body);
    if (models.contains("data") && !models["data"].empty()) return models["data"][0].at("id").get<std::string>();
  } catch (const std::exception&) {
    // An unexpected listing: servers that serve one model accept any name.
  }
  return "default";
}

}  // namespace ms::bench
