// GSM8K few-shot evaluation, scored as SGLang's benchmark/gsm8k scores it: the prompt is k
// solved examples ("Question: ...\nAnswer: ...") then the question; the prediction is the last
// integer in the generation (commas removed); a generation without one is invalid.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ms::bench {

struct Gsm8kItem {
  std::string question;
  std::string answer;  // the worked solution, ending in "#### <number>"
};

// Reads GSM8K's JSONL ({"question", "answer"} per line); throws naming the file and line.
std::vector<Gsm8kItem> read_gsm8k(const std::string& path);

// The last integer in `text` after commas are removed ("1,234" -> 1234); nullopt when none.
std::optional<int64_t> extract_answer(const std::string& text);

// "Question: <q>\nAnswer:" with " <answer>" appended when include_answer.
std::string gsm8k_example(const Gsm8kItem& item, bool include_answer);
// The first `num_shots` items, solved, each followed by a blank line.
std::string gsm8k_few_shot(const std::vector<Gsm8kItem>& items, int num_shots);

// Stop strings SGLang's GSM8K benchmark uses: the model starting another question ends it.
const std::vector<std::string>& gsm8k_stop();

struct Gsm8kScore {
  int questions = 0, correct = 0, invalid = 0;
  double accuracy() const { return questions ? double(correct) / questions : 0.0; }
  double invalid_rate() const { return questions ? double(invalid) / questions : 0.0; }
};

// Scores generations against the items' labels (the answers' last integers), item i against
// generation i.
Gsm8kScore score_gsm8k(const std::vector<Gsm8kItem>& items, const std::vector<std::string>& generations);

}  // namespace ms::bench
