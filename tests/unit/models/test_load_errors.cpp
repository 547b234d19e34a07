// Malformed checkpoints and inputs through the CLI: each exits non-zero with one line that
// names the file, tensor, field or flag at fault — never a crash.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "test_support.h"

namespace ms {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

// A private copy of a fixture that a test may break.
std::string copy_fixture(const std::string& name) {
  std::string dir = test::temp_dir() + "/" + name;
  fs::copy(test::fixture_dir(name), dir, fs::copy_options::recursive);
  return dir;
}

// Rewrites the header of a safetensors file (the data stays as it is).
void edit_header(const std::string& path, const std::function<void(json&)>& edit) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  uint64_t len = 0;
  std::memcpy(&len, bytes.data(), 8);
  json h = json::parse(bytes.substr(8, len));
  edit(h);
  std::string nh = h.dump();
  uint64_t nlen = nh.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&nlen), 8);
  out << nh << bytes.substr(8 + len);
}

// Overwrites the first element of the F32 tensor `name` in a safetensors file with `value`.
void poke_f32(const std::string& path, const std::string& name, float value) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  uint64_t len = 0;
  f.read(reinterpret_cast<char*>(&len), 8);
  std::string header(len, '\0');
  f.read(header.data(), std::streamsize(len));
  const uint64_t begin = json::parse(header)[name]["data_offsets"][0].get<uint64_t>();
  f.seekp(std::streamoff(8 + len + begin));
  f.write(reinterpret_cast<const char*>(&value), 4);
}

