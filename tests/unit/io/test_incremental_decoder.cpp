// Streaming detokenization: the text pushed out token by token is the full decode, exactly,
// and at every step it is the decode of the ids so far up to the last complete character.
#include <gtest/gtest.h>

#include "io/tokenizer.h"
#include "io/utf8.h"
#include "peers.h"

namespace ms {
namespace {

const Tokenizer& tokenizer(const std::string& model) {
  static std::map<std::string, Tokenizer> loaded;
  auto it = loaded.find(model);
  if (it == loaded.end()) {
    test::require_peers();
    it = loaded.emplace(model, Tokenizer::load(test::peer_model_dir(model))).first;
  }
  return it->second;
}

// Checks one id sequence; `check_every_step` also compares each prefix (quadratic).
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip, bool check_every_step,
                  const std::string& what) {
  IncrementalDecoder dec(tok, skip);
  std::string streamed;
  for (size_t k = 0; k < ids.size(); ++k) {
    std::string piece = dec.push(ids[k]);
    ASSERT_EQ(utf8::find_invalid(piece), std::string::npos) << what << ": a broken character was emitted at token " << k;
    streamed += piece;
    if (check_every_step) {
      // What is held back is only an incomplete character: finishing a copy now must give
      // exactly the decode of the prefix.
      IncrementalDecoder copy = dec;
      std::span<const int32_t> prefix(ids.data(), k + 1);
      ASSERT_EQ(streamed + copy.finish(), tok.decode(prefix, skip)) << what << ": after token " << k;
    }
  }
  streamed += dec.finish();
  EXPECT_EQ(streamed, tok.decode(ids, skip)) << what;
}

class IncrementalDecoderTest : public ::testing::TestWithParam<std::string> {};

TEST_P(IncrementalDecoderTest, CorpusStreamsToTheFullDecode) {
  const auto& tok = tokenizer(GetParam());
  auto lines = test::tokenizer_corpus();
  for (size_t i = 0; i < lines.size(); ++i) {
    auto ids = tok.encode(lines[i]);
    for (bool skip : {false, true}) check_stream(tok, ids, skip, ids.size() < 400, "line " + std::to_string(i));
    // Text made of whole characters never shows a replacement character while streaming.
    IncrementalDecoder dec(tok);
    for (int32_t id : ids) EXPECT_EQ(dec.push(id).find(utf8::kReplacement), std::string::npos) << test::show(lines[i]);
  }
}

TEST_P(IncrementalDecoderTest, BrokenByteSequencesStreamToTheFullDecode) {
  const auto& tok = tokenizer(GetParam());
  std::mt19937 rng(99);
  std::vector<int32_t> added;
  for (const auto& a : tok.added_tokens()) added.push_back(a.id);
  for (int n = 0; n < 300; ++n) {
    std::vector<int32_t> ids;
    int len = 1 + int(rng() % 60);
    for (int i = 0; i < len; ++i) {
      uint32_t kind = rng() % 10;
      // Low ids are single bytes (many of them UTF-8 lead or continuation bytes).
      ids.push_back(kind == 0 ? added[rng() % added.size()] : kind < 5 ? int32_t(rng() % 256)
                                                                       : int32_t(rng() % uint32_t(tok.vocab_size())));
    }
    for (bool skip : {false, true}) check_stream(tok, ids, skip, true, "random sequence " + std::to_string(n));
  }
}

TEST_P(IncrementalDecoderTest, CharacterSplitAcrossTokensIsHeldBack) {
  const auto& tok = tokenizer(GetParam());
  // One token per byte of a 4-byte emoji: nothing comes out until its last byte.
  std::string emoji = "\xF0\x9F\x99\x82";
  std::vector<int32_t> ids;
  for (unsigned char c : emoji) {
    // The byte-level token of a single byte is what BPE starts from; find it by decoding.
    int32_t found = -1;
    for (int32_t id = 0; id < tok.vocab_size() && found < 0; ++id) {
      bool added = false;
      auto p = tok.piece(id, added);
      if (!added && p.size() == 1 && uint8_t(p[0]) == c) found = id;
    }
    ASSERT_GE(found, 0);
    ids.push_back(found);
  }
  IncrementalDecoder dec(tok);
  EXPECT_EQ(dec.push(ids[0]), "");
  EXPECT_EQ(dec.push(ids[1]), "");
  EXPECT_EQ(dec.push(ids[2]), "");
  EXPECT_EQ(dec.push(ids[3]), emoji);
  EXPECT_EQ(dec.finish(), "");
}

INSTANTIATE_TEST_SUITE_P(RealVocabularies, IncrementalDecoderTest, ::testing::Values("qwen3", "deepseek_v3"));

}  // namespace
}  // namespace ms
