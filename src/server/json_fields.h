// Typed, range-checked reads of request fields. Every failure is a 400 naming the field, so a
// wrong type or value never reaches the engine. Absent or null fields leave the output as is.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/request.h"

namespace ms::server {

using Json = nlohmann::json;

bool has_field(const Json& j, const char* key);  // present and not null
void read_bool(const Json& j, const char* key, bool& out);
void read_int(const Json& j, const char* key, int& out, int64_t lo, int64_t hi);
void read_float(const Json& j, const char* key, float& out, double lo, double hi);
void read_string(const Json& j, const char* key, std::string& out);
// A string or a list of strings (OpenAI's `stop`), at most `max_items`.
void read_strings(const Json& j, const char* key, std::vector<std::string>& out, size_t max_items);
// A list of token ids (non-negative 32-bit integers); range against the vocabulary is the
// engine's check.
std::vector<int32_t> to_token_ids(const Json& v, const std::string& param);
void read_token_ids(const Json& j, const char* key, std::vector<int32_t>& out);

// 400 for a field outside `known` (the APIs that forbid unknown fields); `what` names the object.
void reject_unknown_fields(const Json& j, std::initializer_list<std::string_view> known, const std::string& what);

// The sampling fields OpenAI requests and SGLang's sampling_params share: temperature, top_p,
// top_k, min_p, the three penalties, seed, stop, stop_token_ids, ignore_eos.
void read_common_sampling(const Json& j, SamplingParams& p);

}  // namespace ms::server
