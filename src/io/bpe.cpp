#include "io/bpe.h"

#include <algorithm>
#include <array>
#include <climits>
#include <queue>

#include "core/check.h"
#include "io/utf8.h"

namespace ms {

namespace {

struct ByteTables {
  std::array<char32_t, 256> to_char{};
  std::array<int16_t, 324> to_byte{};  // every mapped character is below U+0144
  ByteTables() {
    to_byte.fill(-1);
    auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      to_char[size_t(b)] = printable(b) ? char32_t(b) : char32_t(next++);
      to_byte[to_char[size_t(b)]] = int16_t(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

constexpr size_t kSmallWord = 64;  // words up to this many bytes merge in a flat array

}  // namespace

char32_t byte_to_char(uint8_t b) { return byte_tables().to_char[b]; }

int char_to_byte(char32_t c) { return c < 324 ? byte_tables().to_byte[c] : -1; }

std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    int b = char_to_byte(utf8::next(token, i));
    if (b < 0) return std::nullopt;
    out.push_back(char(b));
  }
  return out;
}

const int32_t* BpeCache::find(std::string_view word, size_t& n) const {
  auto it = index_.find(word);
  if (it == index_.end()) return nullptr;
  n = it->second.second;
  return ids_.data() + it->second.first;
}

void BpeCache::insert(std::string_view word, const int32_t* ids, size_t n) {
  if (index_.size() >= kMaxEntries) {  // a bounded memo: start over rather than grow forever
    index_.clear();
    ids_.clear();
  }
  index_.emplace(std::string(word), std::make_pair(uint32_t(ids_.size()), uint32_t(n)));
  ids_.insert(ids_.end(), ids, ids + n);
}

BpeModel::BpeModel(const nlohmann::json& model, const std::string& source) {
  auto type = model.value("type", std::string("BPE"));
  MS_CHECK(type == "BPE", source, ": model type \"", type, "\" is not supported (only byte-level BPE)");
  MS_CHECK(!model.value("byte_fallback", false), source, ": BPE byte_fallback is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = model.find(key);
    MS_CHECK(it == model.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()), source,
             ": BPE ", key, " is not supported");
  }
  MS_CHECK(model.contains("vocab") && model["vocab"].is_object(), source, ": model.vocab is missing");
  MS_CHECK(model.contains("merges") && model["merges"].is_array(), source, ": model.merges is missing");
  ignore_merges_ = model.value("ignore_merges", false);
  load_vocab(model["vocab"], source);
  load_merges(model["merges"], source);
}

void BpeModel::load_vocab(const nlohmann::json& vocab, const std::string& source) {
  int64_t max_id = -1;
  for (const auto& [token, id] : vocab.items()) {
    MS_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < INT32_MAX, source,
             ": vocab entry \"", token, "\" has an invalid id");
    max_id = std::max(max_id, id.get<int64_t>());
  }
  tokens_.assign(size_t(max_id + 1), std::string());
  bytes_.assign(size_t(max_id + 1), std::string());
  present_.assign(size_t(max_id + 1), false);
  token_ids_.reserve(vocab.size());
  byte_ids_.reserve(vocab.size());
  for (const auto& [token, value] : vocab.items()) {
    auto id = value.get<int32_t>();
    tokens_[size_t(id)] = token;
    present_[size_t(id)] = true;
    token_ids_[token] = id;
    // A token with characters outside the byte map stands for its own UTF-8 (as HF's
    // ByteLevel decoder does), e.g. a special token stored in the vocabulary.
    auto raw = byte_level_decode(token);
    bytes_[size_t(id)] = raw ? *raw : token;
    if (raw) byte_ids_.emplace(*raw, id);
  }
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8::append(ch, byte_to_char(uint8_t(b)));
    auto it = token_ids_.find(ch);
    MS_CHECK(it != token_ids_.end(), source, ": the vocabulary has no token for byte 0x", std::hex, b,
             " (not a byte-level BPE vocabulary)");
    byte_token_[b] = it->second;
  }
}

void BpeModel::load_merges(const nlohmann::json& merges, const std::string& source) {
  size_t cap = 16;
  while (cap < merges.size() * 2) cap <<= 1;
  merge_keys_.assign(cap, kEmpty);
  merge_vals_.assign(cap, Merge{0, 0});
  merge_mask_ = cap - 1;
  int32_t rank = 0;
  for (const auto& m : merges) {
    if (m.is_string()) {  // tokenizers < 0.20: "left right"
      const auto& s = m.get_ref<const std::string&>();
      auto sp = s.find(' ');
      MS_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, source, ": merge ", rank,
               " \"", s, "\" is not two tokens separated by one space");
      add_merge(s.substr(0, sp), s.substr(sp + 1), rank, source);
    } else {  // tokenizers >= 0.20: ["left", "right"]
      MS_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), source, ": merge ", rank,
               " is neither \"a b\" nor [\"a\", \"b\"]");
      add_merge(m[0].get<std::string>(), m[1].get<std::string>(), rank, source);
    }
    ++rank;
  }
}

