// OpenAI's /v1/completions and /v1/chat/completions requests, checked and turned into what the
// engine runs: token-id prompts and SamplingParams. Field names, defaults and ranges follow
// the OpenAI API, plus SGLang's extensions (top_k, min_p, repetition_penalty, stop_token_ids,
// ignore_eos, skip_special_tokens, chat_template_kwargs). Unknown fields are refused, as
// OpenAI refuses them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "server/text_processor.h"

namespace ms::server {

struct ProtocolLimits {
  int max_n = 128;           // choices per prompt
  int max_choices = 1024;    // prompts x n per call
  int max_sequence_len = 0;  // prompt + generated tokens: min(context length, KV pool)
};

struct CompletionJob {
  bool chat = false;
  std::string model;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_texts;  // for echo (completions)
  SamplingParams sampling;
  int n = 1;
  bool stream = false, include_usage = false, continuous_usage_stats = false;
  bool echo = false;
  int logprobs = -1;  // -1: none; otherwise how many top alternatives per token (0: the chosen only)
  bool skip_special_tokens = true;
};

// `text` is null for a model without a tokenizer: text prompts are then refused.
CompletionJob parse_completion_request(const nlohmann::json& body, const TextProcessor* text, const ProtocolLimits& lim);
// `ordered` is the same body with its key order kept: messages and tools reach the chat
// template as the client wrote them.
CompletionJob parse_chat_request(const nlohmann::json& body, const nlohmann::ordered_json& ordered,
                                 const TextProcessor* text, const ProtocolLimits& lim);

// The engine requests: choice c of prompt p is entry p * n + c (OpenAI's choice index). With a
// seed, choice c samples with seed + c so that the n choices differ but repeat across calls.
std::vector<GenerateRequest> expand_choices(const CompletionJob& job);

}  // namespace ms::server