// Runs moeserve with `args`; expects a failure whose single output line has every needle.
void expect_cli_error(const std::string& args, std::initializer_list<std::string> needles) {
  std::string out;
  int rc = test::run_command(test::moeserve_bin() + " " + args, out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_LT(rc, 128) << "killed by a signal: " << out;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << out;
  for (auto& n : needles) EXPECT_NE(out.find(n), std::string::npos) << out << " lacks " << n;
}

std::string logits_args(const std::string& dir, const std::string& ids = "5,17,3") {
  return "logits --model-path " + dir + " --ids " + ids + " --out " + test::temp_dir() + "/l.safetensors";
}

TEST(LoadErrors, MissingShard) {
  std::string dir = copy_fixture("qwen3-moe-tiny");
  fs::remove(dir + "/model-00002-of-00002.safetensors");
  expect_cli_error(logits_args(dir), {"model-00002-of-00002.safetensors", "missing"});
}

TEST(LoadErrors, TruncatedShard) {
  std::string dir = copy_fixture("qwen3-moe-tiny");
  fs::resize_file(dir + "/model-00001-of-00002.safetensors", 100000);
  expect_cli_error(logits_args(dir), {"model-00001-of-00002.safetensors"});
}

TEST(LoadErrors, TensorOfTheWrongShape) {
  std::string dir = copy_fixture("deepseek-v3-tiny");
  // Same bytes, transposed shape: only the model's shape check can catch it.
  edit_header(dir + "/model-00001-of-00002.safetensors",
              [](json& h) { h["model.layers.0.self_attn.kv_b_proj.weight"]["shape"] = {64, 256}; });
  expect_cli_error(logits_args(dir), {"model.layers.0.self_attn.kv_b_proj.weight", "shape [64, 256]", "[256, 64]"});
}

TEST(LoadErrors, TensorOfTheWrongDtype) {
  std::string dir = copy_fixture("deepseek-v3-fp8-tiny");
  edit_header(dir + "/model-00001-of-00002.safetensors",
              [](json& h) { h["model.layers.0.self_attn.o_proj.weight_scale_inv"]["dtype"] = "I32"; });
  expect_cli_error(logits_args(dir), {"o_proj.weight_scale_inv", "dtype I32"});
}

// The CUDA FP8 products multiply sums by the block scale times 2^120: a scale from 256 up (or
// not finite) is refused at load, on every backend, naming the tensor.
TEST(LoadErrors, Fp8ScaleTheProductsCannotTake) {
  std::string dir = copy_fixture("deepseek-v3-fp8-tiny");
  poke_f32(dir + "/model-00001-of-00002.safetensors", "model.layers.0.self_attn.o_proj.weight_scale_inv", 300.f);
  expect_cli_error(logits_args(dir), {"model.layers.0.self_attn.o_proj.weight_scale_inv", "holds 300",
                                      "finite and below 256"});
}

TEST(LoadErrors, UnknownArchitectureAndMissingField) {
  std::string dir = copy_fixture("qwen2-moe-tiny");
  json cfg = json::parse(std::ifstream(dir + "/config.json"));
  cfg["architectures"] = {"LlamaForCausalLM"};
  std::ofstream(dir + "/config.json") << cfg.dump();
  expect_cli_error(logits_args(dir), {"config.json", "LlamaForCausalLM", "Qwen3MoeForCausalLM"});
  cfg["architectures"] = {"Qwen2MoeForCausalLM"};
  cfg.erase("hidden_size");
  std::ofstream(dir + "/config.json") << cfg.dump();
  expect_cli_error(logits_args(dir), {"config.json", "hidden_size"});
}

TEST(LoadErrors, MissingTensor) {
  std::string dir = copy_fixture("qwen3-moe-tiny");
  edit_header(dir + "/model-00001-of-00002.safetensors", [](json& h) {
    h["model.layers.0.mlp.extra_proj.weight"] = h["model.layers.0.mlp.up_proj.weight"];
    h.erase("model.layers.0.mlp.up_proj.weight");
  });
  fs::remove(dir + "/model.safetensors.index.json");  // every shard in the folder, no index to contradict
  expect_cli_error(logits_args(dir), {"no tensor model.layers.0.mlp.up_proj.weight"});
}

TEST(LoadErrors, TensorTheModelDoesNotUse) {
  std::string dir = copy_fixture("qwen3-moe-tiny");
  edit_header(dir + "/model-00001-of-00002.safetensors",
              [](json& h) { h["model.layers.0.mlp.extra_proj.weight"] = h["model.layers.0.mlp.up_proj.weight"]; });
  expect_cli_error(logits_args(dir), {"does not use", "model.layers.0.mlp.extra_proj.weight"});
}

TEST(LoadErrors, BadIds) {
  std::string dir = test::fixture_dir("qwen3-moe-tiny");
  expect_cli_error(logits_args(dir, "5,99999"), {"token id 99999", "out of range"});
  expect_cli_error(logits_args(dir, "5,x"), {"--ids", "\"x\""});
  expect_cli_error("generate --model-path " + dir + " --ids 1,-2", {"--ids"});
}

TEST(LoadErrors, NotADirectory) {
  expect_cli_error(logits_args("/nonexistent/model"), {"/nonexistent/model"});
}

TEST(Cli, LogitsFileMatchesTheReference) {
  std::string dir = test::fixture_dir("qwen2-moe-tiny"), out = test::temp_dir() + "/l.safetensors", log;
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " logits --model-path " + dir + " --ids 5,17,3 --out " + out, log), 0)
      << log;
  SafetensorsFile f(out);
  EXPECT_EQ(f.get("logits").shape(), (Shape{3, 1024}));
}

TEST(Cli, GenerateMatchesGreedyReference) {
  std::string dir = test::fixture_dir("deepseek-v2-lite-tiny"), log;
  auto ref = WeightStore::open_file(dir + "/reference.safetensors");
  auto ids = test::to_ids(ref.get("prompt.1.input_ids"));
  auto expected = test::to_ids(ref.get("prompt.1.greedy_ids"));
  std::string csv;
  for (auto id : ids) csv += (csv.empty() ? "" : ",") + std::to_string(id);
  ASSERT_EQ(test::run_command(test::moeserve_bin() + " generate --model-path " + dir + " --ids " + csv +
                                  " --max-new-tokens 16 --temperature 0 --ignore-eos",
                              log),
            0)
      << log;
  auto j = json::parse(log);
  EXPECT_EQ(j["output_ids"].get<std::vector<int32_t>>(), expected);  // min margin of this prompt is 1.2e-2
}

}  // namespace
}  // namespace ms
