// OpenAI response bodies for a CompletionJob: the whole response, or its stream of chunks
// (text_completion / chat.completion.chunk), built from the engine's outputs as they arrive.
// Text is detokenized incrementally per choice and cut at stop strings.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "server/request_group.h"
#include "server/text_processor.h"

namespace ms::server {

class CompletionWriter {
 public:
  CompletionWriter(const CompletionJob& job, const TextProcessor& text, std::string model_name);
  ~CompletionWriter();

  // Applies one output to its choice and returns the stream chunks it yields (none while its
  // text is held back, e.g. part of a stop string).
  std::vector<nlohmann::json> apply(const ChoiceEvent& event);
  nlohmann::json usage() const;
  nlohmann::json usage_chunk() const;  // the last chunk of a stream with include_usage
  nlohmann::json response() const;     // the non-stream body, after every output was applied

 private:
  struct Choice;
  nlohmann::json chunk(nlohmann::json choice) const;
  nlohmann::json logprobs_json(const Choice& c, const std::vector<SampleResult>& lps, size_t first_offset) const;
  std::string stop_string_of(const StreamOutput& o, size_t index) const;

  const CompletionJob& job_;
  const TextProcessor& text_;
  std::string model_, id_;
  int64_t created_;
  std::vector<std::unique_ptr<Choice>> choices_;
};

std::string random_id(const std::string& prefix);  // "cmpl-" + 32 hex digits

}  // namespace ms::server
