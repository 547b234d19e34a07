#include "io/added_tokens.h"

#include <utf8proc.h>

#include <algorithm>

namespace ms {

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

namespace {

bool is_word_char(char32_t c) {
  if (c == '_') return true;
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, bool normalized) : tokens_(tokens) {
  nodes_.emplace_back();
  for (size_t t = 0; t < tokens.size(); ++t) {
    const auto& tok = tokens[t];
    if (tok.normalized != normalized || tok.content.empty()) continue;
    int32_t node = 0;
    for (char ch : tok.content) {
      auto b = uint8_t(ch);
      auto& kids = nodes_[size_t(node)].kids;
      auto it = std::find_if(kids.begin(), kids.end(), [b](const auto& k) { return k.first == b; });
      if (it != kids.end()) {
        node = it->second;
      } else {
        auto child = int32_t(nodes_.size());
        kids.emplace_back(b, child);
        nodes_.emplace_back();  // invalidates `kids`; not used again below
        node = child;
      }
    }
    if (nodes_[size_t(node)].token < 0) nodes_[size_t(node)].token = int32_t(t);
    first_byte_[uint8_t(tok.content[0])] = true;
  }
}

int32_t AddedTokenMatcher::longest_at(std::string_view text, size_t pos, size_t& len) const {
  int32_t node = 0, best = -1;
  for (size_t j = pos; j < text.size(); ++j) {
    const auto& kids = nodes_[size_t(node)].kids;
    auto b = uint8_t(text[j]);
    auto it = std::find_if(kids.begin(), kids.end(), [b](const auto& k) { return k.first == b; });
    if (it == kids.end()) break;
    node = it->second;
    if (nodes_[size_t(node)].token >= 0) {
      best = nodes_[size_t(node)].token;
      len = j + 1 - pos;
    }
  }
  return best;
}

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>& out) const {
  size_t text_start = 0, pos = 0;
  while (pos < text.size()) {
    size_t len = 0;
    int32_t t = first_byte_[uint8_t(text[pos])] ? longest_at(text, pos, len) : -1;
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens_[size_t(t)];
    size_t begin = pos, end = pos + len;
    if (tok.single_word) {
      size_t b = begin, e = end;
      bool left_ok = b == 0 || !is_word_char(utf8::prev(text, b));
      bool right_ok = e == text.size() || !is_word_char(utf8::next(text, e));
      if (!left_ok || !right_ok) {  // like a rejected Aho-Corasick match: scanning resumes after it
        pos = end;
        continue;
      }
    }
    if (tok.lstrip) {
      for (size_t b = begin; b > text_start;) {
        if (!is_unicode_whitespace(utf8::prev(text, b))) break;
        begin = b;
      }
    }
    if (tok.rstrip) {
      for (size_t e = end; e < text.size();) {
        if (!is_unicode_whitespace(utf8::next(text, e))) break;
        end = e;
      }
    }
    if (begin > text_start) out.push_back({text_start, begin, -1});
    out.push_back({begin, end, t});
    text_start = pos = end;
  }
  if (text_start < text.size()) out.push_back({text_start, text.size(), -1});
}

}  // namespace ms
