// JSON for `moeserve generate --input-file`: one request per line in, one result per line out.
// The runtime never sees JSON; this is the only place that maps it to GenerateRequest.
#pragma once
#include <istream>
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace ms::cli {

// Reads every non-blank line of `in` as {"input_ids": [...], "max_new_tokens": N,
// "temperature": T, ...}; fields a line leaves out keep the values of `defaults`. Throws
// naming `source`, the line number and the field on anything malformed or unknown.
// `where` receives "source:line" of each request.
std::vector<GenerateRequest> read_generate_requests(std::istream& in, const std::string& source,
                                                    const SamplingParams& defaults, std::vector<std::string>& where);

// {"output_ids": [...], "finish_reason": "length"|"stop"|"abort", "cached_tokens": K}, plus
// "output_logprobs" / "output_top_logprobs" when the request asked for them.
std::string result_json(const GenerateResult& result, const SamplingParams& params);

}  // namespace ms::cli
