// Trains a small byte-level BPE tokenizer (Hugging Face tokenizer.json, Qwen2's pre-tokenizer)
// on a text: the 256 byte tokens, then the most frequent adjacent pair merged, again and
// again, then the special tokens. Deterministic: ties go to the lowest pair of ids.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ms::cli {

// tokenizer.json for `corpus`: at most `max_merges` merges (pairs seen at least twice), then
// `special_tokens` as added tokens with the following ids.
nlohmann::ordered_json train_byte_level_bpe(const std::string& corpus, int max_merges,
                                            const std::vector<std::string>& special_tokens);

}  // namespace ms::cli
