#include "io/tokenizer.h"

#include <algorithm>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "io/added_tokens.h"
#include "io/bpe.h"
#include "io/pretokenizer.h"
#include "io/text_file.h"

namespace ms {
using json = nlohmann::json;

namespace {

// Per-thread working memory of encode(); pooled so that concurrent encodes never share one.
struct EncodeContext {
  BpeCache cache;
  PreTokenizerScratch scratch;
  std::string normalized;
  std::vector<std::string_view> words;
  std::vector<AddedTokenMatcher::Segment> raw_segments, norm_segments;
};

// A token named in tokenizer_config.json: a string, an {"content": ...} object, or null.
std::optional<std::string> config_token(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content")) return (*it)["content"].get<std::string>();
  fail("tokenizer_config.json: \"", key, "\" is neither a string nor an AddedToken object");
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  BpeModel model;
  Normalizer normalizer;
  PreTokenizer pre_tokenizer;
  std::vector<AddedToken> added;
  std::vector<int32_t> added_index;  // id -> index into `added`, or -1
  std::vector<bool> special;         // id -> skipped by skip_special_tokens
  std::unique_ptr<AddedTokenMatcher> raw_matcher, norm_matcher;
  std::vector<int32_t> prefix, suffix;  // what add_special_tokens puts around a text
  std::optional<std::string> bos_token, eos_token;
  std::mutex pool_mutex;
  std::vector<std::unique_ptr<EncodeContext>> pool;

  Impl(const json& tok, const json& config, const std::string& src)
      : source(src),
        model(tok.at("model"), src),
        normalizer(Normalizer::from_json(tok.value("normalizer", json()), src)),
        pre_tokenizer(PreTokenizer::from_json(tok.value("pre_tokenizer", json()), src)) {}

  void encode_words(std::string_view text, EncodeContext& ctx, std::vector<int32_t>& ids) const;
  void encode_section(std::string_view text, EncodeContext& ctx, std::vector<int32_t>& ids) const;
  void load_added(const json& tok, const json& config);
  void load_post_processor(const json& tok, const json& config);
  std::optional<int32_t> find_id(std::string_view token) const;
};

std::optional<int32_t> Tokenizer::Impl::find_id(std::string_view token) const {
  for (const auto& a : added)
    if (a.content == token) return a.id;
  return model.token_to_id(token);
}

void Tokenizer::Impl::load_added(const json& tok, const json& config) {
  for (const auto& a : tok.value("added_tokens", json::array())) {
    AddedToken t;
    t.content = a.at("content").get<std::string>();
    t.id = a.at("id").get<int32_t>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    t.normalized = a.value("normalized", !t.special);
    MS_CHECK(t.id >= 0 && !t.content.empty(), source, ": added token \"", t.content, "\" is invalid");
    MS_CHECK(utf8::find_invalid(t.content) == std::string::npos, source, ": added token ", t.id, " is not UTF-8");
    added.push_back(std::move(t));
  }
  int32_t n = model.vocab_size();
  for (const auto& a : added) n = std::max(n, a.id + 1);
  added_index.assign(size_t(n), -1);
  special.assign(size_t(n), false);
  for (size_t i = 0; i < added.size(); ++i) {
    added_index[size_t(added[i].id)] = int32_t(i);
    special[size_t(added[i].id)] = added[i].special;
  }
  // transformers also skips the tokens listed as additional_special_tokens.
  for (const auto& extra : config.value("additional_special_tokens", json::array())) {
    std::string content = extra.is_object() ? extra.value("content", std::string()) : extra.get<std::string>();
    if (auto id = find_id(content)) special[size_t(*id)] = true;
  }
  raw_matcher = std::make_unique<AddedTokenMatcher>(added, false);
  norm_matcher = std::make_unique<AddedTokenMatcher>(added, true);
}

// transformers' Llama-style tokenizers build their post-processor from add_bos_token /
// add_eos_token when tokenizer_config.json sets them (DeepSeek-V3 does, with a ByteLevel
// post-processor in tokenizer.json); otherwise tokenizer.json's TemplateProcessing decides.
void Tokenizer::Impl::load_post_processor(const json& tok, const json& config) {
  bos_token = config_token(config, "bos_token");
  eos_token = config_token(config, "eos_token");
  if (config.contains("add_bos_token") || config.contains("add_eos_token")) {
    auto add = [&](const char* flag, const std::optional<std::string>& token, std::vector<int32_t>& out) {
      if (!config.value(flag, false)) return;
      MS_CHECK(token, source, ": ", flag, " is set but the token is not named in tokenizer_config.json");
      auto id = find_id(*token);
      MS_CHECK(id, source, ": ", flag, ": token \"", *token, "\" is not in the vocabulary");
      out.push_back(*id);
    };
    add("add_bos_token", bos_token, prefix);
    add("add_eos_token", eos_token, suffix);
    return;
  }
  std::vector<json> processors;
  const json pp = tok.value("post_processor", json());
  if (pp.is_object() && pp.value("type", "") == "Sequence") processors = pp.at("processors").get<std::vector<json>>();
  else if (!pp.is_null()) processors.push_back(pp);
  for (const auto& p : processors) {
    auto type = p.value("type", std::string());
    if (type == "ByteLevel") continue;  // offsets only
    MS_CHECK(type == "TemplateProcessing", source, ": post-processor type \"", type, "\" is not supported");
    bool seen_sequence = false;
    for (const auto& piece : p.at("single")) {
      if (piece.contains("Sequence")) {
        seen_sequence = true;
        continue;
      }
      auto name = piece.at("SpecialToken").at("id").get<std::string>();
      auto ids = p.at("special_tokens").at(name).at("ids").get<std::vector<int32_t>>();
      auto& out = seen_sequence ? suffix : prefix;
      out.insert(out.end(), ids.begin(), ids.end());
    }
  }
}

Tokenizer::Tokenizer(const std::string& tokenizer_json, const std::string& config_json, const std::string& source) {
  json tok, config = json::object();
  try {
    tok = json::parse(tokenizer_json);
    if (!config_json.empty()) config = json::parse(config_json);
  } catch (const json::exception& e) {
    fail(source, ": invalid JSON: ", e.what());
  }
  MS_CHECK(tok.contains("model"), source, ": no \"model\" in tokenizer.json");
  impl_ = std::make_unique<Impl>(tok, config, source);
  MS_CHECK(impl_->pre_tokenizer.byte_level(), source,
           ": only byte-level BPE tokenizers are supported (no ByteLevel pre-tokenizer)");
  const json decoder = tok.value("decoder", json());
  MS_CHECK(decoder.is_object() && decoder.value("type", "") == "ByteLevel", source,
           ": decoder must be ByteLevel, got ", decoder.dump());
  impl_->load_added(tok, config);
  impl_->load_post_processor(tok, config);
}

Tokenizer Tokenizer::load(const std::string& model_dir) {
  std::string path = model_dir + "/tokenizer.json";
  std::string config = read_text_file_if_exists(model_dir + "/tokenizer_config.json").value_or("");
  return Tokenizer(read_text_file(path), config, path);
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::Impl::encode_words(std::string_view text, EncodeContext& ctx, std::vector<int32_t>& ids) const {
  ctx.words.clear();
  pre_tokenizer.split(text, ctx.scratch, ctx.words);
  for (std::string_view w : ctx.words) model.encode_word(w, ids, ctx.cache);
  ctx.scratch.clear();
}

// Text between special tokens: normalize, then match the normalized added tokens, then BPE.
void Tokenizer::Impl::encode_section(std::string_view text, EncodeContext& ctx, std::vector<int32_t>& ids) const {
  std::string_view norm = normalizer.apply(text, ctx.normalized);
  if (norm_matcher->empty()) {
    encode_words(norm, ctx, ids);
    return;
  }
  ctx.norm_segments.clear();
  norm_matcher->split(norm, ctx.norm_segments);
  for (const auto& seg : ctx.norm_segments) {
    if (seg.token >= 0) ids.push_back(added[size_t(seg.token)].id);
    else encode_words(norm.substr(seg.begin, seg.end - seg.begin), ctx, ids);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t bad = utf8::find_invalid(text);
  MS_CHECK(bad == std::string_view::npos, "tokenizer: the text is not valid UTF-8 (at byte ", bad, ")");
  std::unique_ptr<EncodeContext> ctx;
  {
    std::lock_guard lock(impl_->pool_mutex);
    if (!impl_->pool.empty()) {
      ctx = std::move(impl_->pool.back());
      impl_->pool.pop_back();
    }
  }
  if (!ctx) ctx = std::make_unique<EncodeContext>();
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_special_tokens) ids = impl_->prefix;
  ctx->raw_segments.clear();
  impl_->raw_matcher->split(text, ctx->raw_segments);
  for (const auto& seg : ctx->raw_segments) {
    if (seg.token >= 0) ids.push_back(impl_->added[size_t(seg.token)].id);
    else impl_->encode_section(text.substr(seg.begin, seg.end - seg.begin), *ctx, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  std::lock_guard lock(impl_->pool_mutex);
  impl_->pool.push_back(std::move(ctx));
  return ids;
}

std::string_view Tokenizer::piece(int32_t id, bool& added) const {
  MS_CHECK(id >= 0 && id < vocab_size(), "tokenizer: token id ", id, " is out of range (vocabulary size ",
           vocab_size(), ")");
  int32_t a = impl_->added_index[size_t(id)];
  added = a >= 0;
  if (added) return impl_->added[size_t(a)].content;
  MS_CHECK(impl_->model.has_id(id), "tokenizer: token id ", id, " is not in the vocabulary");
  return impl_->model.id_to_bytes(id);
}

// Byte-level runs are decoded lossily as a whole; an added token is copied verbatim and ends
// the run before it (as transformers' ByteLevel decode_chain does).
std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::string out;
  out.reserve(ids.size() * 4);
  utf8::StreamDecoder bytes;
  for (int32_t id : ids) {
    bool added = false;
    std::string_view p = piece(id, added);
    if (!added) {
      bytes.feed(p, out);
      continue;
    }
    if (skip_special_tokens && impl_->special[size_t(id)]) continue;
    bytes.finish(out);
    out += p;
  }
  bytes.finish(out);
  return out;
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->added_index.size()); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return impl_->find_id(token); }

std::string Tokenizer::id_to_token(int32_t id) const {
  bool added = false;
  std::string_view p = piece(id, added);
  return added ? std::string(p) : impl_->model.id_to_token(id);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[size_t(id)];
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->bos_token ? impl_->find_id(*impl_->bos_token) : std::nullopt;
}

std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->eos_token ? impl_->find_id(*impl_->eos_token) : std::nullopt;
}

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDecoder::push(int32_t id) {
  std::string out;
  bool added = false;
  std::string_view p = tokenizer_->piece(id, added);
  if (!added) {
    utf8_.feed(p, out);
  } else if (!(skip_special_ && tokenizer_->is_special(id))) {
    utf8_.finish(out);
    out += p;
  }
  return out;
}

std::string IncrementalDecoder::finish() {
  std::string out;
  utf8_.finish(out);
  return out;
}

}  // namespace ms
