#include <algorithm>
#include <cctype>
#include <cstring>

#include "core/check.h"
#include "io/jinja_ast.h"
#include "io/utf8.h"

namespace ms::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return std::isalpha(uint8_t(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(uint8_t(c)) || c == '_'; }

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(source) {
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();  // keep_trailing_newline=False
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') newlines_.push_back(i);
  }
  std::vector<Token> run();

 private:
  int line_at(size_t pos) const {
    return int(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin()) + 1;
  }
  [[noreturn]] void error(size_t pos, const std::string& msg) const { fail("line ", line_at(pos), ": ", msg); }
  void push(Token::Type t, std::string text, size_t pos) { tokens_.push_back(Token{t, std::move(text), line_at(pos)}); }
  void flush_text(size_t pos) {
    if (!text_.empty()) push(Token::Type::kText, std::move(text_), pos);
    text_.clear();
  }
  size_t skip_comment(size_t p);
  size_t lex_tag(size_t p, char kind);
  size_t lex_string(size_t p);
  size_t lex_number(size_t p);

  std::string src_, text_;
  std::vector<size_t> newlines_;
  std::vector<Token> tokens_;
};

std::vector<Token> Lexer::run() {
  size_t i = 0;
  while (i < src_.size()) {
    size_t p = i;
    while (p + 1 < src_.size() && !(src_[p] == '{' && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')))
      ++p;
    if (p + 1 >= src_.size()) {
      text_.append(src_, i, std::string::npos);
      break;
    }
    text_.append(src_, i, p - i);
    char kind = src_[p + 1];
    char mod = p + 2 < src_.size() ? src_[p + 2] : 0;
    if (mod == '-') {
      while (!text_.empty() && is_space(text_.back())) text_.pop_back();
    } else if (kind != '{' && mod != '+') {  // lstrip_blocks: indentation before a block tag
      size_t q = p;
      while (q > 0 && (src_[q - 1] == ' ' || src_[q - 1] == '\t')) --q;
      if (q == 0 || src_[q - 1] == '\n') text_.resize(text_.size() - std::min(text_.size(), p - q));
    }
    flush_text(p);
    i = kind == '#' ? skip_comment(p) : lex_tag(p, kind);
  }
  flush_text(src_.size());
  push(Token::Type::kEnd, "", src_.size());
  return std::move(tokens_);
}

// After a block tag or comment: `-` eats all following whitespace, otherwise trim_blocks eats
// one newline (unless `+`).
size_t after_block(const std::string& s, size_t i, char mod) {
  if (mod == '-') {
    while (i < s.size() && is_space(s[i])) ++i;
  } else if (mod != '+' && i < s.size() && s[i] == '\n') {
    ++i;
  }
  return i;
}

size_t Lexer::skip_comment(size_t p) {
  size_t end = src_.find("#}", p + 2);
  if (end == std::string::npos) error(p, "unclosed comment {# ... #}");
  char mod = end > p + 2 ? src_[end - 1] : 0;
  return after_block(src_, end + 2, mod);
}

size_t Lexer::lex_string(size_t p) {
  char q = src_[p];
  std::string out;
  size_t i = p + 1;
  for (; i < src_.size() && src_[i] != q; ++i) {
    if (src_[i] != '\\' || i + 1 >= src_.size()) {
      out += src_[i];
      continue;
    }
    char e = src_[++i];
    switch (e) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case '0': out += '\0'; break;
      case '\\': case '\'': case '"': out += e; break;
      case 'x': case 'u': case 'U': {
        size_t len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        std::string hex = src_.substr(i + 1, len);
        if (hex.size() != len || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
          error(i, "invalid \\" + std::string(1, e) + " escape in a string literal");
        utf8::append(out, char32_t(std::stoul(hex, nullptr, 16)));
        i += len;
        break;
      }
      default: out += '\\', out += e;  // Python keeps unknown escapes as written
    }
  }
  if (i >= src_.size()) error(p, "unterminated string literal");
  push(Token::Type::kString, std::move(out), p);
  return i + 1;
}

size_t Lexer::lex_number(size_t p) {
  size_t i = p;
  while (i < src_.size() && (std::isdigit(uint8_t(src_[i])) || src_[i] == '_')) ++i;
  bool is_float = false;
  if (i + 1 < src_.size() && src_[i] == '.' && std::isdigit(uint8_t(src_[i + 1])) &&
      !(tokens_.back().type == Token::Type::kOperator && tokens_.back().text == ".")) {
    is_float = true;
    for (++i; i < src_.size() && (std::isdigit(uint8_t(src_[i])) || src_[i] == '_');) ++i;
  }
  if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
    size_t j = i + 1;
    if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
    if (j < src_.size() && std::isdigit(uint8_t(src_[j]))) {
      is_float = true;
      for (i = j; i < src_.size() && std::isdigit(uint8_t(src_[i]));) ++i;
    }
  }
  std::string text = src_.substr(p, i - p);
  std::erase(text, '_');
  push(is_float ? Token::Type::kFloat : Token::Type::kInt, text, p);
  return i;
}

size_t Lexer::lex_tag(size_t p, char kind) {
  bool statement = kind == '%';
  push(statement ? Token::Type::kOpenStatement : Token::Type::kOpenExpression, "", p);
  size_t i = p + 2;
  if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
  const char close = statement ? '%' : '}';
  int braces = 0;  // `}}` inside a dict literal does not end an expression
  static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                     "=", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
  while (true) {
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (i >= src_.size()) error(p, std::string("unclosed ") + (statement ? "{% ... %}" : "{{ ... }}"));
    char mod = src_[i];
    size_t c = (mod == '-' || mod == '+') ? i + 1 : i;
    if (braces == 0 && c + 1 < src_.size() && src_[c] == close && src_[c + 1] == '}') {
      push(statement ? Token::Type::kCloseStatement : Token::Type::kCloseExpression, "", c);
      if (c == i) mod = 0;
      return statement ? after_block(src_, c + 2, mod) : mod == '-' ? after_block(src_, c + 2, '-') : c + 2;
    }
    char ch = src_[i];
    if (ch == '\'' || ch == '"') {
      i = lex_string(i);
    } else if (std::isdigit(uint8_t(ch))) {
      i = lex_number(i);
    } else if (is_name_start(ch)) {
      size_t j = i;
      while (j < src_.size() && is_name_char(src_[j])) ++j;
      push(Token::Type::kName, src_.substr(i, j - i), i);
      i = j;
    } else {
      const char* op = nullptr;
      for (const char* o : kOps)
        if (src_.compare(i, std::strlen(o), o) == 0) {
          op = o;
          break;
        }
      if (!op) error(i, std::string("unexpected character '") + ch + "' in a tag");
      braces += *op == '{' ? 1 : (*op == '}' && braces > 0) ? -1 : 0;
      push(Token::Type::kOperator, op, i);
      i += std::strlen(op);
    }
  }
}

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace ms::jinja
