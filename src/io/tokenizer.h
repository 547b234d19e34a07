// Text <-> token ids with a Hugging Face `tokenizer.json` (byte-level BPE) and the BOS/EOS
// settings of `tokenizer_config.json`, giving the ids HF tokenizers gives:
//   added tokens are matched first (longest match, lstrip/rstrip/single_word), the rest is
//   normalized, pre-tokenized and BPE-encoded; decoding maps ids back to bytes and replaces
//   ill-formed UTF-8 with U+FFFD. Encoding is safe from many threads at once.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/utf8.h"

namespace ms {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
  static Tokenizer load(const std::string& model_dir);
  // `config_json` may be empty (no tokenizer_config.json); `source` names them in errors.
  Tokenizer(const std::string& tokenizer_json, const std::string& config_json, const std::string& source);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // `text` must be valid UTF-8. add_special_tokens adds what the model adds around a text
  // (DeepSeek-V3: BOS first); special tokens written in the text are matched either way.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  int32_t vocab_size() const;  // highest id + 1, added tokens included
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::string id_to_token(int32_t id) const;  // the vocabulary string ("Ġthe", "<|im_end|>")
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;
  std::optional<int32_t> bos_token_id() const;
  std::optional<int32_t> eos_token_id() const;

  // What one id contributes to decoded text: raw bytes for a vocabulary token (possibly part
  // of a character), or the verbatim text of an added token (`added` set).
  std::string_view piece(int32_t id, bool& added) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Streaming detokenization: feed ids one at a time, get back only text made of complete
// characters. The concatenation of every push() and the final finish() equals
// tokenizer.decode(all ids) exactly: nothing is repeated, lost, or split inside a character.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string push(int32_t id);
  std::string finish();  // flushes an incomplete trailing character as U+FFFD

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  utf8::StreamDecoder utf8_;
};

}  // namespace ms
