#include "io/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdlib>

#include "core/check.h"
#include "io/utf8.h"

namespace ms {

namespace {

// Unicode White_Space (Oniguruma's \s in HF tokenizers), as the inside of a character class.
constexpr std::string_view kWhiteSpace =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// GPT-2's split, used by a ByteLevel pre-tokenizer with use_regex.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

// Rewrites \s (and \S outside classes) to White_Space: PCRE2's UCP \s also takes U+180E and
// JavaScript's takes U+FEFF, which HF tokenizers do not.
std::string rewrite_whitespace(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char d = p[++i];
      if (d == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (d == 'S' && !in_class) {
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else if (d == 'Q') {  // \Q...\E is literal text
        size_t end = p.find("\\E", i + 1);
        end = end == std::string::npos ? p.size() : end + 2;
        out.append(p, i - 1, end - (i - 1));
        i = end - 1;
      } else {
        out += c;
        out += d;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is literal
    } else if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      size_t end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i + 1, end + 2 - (i + 1));
        i = end + 1;
      }
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (uint8_t(c) >= 0x80) return false;
  return true;
}

// True when no character of `s` can change under canonical (de)composition: no decomposable
// character, no combining mark, no Hangul jamo (which compose with a preceding syllable) and,
// when decomposing, no Hangul syllable (whose decomposition utf8proc computes, not stores).
bool trivially_normalized(std::string_view s, bool decompose) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    char32_t cp = utf8::next(s, i);
    if (cp < 0x300 && !decompose) continue;  // below the combining marks everything is NFC
    if (cp >= 0x1100 && cp <= 0x11FF) return false;
    if (decompose && cp >= 0xAC00 && cp <= 0xD7A3) return false;
    const utf8proc_property_t* p = utf8proc_get_property(utf8proc_int32_t(cp));
    if (p->combining_class != 0 || p->decomp_seqindex != UINT16_MAX || p->category == UTF8PROC_CATEGORY_MN ||
        p->category == UTF8PROC_CATEGORY_MC || p->category == UTF8PROC_CATEGORY_ME)
      return false;
  }
  return true;
}

}  // namespace

// ---- Regex ------------------------------------------------------------------------------------

struct RegexScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  RegexScratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~RegexScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& source) : pattern_(pattern) {
    std::string compiled = literal ? pattern : rewrite_whitespace(pattern);
    int err = 0;
    PCRE2_SIZE offset = 0;
    uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(compiled.data()), compiled.size(), flags, &err, &offset,
                          nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail(source, ": cannot compile pre-tokenizer regex /", pattern, "/ at offset ", offset, ": ",
           reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // without JIT support pcre2_match interprets
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(begin, end) for each match, left to right; an empty match splits but is skipped over.
  template <class Fn>
  void for_each_match(std::string_view text, RegexScratch& scratch, Fn&& fn) const {
    auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos <= text.size()) {
      int rc = pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      MS_CHECK(rc >= 0, "pre-tokenizer regex /", pattern_, "/ failed with PCRE2 error ", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
      fn(size_t(ov[0]), size_t(ov[1]));
      if (ov[1] > ov[0]) {
        pos = ov[1];
      } else {
        if (ov[0] >= text.size()) return;
        pos = ov[0] + 1;
        while (pos < text.size() && (uint8_t(text[pos]) & 0xC0) == 0x80) ++pos;
      }
    }
  }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
};

// ---- Normalizer -------------------------------------------------------------------------------

Normalizer Normalizer::from_json(const nlohmann::json& config, const std::string& source) {
  Normalizer n;
  if (!config.is_null()) n.add(config, source);
  return n;
}

void Normalizer::add(const nlohmann::json& config, const std::string& source) {
  auto type = config.value("type", std::string());
  if (type == "Sequence") {
    for (const auto& step : config.at("normalizers")) add(step, source);
  } else if (type == "NFC") {
    steps_.push_back(Kind::kNfc);
  } else if (type == "NFD") {
    steps_.push_back(Kind::kNfd);
  } else if (type == "NFKC") {
    steps_.push_back(Kind::kNfkc);
  } else if (type == "NFKD") {
    steps_.push_back(Kind::kNfkd);
  } else if (type == "Lowercase") {
    steps_.push_back(Kind::kLowercase);
  } else {
    fail(source, ": normalizer type \"", type, "\" is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Sequence)");
  }
}

std::string_view Normalizer::apply(std::string_view text, std::string& buf) const {
  std::string_view cur = text;
  std::string tmp;
  for (Kind k : steps_) {
    if (k == Kind::kLowercase) {
      tmp.clear();
      for (size_t i = 0; i < cur.size();) utf8::append(tmp, char32_t(utf8proc_tolower(utf8proc_int32_t(utf8::next(cur, i)))));
    } else {
      bool compat = k == Kind::kNfkc || k == Kind::kNfkd;
      bool compose = k == Kind::kNfc || k == Kind::kNfkc;
      if (is_ascii(cur) || (!compat && trivially_normalized(cur, !compose))) continue;
      int options = UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                    (compat ? UTF8PROC_COMPAT : 0);
      utf8proc_uint8_t* out = nullptr;
      auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()), utf8proc_ssize_t(cur.size()), &out,
                            utf8proc_option_t(options));
      MS_CHECK(n >= 0, "normalizer: ", utf8proc_errmsg(n));
      tmp.assign(reinterpret_cast<const char*>(out), size_t(n));
      std::free(out);
    }
    buf.swap(tmp);
    cur = buf;
  }
  return cur;
}

