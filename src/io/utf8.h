// UTF-8 helpers shared by the tokenizer and the chat-template renderer: validation, code-point
// iteration, and a streaming decoder that replaces ill-formed bytes with U+FFFD exactly as the
// WHATWG decoder (and Python's errors="replace", Rust's from_utf8_lossy) do, so that decoding a
// byte stream piece by piece gives the same text as decoding it at once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ms::utf8 {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Offset of the first ill-formed byte, or npos when `s` is valid UTF-8.
size_t find_invalid(std::string_view s);

// Decodes the code point at s[i] and advances i. `s` must be valid UTF-8.
inline char32_t next(std::string_view s, size_t& i) {
  auto b = uint8_t(s[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  int n = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
  char32_t cp = b & (0x3F >> n);
  for (int k = 1; k <= n; ++k) cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
  i += n + 1;
  return cp;
}

// Decodes the code point that ends just before s[i] and moves i back to its first byte.
inline char32_t prev(std::string_view s, size_t& i) {
  size_t j = i - 1;
  while (j > 0 && (uint8_t(s[j]) & 0xC0) == 0x80) --j;
  size_t k = j;
  char32_t cp = next(s, k);
  i = j;
  return cp;
}

void append(std::string& out, char32_t cp);
size_t count_code_points(std::string_view s);

// Streaming lossy decoder: bytes in, well-formed UTF-8 out. Output is produced only for
// complete characters; an incomplete trailing sequence waits for more bytes (or `finish`).
class StreamDecoder {
 public:
  void feed(std::string_view bytes, std::string& out);
  // Ends the stream: a pending incomplete sequence becomes one U+FFFD.
  void finish(std::string& out);
  bool has_pending() const { return needed_ > 0; }

 private:
  void feed_byte(uint8_t b, std::string& out);
  void reset();
  char pending_[4] = {};
  int seen_ = 0, needed_ = 0;
  uint8_t lower_ = 0x80, upper_ = 0xBF;
};

}  // namespace ms::utf8
