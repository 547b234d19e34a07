#include "generate_input.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/check.h"

namespace ms::cli {
namespace {

using nlohmann::json;

template <class T>
void read_field(const json& j, const char* key, T& out, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return;
  try {
    out = it->get<T>();
  } catch (const json::exception& e) {
    fail(where, ": field \"", key, "\": ", e.what());
  }
}

// Fields of one line beyond input_ids, each mapped onto SamplingParams.
void read_sampling(const json& j, SamplingParams& p, const std::string& where) {
  static const char* kKnown[] = {"input_ids",         "text",
                                 "max_new_tokens",    "temperature",
                                 "top_p",             "top_k",
                                 "min_p",             "repetition_penalty",
                                 "frequency_penalty", "presence_penalty",
                                 "seed",              "stop_token_ids",
                                 "stop",              "ignore_eos",
                                 "return_logprob",    "top_logprobs_num"};
  for (auto it = j.begin(); it != j.end(); ++it)
    MS_CHECK(std::find(std::begin(kKnown), std::end(kKnown), it.key()) != std::end(kKnown), where,
             ": unknown field \"", it.key(), "\"");
  read_field(j, "max_new_tokens", p.max_new_tokens, where);
  read_field(j, "temperature", p.temperature, where);
  read_field(j, "top_p", p.top_p, where);
  read_field(j, "top_k", p.top_k, where);
  read_field(j, "min_p", p.min_p, where);
  read_field(j, "repetition_penalty", p.repetition_penalty, where);
  read_field(j, "frequency_penalty", p.frequency_penalty, where);
  read_field(j, "presence_penalty", p.presence_penalty, where);
  if (j.contains("seed") && !j["seed"].is_null()) {
    uint64_t seed = 0;
    read_field(j, "seed", seed, where);
    p.seed = seed;
  }
  read_field(j, "stop_token_ids", p.stop_token_ids, where);
  if (j.contains("stop") && j["stop"].is_string()) p.stop = {j["stop"].get<std::string>()};
  else read_field(j, "stop", p.stop, where);
  read_field(j, "ignore_eos", p.ignore_eos, where);
  read_field(j, "return_logprob", p.return_logprob, where);
  read_field(j, "top_logprobs_num", p.top_logprobs_num, where);
}

}  // namespace

std::vector<InputLine> read_generate_requests(std::istream& in, const std::string& source,
                                              const SamplingParams& defaults, const TextEncoder& encode) {
  std::vector<InputLine> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    InputLine item;
    item.where = fmt(source, ":", number);
    const std::string& where = item.where;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail(where, ": not JSON: ", e.what());
    }
    MS_CHECK(j.is_object(), where, ": expected a JSON object per line");
    MS_CHECK(j.contains("input_ids") != j.contains("text"), where, ": give exactly one of \"input_ids\" and \"text\"");
    GenerateRequest& g = item.request;
    g.sampling = defaults;
    if (j.contains("text")) {
      MS_CHECK(encode, where, ": \"text\" needs a tokenizer.json in --model-path; give input_ids");
      std::string text;
      read_field(j, "text", text, where);
      g.input_ids = encode(text);
      item.text = true;
    } else {
      read_field(j, "input_ids", g.input_ids, where);
    }
    MS_CHECK(!g.input_ids.empty(), where, ": the prompt is empty");
    read_sampling(j, g.sampling, where);
    out.push_back(std::move(item));
  }
  MS_CHECK(!out.empty(), source, ": no requests");
  return out;
}

std::string result_json(const GenerateResult& r, const SamplingParams& params, const std::string* text) {
  json j;
  if (text) j["text"] = *text;
  j["output_ids"] = r.output_ids;
  j["finish_reason"] = finish_reason_name(r.finish_reason);
  j["cached_tokens"] = r.cached_tokens;
  if (params.return_logprob || params.top_logprobs_num > 0) {
    json lp = json::array(), top = json::array();
    for (const SampleResult& s : r.logprobs) {
      lp.push_back(s.logprob);
      json step = json::array();
      for (const TopLogprob& t : s.top) step.push_back({t.token, t.logprob});
      top.push_back(std::move(step));
    }
    j["output_logprobs"] = std::move(lp);
    if (params.top_logprobs_num > 0) j["output_top_logprobs"] = std::move(top);
  }
  return j.dump();
}

}  // namespace ms::cli
