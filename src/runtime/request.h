// A generation request as the runtime sees it: its prompt, its sampling parameters, the tokens
// produced so far and the KV state it holds (req_to_token row, radix-cache lock). Plain data:
// the scheduler moves requests between queues, the sampler reads the parameters, the engine
// reports progress; none of them needs a tensor to do it.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ms {

class RadixNode;

using RequestId = uint64_t;

// Decodes token ids to text. The runtime calls it only to match stop strings, so it does not
// depend on any particular tokenizer.
using Detokenizer = std::function<std::string(std::span<const int32_t>)>;

struct SamplingParams {
  int max_new_tokens = 16;
  float temperature = 1.0f;  // 0: greedy
  float top_p = 1.0f;        // nucleus: smallest set of tokens whose probability reaches top_p
  int top_k = -1;            // <= 0: all tokens
  float min_p = 0.0f;        // drop tokens below min_p * p(top token)
  float repetition_penalty = 1.0f;  // on prompt and output tokens (divides positive logits)
  float frequency_penalty = 0.0f;   // minus count * penalty, output tokens only
  float presence_penalty = 0.0f;    // minus penalty once per distinct output token
  std::optional<uint64_t> seed;     // same seed -> same tokens; unset: drawn from the engine's seed
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings; need a Detokenizer
  bool ignore_eos = false;
  bool return_logprob = false;  // logprob of each chosen token
  int top_logprobs_num = 0;     // and the n most likely tokens at each step

  bool greedy() const { return temperature <= 0.0f || top_k == 1; }
  // Greedy with nothing that needs the whole distribution (no penalty, no logprobs): the token
  // is the argmax of the raw logits, which the GPU can pick without copying them.
  bool argmax_only() const {
    return greedy() && repetition_penalty == 1.0f && frequency_penalty == 0.0f && presence_penalty == 0.0f &&
           !return_logprob && top_logprobs_num <= 0;
  }
  // Nothing that needs the host (no penalty, no logprobs): ops::sample_rows_into picks the
  // token on the logits' device, greedy or not, as the host sampler would.
  bool device_sampleable() const {
    return repetition_penalty == 1.0f && frequency_penalty == 0.0f && presence_penalty == 0.0f && !return_logprob &&
           top_logprobs_num <= 0;
  }
  // Throws naming the field when a value is outside its range.
  void validate(int vocab_size) const;
};

enum class FinishReason { None, Length, Stop, Abort };
const char* finish_reason_name(FinishReason r);  // "length", "stop", "abort"

struct TopLogprob {
  int32_t token;
  float logprob;
};

// One step's sampling outcome.
struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;
  std::vector<TopLogprob> top;
};

enum class RequestState { Waiting, Running, Finished };

struct Request {
  RequestId id = 0;
  uint64_t arrival = 0;  // submission order; "newest" for retraction, order for fcfs
  std::vector<int32_t> input_ids;
  SamplingParams sampling;
  uint64_t rng_seed = 0;

  std::vector<int32_t> output_ids;
  std::vector<SampleResult> output_logprobs;  // when sampling.return_logprob
  FinishReason finish = FinishReason::None;
  std::string matched_stop;  // the stop string or token that ended it
  RequestState state = RequestState::Waiting;

  // KV state. Positions [0, kv_len) of fill_ids() have their keys and values in the slots of
  // req_to_token row `row`; the first prefix_len of those belong to the radix cache (locked
  // through `last_node`), the rest to this request.
  int row = -1;
  int kv_len = 0;
  int prefix_len = 0;
  RadixNode* last_node = nullptr;
  int cached_tokens = 0;  // prompt tokens reused from the cache at the first admission
  bool admitted_once = false;
  int retractions = 0;
  int streamed = 0;  // output tokens already handed to the caller
  // Overlap scheduling: tokens sampled on the device whose ids the host has not read yet, oldest
  // first, each as the placeholder -(j + 1) for row j of the ids its step sampled. They follow
  // output_ids (a step may already compute on them) and become output tokens, or are dropped
  // when the request finished at an earlier one.
  std::vector<int32_t> pending_ids;

  // Tokens produced so far, those in flight included: the index of the next one.
  int produced() const { return int(output_ids.size() + pending_ids.size()); }
  int fill_len() const { return int(input_ids.size()) + produced(); }
  std::vector<int32_t> fill_ids() const;  // prompt then output: what the KV must cover (nothing pending)
  int32_t fill_at(int i) const {
    const size_t in = input_ids.size(), out = output_ids.size();
    if (size_t(i) < in) return input_ids[size_t(i)];
    return size_t(i) < in + out ? output_ids[size_t(i) - in] : pending_ids[size_t(i) - in - out];
  }
  bool finished() const { return finish != FinishReason::None; }
};

// Sets r.finish after a token was appended: a stop token (or EOS unless ignored), a stop string
// in the text of the newest tokens (when `detok` is given), or max_new_tokens reached.
void check_finish(Request& r, std::span<const int> eos_token_ids, const Detokenizer& detok);

}  // namespace ms
