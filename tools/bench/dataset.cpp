#include "dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "core/check.h"

namespace ms::bench {
namespace {

int draw_len(std::mt19937_64& rng, int len, double ratio, int floor) {
  const int lo = std::clamp(int(double(len) * ratio), floor, len);
  return std::uniform_int_distribution<int>(lo, len)(rng);
}

std::vector<int32_t> random_ids(std::mt19937_64& rng, int n, int32_t vocab, const Tokenizer* tokenizer) {
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) {
    do id = pick(rng);
    while (tokenizer && tokenizer->is_special(id));
  }
  return ids;
}

// A source text's tokens repeated (or cut) to exactly n tokens.
std::vector<int32_t> fit_ids(const std::vector<int32_t>& source, int n) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = source[i % source.size()];
  return ids;
}

}  // namespace

std::vector<BenchPrompt> random_dataset(const RandomDatasetOptions& o, const Tokenizer* tokenizer,
                                        const std::vector<std::string>& source_texts) {
  MS_CHECK(o.num_prompts > 0 && o.input_len > 0 && o.output_len > 0, "random dataset: --num-prompts, "
           "--random-input-len and --random-output-len must be positive");
  MS_CHECK(o.range_ratio >= 0 && o.range_ratio <= 1, "--random-range-ratio ", o.range_ratio, " is not in [0, 1]");
  MS_CHECK(o.vocab_size > 0 || !source_texts.empty(), "random dataset: no vocabulary size to draw ids from");
  std::mt19937_64 rng(o.seed);
  std::vector<BenchPrompt> prompts(static_cast<size_t>(o.num_prompts));
  for (BenchPrompt& p : prompts) {
    p.prompt_len = draw_len(rng, o.input_len, o.range_ratio, 1);
    // SGLang allows 0 here; a request for 0 new tokens is refused by OpenAI-style servers.
    p.output_len = draw_len(rng, o.output_len, o.range_ratio, 1);
  }
  if (source_texts.empty()) {
    for (BenchPrompt& p : prompts) p.ids = random_ids(rng, p.prompt_len, o.vocab_size, tokenizer);
    return prompts;
  }
  MS_CHECK(tokenizer, "random dataset over --dataset-path needs a tokenizer (--tokenizer DIR)");
  size_t next = 0;
  for (BenchPrompt& p : prompts) {
    std::vector<int32_t> source;
    for (size_t tries = 0; source.empty() && tries < source_texts.size(); ++tries)
      source = tokenizer->encode(source_texts[next++ % source_texts.size()]);
    MS_CHECK(!source.empty(), "random dataset: every text of --dataset-path is empty");
    p.ids = fit_ids(source, p.prompt_len);
  }
  return prompts;
}

std::vector<std::pair<std::string, std::string>> read_sharegpt(const std::string& path, uint64_t seed) {
  std::ifstream in(path);
  MS_CHECK(in, "--dataset-path: cannot open ", path);
  nlohmann::json data;
  try {
    data = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    fail("--dataset-path ", path, ": not JSON: ", e.what());
  }
  MS_CHECK(data.is_array(), "--dataset-path ", path, ": expected a JSON list of conversations");
  std::vector<std::pair<std::string, std::string>> pairs;
  for (const auto& item : data) {
    const char* key = item.contains("conversations") ? "conversations" : "conversation";
    if (!item.is_object() || !item.contains(key) || !item[key].is_array() || item[key].size() < 2) continue;
    const auto& turns = item[key];
    if (!turns[0].contains("value") || !turns[1].contains("value")) continue;
    pairs.emplace_back(turns[0]["value"].get<std::string>(), turns[1]["value"].get<std::string>());
  }
  std::shuffle(pairs.begin(), pairs.end(), std::mt19937_64(seed));
  return pairs;
}

std::vector<BenchPrompt> sharegpt_dataset(const std::vector<std::pair<std::string, std::string>>& pairs,
                                          int num_prompts, const Tokenizer& tokenizer, int fixed_output_len,
                                          int context_len) {
  std::vector<BenchPrompt> prompts;
  for (const auto& [prompt, reply] : pairs) {
    if (int(prompts.size()) == num_prompts) break;
    BenchPrompt p;
    p.text = prompt;
    p.prompt_len = int(tokenizer.encode(prompt).size());
    p.output_len = fixed_output_len > 0 ? fixed_output_len : int(tokenizer.encode(reply).size());
    if (p.prompt_len < 2 || p.output_len < 2) continue;
    if (context_len > 0 && p.prompt_len + p.output_len > context_len) continue;
    prompts.push_back(std::move(p));
  }
  MS_CHECK(int(prompts.size()) == num_prompts, "ShareGPT dataset: only ", prompts.size(), " usable conversations for ",
           "--num-prompts ", num_prompts);
  return prompts;
}

}  // namespace ms::bench
