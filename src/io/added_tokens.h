// Finds a tokenizer's added tokens in text before anything else sees it, as HF tokenizers'
// AddedVocabulary does: leftmost-longest matches, `single_word` matches only between non-word
// characters, `lstrip`/`rstrip` swallow the whitespace beside the token.
#pragma once
#include <cstdint>
#include <string_view>
#include <vector>

#include "io/tokenizer.h"

namespace ms {

class AddedTokenMatcher {
 public:
  struct Segment {
    size_t begin, end;
    int32_t token;  // index into the token list, or -1 for text between tokens
  };
  // Matches the tokens whose `normalized` flag equals `normalized`.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized);
  bool empty() const { return nodes_.size() == 1; }
  // Cuts `text` into text segments and token segments (in order, covering it).
  void split(std::string_view text, std::vector<Segment>& out) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;
    int32_t token = -1;
  };
  // The longest token starting at text[pos]: its index, and its length in `len`.
  int32_t longest_at(std::string_view text, size_t pos, size_t& len) const;
  const std::vector<AddedToken>& tokens_;
  std::vector<Node> nodes_;
  bool first_byte_[256] = {};
};

bool is_unicode_whitespace(char32_t c);

}  // namespace ms
