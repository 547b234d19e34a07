#include "server/json_fields.h"

#include <algorithm>
#include <cmath>

#include "server/api_error.h"

namespace ms::server {
namespace {

const char* type_name(const Json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

}  // namespace

bool has_field(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && !it->is_null();
}

void read_bool(const Json& j, const char* key, bool& out) {
  if (!has_field(j, key)) return;
  const Json& v = j[key];
  if (!v.is_boolean()) bad_request(key, "'", key, "' must be a boolean, got ", type_name(v));
  out = v.get<bool>();
}

void read_int(const Json& j, const char* key, int& out, int64_t lo, int64_t hi) {
  if (!has_field(j, key)) return;
  const Json& v = j[key];
  if (!v.is_number_integer()) bad_request(key, "'", key, "' must be an integer, got ", type_name(v));
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) bad_request(key, "'", key, "' must be in [", lo, ", ", hi, "], got ", v.dump());
  out = int(x);
}

void read_float(const Json& j, const char* key, float& out, double lo, double hi) {
  if (!has_field(j, key)) return;
  const Json& v = j[key];
  if (!v.is_number()) bad_request(key, "'", key, "' must be a number, got ", type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi) bad_request(key, "'", key, "' must be in [", lo, ", ", hi, "], got ", v.dump());
  out = float(x);
}

void read_string(const Json& j, const char* key, std::string& out) {
  if (!has_field(j, key)) return;
  const Json& v = j[key];
  if (!v.is_string()) bad_request(key, "'", key, "' must be a string, got ", type_name(v));
  out = v.get<std::string>();
}

void read_strings(const Json& j, const char* key, std::vector<std::string>& out, size_t max_items) {
  if (!has_field(j, key)) return;
  const Json& v = j[key];
  std::vector<std::string> items;
  if (v.is_string()) {
    items.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    for (const Json& s : v) {
      if (!s.is_string()) bad_request(key, "'", key, "' must be a string or a list of strings");
      items.push_back(s.get<std::string>());
    }
  } else {
    bad_request(key, "'", key, "' must be a string or a list of strings, got ", type_name(v));
  }
  if (items.size() > max_items) bad_request(key, "'", key, "' has ", items.size(), " items; at most ", max_items);
  for (const auto& s : items)
    if (s.empty()) bad_request(key, "'", key, "' must not contain an empty string");
  out = std::move(items);
}

std::vector<int32_t> to_token_ids(const Json& v, const std::string& param) {
  if (!v.is_array()) bad_request(param, "'", param, "' must be a list of token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (const Json& t : v) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
      bad_request(param, "'", param, "' must hold non-negative integer token ids, got ", t.dump());
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

void read_token_ids(const Json& j, const char* key, std::vector<int32_t>& out) {
  if (has_field(j, key)) out = to_token_ids(j[key], key);
}

void reject_unknown_fields(const Json& j, std::initializer_list<std::string_view> known, const std::string& what) {
  for (auto it = j.begin(); it != j.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end())
      bad_request(it.key(), "Unrecognized ", what, " argument: '", it.key(), "'");
}

void read_common_sampling(const Json& j, SamplingParams& p) {
  read_float(j, "temperature", p.temperature, 0.0, 100.0);
  read_float(j, "top_p", p.top_p, 0.0, 1.0);
  if (has_field(j, "top_p") && p.top_p <= 0.0f) bad_request("top_p", "'top_p' must be in (0, 1]");
  read_int(j, "top_k", p.top_k, -1, INT32_MAX);
  if (p.top_k == 0) p.top_k = -1;  // 0 and -1 both mean "no top-k"
  read_float(j, "min_p", p.min_p, 0.0, 1.0);
  read_float(j, "presence_penalty", p.presence_penalty, -2.0, 2.0);
  read_float(j, "frequency_penalty", p.frequency_penalty, -2.0, 2.0);
  read_float(j, "repetition_penalty", p.repetition_penalty, 1e-6, 10.0);
  if (has_field(j, "seed")) {
    const Json& v = j["seed"];
    if (!v.is_number_integer()) bad_request("seed", "'seed' must be an integer, got ", type_name(v));
    p.seed = v.is_number_unsigned() ? v.get<uint64_t>() : uint64_t(v.get<int64_t>());
  }
  read_strings(j, "stop", p.stop, 16);
  read_token_ids(j, "stop_token_ids", p.stop_token_ids);
  read_bool(j, "ignore_eos", p.ignore_eos);
}

}  // namespace ms::server