// ---- PreTokenizer -----------------------------------------------------------------------------

PreTokenizerScratch::PreTokenizerScratch() : regex_(std::make_unique<RegexScratch>()) {}
PreTokenizerScratch::~PreTokenizerScratch() = default;

std::string_view PreTokenizerScratch::keep(std::string s) {
  kept_.push_back(std::move(s));
  return kept_.back();
}

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

PreTokenizer PreTokenizer::from_json(const nlohmann::json& config, const std::string& source) {
  PreTokenizer p;
  if (!config.is_null()) p.add(config, source);
  return p;
}

void PreTokenizer::add(const nlohmann::json& config, const std::string& source) {
  auto type = config.value("type", std::string());
  if (type == "Sequence") {
    for (const auto& step : config.at("pretokenizers")) add(step, source);
  } else if (type == "Split") {
    const auto& pattern = config.at("pattern");
    bool literal = pattern.contains("String");
    MS_CHECK(literal || pattern.contains("Regex"), source, ": Split pattern is neither String nor Regex");
    Step step;
    step.regex = std::make_shared<Regex>(pattern.at(literal ? "String" : "Regex").get<std::string>(), literal, source);
    step.invert = config.value("invert", false);
    auto behavior = config.value("behavior", std::string("Isolated"));
    if (behavior == "Removed") step.behavior = Behavior::kRemoved;
    else if (behavior == "Isolated") step.behavior = Behavior::kIsolated;
    else if (behavior == "MergedWithPrevious") step.behavior = Behavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = Behavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = Behavior::kContiguous;
    else fail(source, ": Split behavior \"", behavior, "\" is not supported");
    steps_.push_back(std::move(step));
  } else if (type == "ByteLevel") {
    byte_level_ = true;
    if (config.value("add_prefix_space", true)) steps_.push_back(Step{nullptr, Behavior::kIsolated, false, true});
    if (config.value("use_regex", true))
      steps_.push_back(Step{std::make_shared<Regex>(kGpt2Pattern, false, source), Behavior::kIsolated, false, false});
  } else if (type == "Digits") {
    auto pattern = config.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+";
    steps_.push_back(Step{std::make_shared<Regex>(pattern, false, source), Behavior::kIsolated, false, false});
  } else {
    fail(source, ": pre-tokenizer type \"", type, "\" is not supported (Split, ByteLevel, Digits, Sequence)");
  }
}

void PreTokenizer::apply(const Step& step, std::string_view piece, PreTokenizerScratch& scratch,
                         std::vector<std::string_view>& out) const {
  if (!step.regex) {
    out.push_back(piece.starts_with(' ') ? piece : scratch.keep(" " + std::string(piece)));
    return;
  }
  if (step.behavior == Behavior::kIsolated && !step.invert) {  // the common case, without a parts list
    size_t prev = 0;
    step.regex->for_each_match(piece, scratch.regex(), [&](size_t b, size_t e) {
      if (b > prev) out.push_back(piece.substr(prev, b - prev));
      if (e > b) out.push_back(piece.substr(b, e - b));
      prev = e;
    });
    if (prev < piece.size()) out.push_back(piece.substr(prev));
    return;
  }
  struct Part {
    size_t begin, end;
    bool match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  step.regex->for_each_match(piece, scratch.regex(), [&](size_t b, size_t e) {
    if (b > prev) parts.push_back({prev, b, step.invert});
    parts.push_back({b, e, !step.invert});
    prev = e;
  });
  if (prev < piece.size()) parts.push_back({prev, piece.size(), step.invert});
  // The folds of HF tokenizers' NormalizedString::split, one per behavior.
  std::vector<Part> merged;
  if (step.behavior == Behavior::kMergedWithNext) {
    bool prev_match = false;
    for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
      if (it->match && !prev_match && !merged.empty()) merged.back().begin = it->begin;
      else merged.push_back({it->begin, it->end, false});
      prev_match = it->match;
    }
    std::reverse(merged.begin(), merged.end());
  } else {
    bool prev_match = false;
    for (const Part& p : parts) {
      bool join = step.behavior == Behavior::kMergedWithPrevious ? p.match && !prev_match
                  : step.behavior == Behavior::kContiguous        ? p.match == prev_match
                                                                   : false;
      if (step.behavior == Behavior::kRemoved && p.match) {
        prev_match = p.match;
        continue;
      }
      if (join && !merged.empty()) merged.back().end = p.end;
      else merged.push_back({p.begin, p.end, false});
      prev_match = p.match;
    }
  }
  for (const Part& p : merged)
    if (p.end > p.begin) out.push_back(piece.substr(p.begin, p.end - p.begin));
}

void PreTokenizer::split(std::string_view text, PreTokenizerScratch& scratch,
                         std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  if (steps_.empty()) {
    out.push_back(text);
    return;
  }
  size_t first = out.size();
  apply(steps_[0], text, scratch, out);
  std::vector<std::string_view> pieces;
  for (size_t s = 1; s < steps_.size(); ++s) {
    pieces.assign(out.begin() + std::ptrdiff_t(first), out.end());
    out.resize(first);
    for (std::string_view piece : pieces) apply(steps_[s], piece, scratch, out);
  }
}

}  // namespace ms
