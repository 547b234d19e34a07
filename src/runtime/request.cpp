#include "runtime/request.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace ms {

void SamplingParams::validate(int vocab_size) const {
  MS_CHECK(max_new_tokens >= 0, "max_new_tokens must be >= 0, got ", max_new_tokens);
  MS_CHECK(std::isfinite(temperature) && temperature >= 0.0f, "temperature must be >= 0, got ", temperature);
  MS_CHECK(top_p > 0.0f && top_p <= 1.0f, "top_p must be in (0, 1], got ", top_p);
  MS_CHECK(min_p >= 0.0f && min_p <= 1.0f, "min_p must be in [0, 1], got ", min_p);
  MS_CHECK(repetition_penalty > 0.0f && std::isfinite(repetition_penalty), "repetition_penalty must be > 0, got ",
           repetition_penalty);
  MS_CHECK(std::isfinite(frequency_penalty) && std::isfinite(presence_penalty), "penalties must be finite");
  MS_CHECK(top_logprobs_num >= 0 && top_logprobs_num <= vocab_size, "top_logprobs_num must be in [0, ", vocab_size,
           "], got ", top_logprobs_num);
  for (int32_t t : stop_token_ids)
    MS_CHECK(t >= 0 && t < vocab_size, "stop_token_ids: ", t, " is out of range (vocab_size ", vocab_size, ")");
  for (const auto& s : stop) MS_CHECK(!s.empty(), "stop strings must not be empty");
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Length: return "length";
    case FinishReason::Stop: return "stop";
    case FinishReason::Abort: return "abort";
    case FinishReason::None: break;
  }
  return "none";
}

std::vector<int32_t> Request::fill_ids() const {
  MS_ASSERT(pending_ids.empty());  // the radix cache keys on real tokens only
  std::vector<int32_t> ids = input_ids;
  ids.insert(ids.end(), output_ids.begin(), output_ids.end());
  return ids;
}

// A stop string of B bytes lies within the last B tokens (every token decodes to at least one
// byte); one more token covers a string that starts mid-token.
static bool ends_with_stop_string(Request& r, const Detokenizer& detok) {
  size_t longest = 0;
  for (const auto& s : r.sampling.stop) longest = std::max(longest, s.size());
  const size_t n = std::min(r.output_ids.size(), longest + 1);
  std::span<const int32_t> tail(r.output_ids.data() + r.output_ids.size() - n, n);
  const std::string text = detok(tail);
  for (const auto& s : r.sampling.stop)
    if (text.find(s) != std::string::npos) {
      r.matched_stop = s;
      return true;
    }
  return false;
}

void check_finish(Request& r, std::span<const int> eos_token_ids, const Detokenizer& detok) {
  if (r.finished() || r.output_ids.empty()) return;
  const int32_t last = r.output_ids.back();
  const auto& stops = r.sampling.stop_token_ids;
  const bool eos = std::find(eos_token_ids.begin(), eos_token_ids.end(), last) != eos_token_ids.end();
  if (std::find(stops.begin(), stops.end(), last) != stops.end() || (eos && !r.sampling.ignore_eos)) {
    r.finish = FinishReason::Stop;
    r.matched_stop = std::to_string(last);
    return;
  }
  if (!r.sampling.stop.empty() && detok && ends_with_stop_string(r, detok)) {
    r.finish = FinishReason::Stop;
    return;
  }
  if (int(r.output_ids.size()) >= r.sampling.max_new_tokens) r.finish = FinishReason::Length;
}

}  // namespace ms
