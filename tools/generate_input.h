// JSON for `moeserve generate --input-file`: one request per line in, one result per line out.
// The runtime never sees JSON; this is the only place that maps it to GenerateRequest.
#pragma once
#include <functional>
#include <istream>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace ms::cli {

struct InputLine {
  GenerateRequest request;
  std::string where;  // "file:line", for errors
  bool text = false;  // given as "text" (the result then carries the generated text too)
};

// Text -> token ids; empty when the checkpoint has no tokenizer.
using TextEncoder = std::function<std::vector<int32_t>(const std::string&)>;

// Reads every non-blank line of `in` as {"input_ids": [...] or "text": "...",
// "max_new_tokens": N, "temperature": T, ...}; fields a line leaves out keep the values of
// `defaults`. Throws naming `source`, the line number and the field on anything malformed.
std::vector<InputLine> read_generate_requests(std::istream& in, const std::string& source,
                                              const SamplingParams& defaults, const TextEncoder& encode);

// {"output_ids": [...], "finish_reason": "length"|"stop"|"abort", "cached_tokens": K}, plus
// "output_logprobs" / "output_top_logprobs" when the request asked for them, and "text" when
// `text` is given (the decoded output of a request that came as text).
std::string result_json(const GenerateResult& result, const SamplingParams& params, const std::string* text);

}  // namespace ms::cli
