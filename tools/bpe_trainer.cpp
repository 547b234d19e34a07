#include "bpe_trainer.h"

#include <map>
#include <unordered_map>

#include "io/bpe.h"
#include "io/pretokenizer.h"
#include "io/utf8.h"

namespace ms::cli {
namespace {

using OJson = nlohmann::ordered_json;

// Qwen2/Qwen3's pre-tokenizer: their split regex, then byte-level characters.
OJson qwen_pre_tokenizer() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}}}}};
}

std::string byte_token(uint8_t b) {
  std::string s;
  utf8::append(s, byte_to_char(b));
  return s;
}

struct Word {
  std::vector<int32_t> ids;
  int64_t count;
};

std::vector<Word> count_words(const std::string& corpus, const OJson& pre_tokenizer) {
  PreTokenizer pre = PreTokenizer::from_json(nlohmann::json::parse(pre_tokenizer.dump()), "demo tokenizer");
  PreTokenizerScratch scratch;
  std::vector<std::string_view> pieces;
  pre.split(corpus, scratch, pieces);
  std::map<std::string, int64_t> counts;  // ordered: the training is deterministic
  for (std::string_view p : pieces) ++counts[std::string(p)];
  std::vector<Word> words;
  for (const auto& [w, n] : counts) {
    Word word{{}, n};
    for (unsigned char c : w) word.ids.push_back(c);
    words.push_back(std::move(word));
  }
  return words;
}

// The most frequent adjacent pair (lowest ids on ties); count 0 when none.
std::pair<std::pair<int32_t, int32_t>, int64_t> best_pair(const std::vector<Word>& words) {
  std::map<std::pair<int32_t, int32_t>, int64_t> pairs;
  for (const Word& w : words)
    for (size_t i = 0; i + 1 < w.ids.size(); ++i) pairs[{w.ids[i], w.ids[i + 1]}] += w.count;
  std::pair<std::pair<int32_t, int32_t>, int64_t> best{{0, 0}, 0};
  for (const auto& [p, n] : pairs)
    if (n > best.second) best = {p, n};
  return best;
}

void apply_merge(std::vector<Word>& words, std::pair<int32_t, int32_t> pair, int32_t id) {
  for (Word& w : words) {
    std::vector<int32_t> out;
    for (size_t i = 0; i < w.ids.size(); ++i) {
      if (i + 1 < w.ids.size() && w.ids[i] == pair.first && w.ids[i + 1] == pair.second) {
        out.push_back(id);
        ++i;
      } else {
        out.push_back(w.ids[i]);
      }
    }
    w.ids = std::move(out);
  }
}

}  // namespace

OJson train_byte_level_bpe(const std::string& corpus, int max_merges, const std::vector<std::string>& special_tokens) {
  const OJson pre = qwen_pre_tokenizer();
  std::vector<Word> words = count_words(corpus, pre);
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int32_t> ids;
  for (int b = 0; b < 256; ++b) tokens.push_back(byte_token(uint8_t(b))), ids[tokens.back()] = b;
  OJson merges = OJson::array();
  for (int m = 0; m < max_merges; ++m) {
    auto [pair, count] = best_pair(words);
    if (count < 2) break;
    const std::string merged = tokens[size_t(pair.first)] + tokens[size_t(pair.second)];
    auto [it, fresh] = ids.emplace(merged, int32_t(tokens.size()));
    if (fresh) tokens.push_back(merged);  // a string reached by another merge path keeps its id
    merges.push_back({tokens[size_t(pair.first)], tokens[size_t(pair.second)]});
    apply_merge(words, pair, it->second);
  }
  OJson vocab = OJson::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  OJson added = OJson::array();
  for (size_t i = 0; i < special_tokens.size(); ++i)
    added.push_back({{"id", tokens.size() + i}, {"content", special_tokens[i]}, {"single_word", false},
                     {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}});
  const OJson byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false},
                            {"use_regex", false}};
  return {{"version", "1.0"},      {"truncation", nullptr},   {"padding", nullptr},
          {"added_tokens", added}, {"normalizer", {{"type", "NFC"}}}, {"pre_tokenizer", pre},
          {"post_processor", byte_level}, {"decoder", byte_level},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
            {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
            {"vocab", vocab}, {"merges", merges}}}};
}

}  // namespace ms::cli