void BpeModel::add_merge(const std::string& a, const std::string& b, int32_t rank, const std::string& source) {
  auto ia = token_ids_.find(a), ib = token_ids_.find(b), iab = token_ids_.find(a + b);
  MS_CHECK(ia != token_ids_.end() && ib != token_ids_.end() && iab != token_ids_.end(), source, ": merge ", rank,
           " (\"", a, "\", \"", b, "\") uses a token that is not in the vocabulary");
  uint64_t key = pair_key(ia->second, ib->second);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    if (merge_keys_[slot] == key) return;  // a repeated merge keeps its first (lowest) rank
    if (merge_keys_[slot] == kEmpty) {
      merge_keys_[slot] = key;
      merge_vals_[slot] = Merge{rank, iab->second};
      return;
    }
  }
}

const BpeModel::Merge* BpeModel::find_merge(int32_t a, int32_t b) const {
  uint64_t key = pair_key(a, b);
  for (uint64_t slot = mix(key) & merge_mask_;; slot = (slot + 1) & merge_mask_) {
    if (merge_keys_[slot] == key) return &merge_vals_[slot];
    if (merge_keys_[slot] == kEmpty) return nullptr;
  }
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = token_ids_.find(token);
  if (it == token_ids_.end()) return std::nullopt;
  return it->second;
}

// Flat-array BPE for short words: rank[i] is the rank of the pair (ids[i], ids[i+1]).
size_t BpeModel::merge_small(int32_t* ids, size_t n) const {
  int32_t rank[kSmallWord], merged[kSmallWord];
  auto score = [&](size_t i) {
    const Merge* m = find_merge(ids[i], ids[i + 1]);
    rank[i] = m ? m->rank : INT32_MAX;
    merged[i] = m ? m->id : -1;
  };
  for (size_t i = 0; i + 1 < n; ++i) score(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT32_MAX) break;
    ids[best] = merged[best];
    std::copy(ids + best + 2, ids + n, ids + best + 1);
    std::copy(rank + best + 1, rank + n - 1, rank + best);
    std::copy(merged + best + 1, merged + n - 1, merged + best);
    --n;
    if (best > 0) score(best - 1);
    if (best + 1 < n) score(best);
  }
  return n;
}

// Heap-driven BPE for long words (linked list of symbols), the same merge order as merge_small.
void BpeModel::merge_large(std::vector<int32_t>& ids) const {
  struct Cand {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = int32_t(ids.size());
  std::vector<int32_t> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) prev[size_t(i)] = i - 1, next[size_t(i)] = i + 1 < n ? i + 1 : -1;
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t i) {
    int32_t j = next[size_t(i)];
    if (j < 0) return;
    if (const Merge* m = find_merge(ids[size_t(i)], ids[size_t(j)]))
      heap.push(Cand{m->rank, i, ids[size_t(i)], ids[size_t(j)], m->id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    Cand c = heap.top();
    heap.pop();
    int32_t j = next[size_t(c.pos)];
    // Stale entries (a side already merged into something else) no longer match their pair.
    if (ids[size_t(c.pos)] != c.left || j < 0 || ids[size_t(j)] != c.right) continue;
    ids[size_t(c.pos)] = c.merged;
    ids[size_t(j)] = -1;
    next[size_t(c.pos)] = next[size_t(j)];
    if (next[size_t(j)] >= 0) prev[size_t(next[size_t(j)])] = c.pos;
    if (prev[size_t(c.pos)] >= 0) push(prev[size_t(c.pos)]);
    push(c.pos);
  }
  std::erase(ids, -1);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out, BpeCache& cache) const {
  if (word.size() == 1) {
    out.push_back(byte_token_[uint8_t(word[0])]);
    return;
  }
  if (ignore_merges_) {
    auto it = byte_ids_.find(word);
    if (it != byte_ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  size_t cached_n = 0;
  if (const int32_t* cached = cache.find(word, cached_n)) {
    out.insert(out.end(), cached, cached + cached_n);
    return;
  }
  size_t start = out.size();
  if (word.size() <= kSmallWord) {
    int32_t ids[kSmallWord];
    for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_token_[uint8_t(word[i])];
    size_t n = merge_small(ids, word.size());
    out.insert(out.end(), ids, ids + n);
  } else {
    std::vector<int32_t> ids(word.size());
    for (size_t i = 0; i < word.size(); ++i) ids[i] = byte_token_[uint8_t(word[i])];
    merge_large(ids);
    out.insert(out.end(), ids.begin(), ids.end());
  }
  if (word.size() <= 256) cache.insert(word, out.data() + start, out.size() - start);
}

}  // namespace ms
