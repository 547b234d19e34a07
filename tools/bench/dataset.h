// Benchmark prompts, as SGLang's bench_serving builds them: the "random" dataset (lengths drawn
// uniformly from [max(1, len * range_ratio), len]) and the ShareGPT conversations file.
// Lengths are counted in the model's tokens: random prompts are token ids; ShareGPT prompts are
// text measured with the model's tokenizer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace ms::bench {

struct BenchPrompt {
  std::vector<int32_t> ids;  // the prompt as token ids (random dataset)
  std::string text;          // or as text (ShareGPT); exactly one of the two is set
  int prompt_len = 0;        // in the model's tokens
  int output_len = 0;        // tokens to generate
  bool is_text() const { return ids.empty(); }
};

struct RandomDatasetOptions {
  int num_prompts = 1000;
  int input_len = 1024, output_len = 1024;
  double range_ratio = 0.0;
  uint64_t seed = 1;
  int32_t vocab_size = 0;  // ids are drawn from [0, vocab_size)
};

// Random lengths; each prompt is either random ids (no source texts) or, like SGLang's
// random dataset over ShareGPT, a source text's tokens repeated or cut to the length.
// Special tokens of `tokenizer` (when given) are never drawn.
std::vector<BenchPrompt> random_dataset(const RandomDatasetOptions& options, const Tokenizer* tokenizer,
                                        const std::vector<std::string>& source_texts = {});

// The first two turns of every conversation of a ShareGPT JSON file (a list of
// {"conversations": [{"from", "value"}, ...]}), shuffled with `seed`.
std::vector<std::pair<std::string, std::string>> read_sharegpt(const std::string& path, uint64_t seed);

// num_prompts ShareGPT prompts measured with `tokenizer`: output_len is the reply's length or
// `fixed_output_len` (> 0); pairs shorter than 2 tokens or longer than `context_len` (> 0)
// together are skipped.
std::vector<BenchPrompt> sharegpt_dataset(const std::vector<std::pair<std::string, std::string>>& pairs,
                                          int num_prompts, const Tokenizer& tokenizer, int fixed_output_len,
                                          int context_len);

}  // namespace ms::bench
