// safetensors reading and writing, and the refusal of malformed files with the file and
// tensor named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/safetensors.h"
#include "test_support.h"

namespace ms {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;

std::string write_raw(const std::string& dir, const std::string& name, const std::string& header, const std::string& data) {
  std::string path = dir + "/" + name;
  std::ofstream out(path, std::ios::binary);
  uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << data;
  return path;
}

// Expects opening `path` to throw an Error whose text contains every one of `needles`.
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    for (auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
  }
}

TEST(Safetensors, RoundTripKeepsDtypesShapesAndBytes) {
  std::string dir = test::temp_dir();
  Tensor a = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = Tensor::empty(DType::BF16, {4});
  for (int i = 0; i < 4; ++i) b.data<uint16_t>()[i] = f32_to_bf16(0.5f * i);
  write_safetensors(dir + "/t.safetensors", {{"a", a}, {"b", b}}, {{"format", "pt"}});
  SafetensorsFile f(dir + "/t.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.get("a").shape(), (Shape{2, 3}));
  EXPECT_EQ(f.get("a").to_vector(), a.to_vector());
  EXPECT_EQ(f.get("b").dtype(), DType::BF16);
  EXPECT_EQ(f.get("b").to_vector(), (std::vector<float>{0, 0.5f, 1, 1.5f}));
}

TEST(Safetensors, RefusesTruncatedAndLyingFiles) {
  std::string dir = test::temp_dir();
  std::string tiny = dir + "/tiny.safetensors";
  std::ofstream(tiny) << "abc";
  expect_error([&] { SafetensorsFile f(tiny); }, {tiny, "truncated"});

  json h = {{"w", {{"dtype", "F32"}, {"shape", {2, 2}}, {"data_offsets", {0, 16}}}}};
  std::string path = write_raw(dir, "short.safetensors", h.dump(), std::string(8, '\0'));
  expect_error([&] { SafetensorsFile f(path); }, {path, "tensor w", "outside"});

  h["w"]["shape"] = {3, 2};
  path = write_raw(dir, "shape.safetensors", h.dump(), std::string(16, '\0'));
  expect_error([&] { SafetensorsFile f(path); }, {"tensor w", "needs 24"});

  h["w"] = {{"dtype", "Q4_K"}, {"shape", {4}}, {"data_offsets", {0, 16}}};
  path = write_raw(dir, "dtype.safetensors", h.dump(), std::string(16, '\0'));
  expect_error([&] { SafetensorsFile f(path); }, {"tensor w", "Q4_K"});

  path = write_raw(dir, "json.safetensors", "{not json", "");
  expect_error([&] { SafetensorsFile f(path); }, {path, "JSON"});

  std::string huge = dir + "/huge.safetensors";
  {
    std::ofstream out(huge, std::ios::binary);
    uint64_t len = 1ull << 40;
    out.write(reinterpret_cast<const char*>(&len), 8);
  }
  expect_error([&] { SafetensorsFile f(huge); }, {huge, "exceeds the file size"});
}

TEST(Safetensors, ShardedIndexNamesMissingShardsAndMisplacedTensors) {
  std::string dir = test::temp_dir();
  write_safetensors(dir + "/model-00001-of-00002.safetensors", {{"a", Tensor::from_vector({1}, {1})}});
  json index = {{"weight_map", {{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}}}};
  std::ofstream(dir + "/model.safetensors.index.json") << index.dump();
  expect_error([&] { WeightStore::open_dir(dir); }, {"model-00002-of-00002.safetensors", "missing"});

  write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"c", Tensor::from_vector({1}, {1})}});
  expect_error([&] { WeightStore::open_dir(dir); }, {"tensor b", "model-00002-of-00002.safetensors"});

  write_safetensors(dir + "/model-00002-of-00002.safetensors", {{"b", Tensor::from_vector({2}, {1})}});
  WeightStore store = WeightStore::open_dir(dir);
  EXPECT_EQ(store.get("b").to_vector(), std::vector<float>{2});
  expect_error([&] { store.get("zz"); }, {"no tensor zz"});
}

TEST(Safetensors, FixtureShardsLoadZeroCopy) {
  WeightStore store = WeightStore::open_dir(test::fixture_dir("qwen3-moe-tiny"));
  Tensor a = store.get("model.embed_tokens.weight"), b = store.get("model.embed_tokens.weight");
  EXPECT_EQ(a.raw(), b.raw());  // both views into the same mapping
  EXPECT_EQ(a.describe(), "BF16[1024, 128]");
}

}  // namespace
}  // namespace ms
