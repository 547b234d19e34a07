// The text stages of a Hugging Face tokenizer.json that run before the BPE model: the
// normalizer (NFC/NFD/NFKC/NFKD, Lowercase, Sequence) and the pre-tokenizer (Split with a
// regex or a literal, ByteLevel, Digits, Sequence). Regexes are PCRE2 in UTF+UCP mode, JIT
// compiled; `\s` is rewritten to Unicode White_Space, the class HF tokenizers' Oniguruma uses.
#pragma once
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace ms {

class Regex;
struct RegexScratch;

class Normalizer {
 public:
  static Normalizer from_json(const nlohmann::json& config, const std::string& source);  // null: identity
  // Returns `text` itself when no step changes it, otherwise a view of `buf`.
  std::string_view apply(std::string_view text, std::string& buf) const;
  bool empty() const { return steps_.empty(); }

 private:
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase };
  void add(const nlohmann::json& config, const std::string& source);
  std::vector<Kind> steps_;
};

// Per-thread working memory of a pre-tokenizer (PCRE2 match data, copies of prefixed pieces).
class PreTokenizerScratch {
 public:
  PreTokenizerScratch();
  ~PreTokenizerScratch();
  RegexScratch& regex() { return *regex_; }
  std::string_view keep(std::string s);  // stores s; the view stays valid until clear()
  void clear() { kept_.clear(); }

 private:
  std::unique_ptr<RegexScratch> regex_;
  std::deque<std::string> kept_;
};

class PreTokenizer {
 public:
  static PreTokenizer from_json(const nlohmann::json& config, const std::string& source);
  PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Appends the words of `text` to `out`; the views point into `text` or into scratch.
  void split(std::string_view text, PreTokenizerScratch& scratch, std::vector<std::string_view>& out) const;
  bool byte_level() const { return byte_level_; }

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    std::shared_ptr<const Regex> regex;  // null: the ByteLevel prefix-space step
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
    bool prefix_space = false;
  };
  void add(const nlohmann::json& config, const std::string& source);
  void apply(const Step& step, std::string_view piece, PreTokenizerScratch& scratch,
             std::vector<std::string_view>& out) const;
  std::vector<Step> steps_;
  bool byte_level_ = false;
};

}  // namespace ms
