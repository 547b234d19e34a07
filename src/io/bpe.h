// The byte-level BPE model of a Hugging Face tokenizer.json (`"model": {"type": "BPE"}`).
// Words arrive as raw UTF-8 bytes; each byte starts as the vocabulary token of its GPT-2
// byte-to-unicode character, and merges run on integer ids through a (left, right) -> rank
// table, lowest rank first and leftmost first among equal ranks (as HF tokenizers does).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ms {

// GPT-2's reversible byte <-> printable-character map used by byte-level BPE vocabularies.
char32_t byte_to_char(uint8_t b);
// The byte a character stands for, or -1 when it is not one of the 256 mapped characters.
int char_to_byte(char32_t c);
// The raw bytes a byte-level token string stands for; nullopt when a character is unmapped.
std::optional<std::string> byte_level_decode(std::string_view token);

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StringMap = std::unordered_map<std::string, V, StringHash, std::equal_to<>>;

// Word -> ids memo for repeated words; one per encoding thread (never shared).
class BpeCache {
 public:
  const int32_t* find(std::string_view word, size_t& n) const;
  void insert(std::string_view word, const int32_t* ids, size_t n);

 private:
  static constexpr size_t kMaxEntries = 1 << 17;
  StringMap<std::pair<uint32_t, uint32_t>> index_;  // word -> (offset, count) in ids_
  std::vector<int32_t> ids_;
};

class BpeModel {
 public:
  BpeModel(const nlohmann::json& model, const std::string& source);

  int32_t vocab_size() const { return int32_t(tokens_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // The vocabulary string of an id ("" for an id the vocabulary lacks).
  const std::string& id_to_token(int32_t id) const { return tokens_[size_t(id)]; }
  // The raw bytes an id stands for.
  const std::string& id_to_bytes(int32_t id) const { return bytes_[size_t(id)]; }
  bool has_id(int32_t id) const { return id >= 0 && size_t(id) < tokens_.size() && present_[size_t(id)]; }

  // Appends the ids of one pre-tokenized word (raw bytes, non-empty).
  void encode_word(std::string_view word, std::vector<int32_t>& out, BpeCache& cache) const;

 private:
  struct Merge {
    int32_t rank, id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  const Merge* find_merge(int32_t a, int32_t b) const;
  void load_vocab(const nlohmann::json& vocab, const std::string& source);
  void load_merges(const nlohmann::json& merges, const std::string& source);
  void add_merge(const std::string& a, const std::string& b, int32_t rank, const std::string& source);
  size_t merge_small(int32_t* ids, size_t n) const;
  void merge_large(std::vector<int32_t>& ids) const;

  std::vector<std::string> tokens_, bytes_;
  std::vector<bool> present_;
  StringMap<int32_t> token_ids_;  // vocabulary string -> id
  StringMap<int32_t> byte_ids_;   // raw bytes -> id
  int32_t byte_token_[256];
  bool ignore_merges_ = false;
  // Open-addressing table from pair_key to Merge; empty slots hold key kEmpty.
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  std::vector<uint64_t> merge_keys_;
  std::vector<Merge> merge_vals_;
  uint64_t merge_mask_ = 0;
};

}  // namespace ms
