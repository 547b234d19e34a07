#include "io/utf8.h"

namespace ms::utf8 {

size_t find_invalid(std::string_view s) {
  size_t i = 0, n = s.size();
  while (i < n) {
    auto b = uint8_t(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      need = 2;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;  // no surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      need = 3;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + need >= n) return i;  // truncated at the end
    for (int k = 1; k <= need; ++k) {
      auto c = uint8_t(s[i + k]);
      if (c < lo || c > hi) return i;
      lo = 0x80, hi = 0xBF;
    }
    i += need + 1;
  }
  return std::string_view::npos;
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

void StreamDecoder::reset() {
  seen_ = needed_ = 0;
  lower_ = 0x80, upper_ = 0xBF;
}

// The WHATWG "UTF-8 decoder" algorithm; a well-formed sequence is copied through unchanged.
void StreamDecoder::feed_byte(uint8_t b, std::string& out) {
  if (needed_ == 0) {
    if (b < 0x80) {
      out.push_back(char(b));
      return;
    }
    if (b >= 0xC2 && b <= 0xDF) {
      needed_ = 1;
    } else if (b >= 0xE0 && b <= 0xEF) {
      needed_ = 2;
      if (b == 0xE0) lower_ = 0xA0;
      if (b == 0xED) upper_ = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      needed_ = 3;
      if (b == 0xF0) lower_ = 0x90;
      if (b == 0xF4) upper_ = 0x8F;
    } else {
      out += kReplacement;
      return;
    }
    pending_[0] = char(b);
    seen_ = 1;
    return;
  }
  if (b < lower_ || b > upper_) {
    // The sequence so far is ill-formed: one U+FFFD for it, then `b` starts afresh.
    reset();
    out += kReplacement;
    feed_byte(b, out);
    return;
  }
  lower_ = 0x80, upper_ = 0xBF;
  pending_[seen_++] = char(b);
  if (seen_ == needed_ + 1) {
    out.append(pending_, size_t(seen_));
    reset();
  }
}

void StreamDecoder::feed(std::string_view bytes, std::string& out) {
  for (char c : bytes) {
    auto b = uint8_t(c);
    if (b < 0x80 && needed_ == 0) {
      out.push_back(c);
    } else {
      feed_byte(b, out);
    }
  }
}

void StreamDecoder::finish(std::string& out) {
  if (needed_ > 0) {
    reset();
    out += kReplacement;
  }
}

}  // namespace ms::utf8
