// One streamed benchmark request against a serving endpoint, timed as SGLang's bench_serving
// times it: TTFT at the first event that carries generated tokens, one inter-token latency per
// token after it (an event with k new tokens contributes k equal gaps), E2E at the stream's end.
#pragma once
#include <chrono>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "dataset.h"
#include "http_client.h"

namespace ms::bench {

enum class Api {
  Native,       // POST /generate {"input_ids" | "text", "sampling_params", "stream"} (moeserve, SGLang)
  Completions,  // POST /v1/completions {"prompt", "max_tokens", "stream"} (vLLM, OpenAI, and the above)
};
Api api_for_backend(const std::string& backend);  // moeserve|sglang -> Native; vllm|openai -> Completions
const char* api_path(Api api);

struct RequestSpec {
  Api api = Api::Native;
  std::string model;        // the "model" field of OpenAI requests
  bool ignore_eos = true;  // generate exactly output_len tokens
  std::vector<std::string> stop;
  double temperature = 0.0;
};

struct RequestOutcome {
  bool success = false;
  std::string error;
  int prompt_len = 0;
  int output_len = 0;       // generated tokens, as the server counted them
  double start_s = 0;       // when it was sent, from the run's start
  double ttft_s = 0;        // time to the first generated token
  double latency_s = 0;     // end to end
  std::vector<double> itl_s;
  std::string generated_text;
  std::vector<int32_t> output_ids;  // when the server sends ids (native API)
};

// The JSON body of one streamed request.
std::string request_body(const RequestSpec& spec, const BenchPrompt& prompt, bool stream);

// Folds a request's stream events into its outcome; `feed` takes one SSE data payload and the
// time since the request was sent.
class StreamAccumulator {
 public:
  explicit StreamAccumulator(Api api) : api_(api) {}
  bool feed(std::string_view data, double t);  // false on an error event
  void finish(RequestOutcome& out, double t) const;
  const std::string& error() const { return error_; }

 private:
  void tokens(int total, double t);
  void native_event(const nlohmann::json& event, double t);
  void completions_event(const nlohmann::json& event, double t);
  Api api_;
  int count_ = 0;         // generated tokens so far
  bool first_ = false;    // first token seen
  double last_t_ = 0;
  double ttft_ = 0;
  std::vector<double> itl_;
  std::string text_;
  std::vector<int32_t> ids_;
  std::string error_;
  bool usage_seen_ = false;
  int usage_tokens_ = 0;
};

// Sends one request and streams it to its end; never throws (failures are in the outcome).
RequestOutcome send_streaming(const HttpTarget& target, const RequestSpec& spec, const BenchPrompt& prompt);

}  // namespace ms::bench
